"""MLPerf 1.1.0 closed_ssd tensor names (the MXNet reference's, as the checker lists them) -> variable paths.

MXNet numbers convs and batch norms per stage in creation order: a block's two convs, then its downsample
(projection) conv, so stage 2's first block is conv0, conv1 and conv2 (downsample) and its second block starts
at conv3. `expand_trans_conv{i}` is extra layer i's 1x1 conv, `expand_conv{i}` its 3x3 conv, and
`convpredictor{k}_conv0` the fused loc+conf head of map k. Built from the config alone.

Only the reference structure has these names: a stage whose block count differs from ResNet-34's, or a layout
other than 5 extras / 6 maps, gets no names for that part, so `weights_init.plan` refuses the run with its
clear line instead of logging reference names for a different network (extra blocks would otherwise still
fill all 119 names).
"""
from __future__ import annotations

from harness.config import Config

from benchmarks.ssd.config import ModelConfig
from benchmarks.ssd.model import BACKBONE, backbone_blocks, extra_path, head_path

REFERENCE_BLOCKS = (3, 4, 6)
REFERENCE_EXTRAS = 5
PREFIX = "ssd0_resnetmlperf0"


def _conv_bn(out: dict[str, str], name: str, bn: str, path: str) -> None:
    out[f"{name}_weight"] = f"{path}/conv/kernel"
    out[f"{bn}_gamma"] = f"{path}/bn/gamma"
    out[f"{bn}_beta"] = f"{path}/bn/beta"


def weights_initialization_map(cfg: Config | ModelConfig) -> dict[str, str]:
    """Tensor name -> variable path; accepts the full config (as other workloads) or its model section."""
    m: ModelConfig = getattr(cfg, "model", cfg)
    out: dict[str, str] = {}
    _conv_bn(out, f"{PREFIX}_conv0", f"{PREFIX}_batchnorm0", f"{BACKBONE}/stem")
    same_stages = {s + 1 for s, (n, ref) in enumerate(zip(m.blocks, REFERENCE_BLOCKS)) if n == ref}
    counters: dict[int, int] = {}
    for spec in backbone_blocks(m):
        if spec.stage not in same_stages:
            continue
        parts = ["conv1", "conv2"] + (["proj"] if spec.projection else [])
        for part in parts:
            i = counters.get(spec.stage, 0)
            counters[spec.stage] = i + 1
            stage = f"{PREFIX}_stage{spec.stage}"
            _conv_bn(out, f"{stage}_conv{i}", f"{stage}_batchnorm{i}", f"{spec.path}/{part}")
    if len(m.extra_channels) == REFERENCE_EXTRAS and len(m.feature_sizes) == REFERENCE_EXTRAS + 1:
        for i in range(REFERENCE_EXTRAS):
            p = extra_path(i + 1)
            for kind, conv in (("expand_trans_conv", "conv1x1"), ("expand_conv", "conv3x3")):
                out[f"ssd0_{kind}{i}_weight"] = f"{p}/{conv}/kernel"
                out[f"ssd0_{kind}{i}_bias"] = f"{p}/{conv}/bias"
        for k in range(REFERENCE_EXTRAS + 1):
            out[f"ssd0_convpredictor{k}_conv0_weight"] = f"{head_path(k)}/kernel"
            out[f"ssd0_convpredictor{k}_conv0_bias"] = f"{head_path(k)}/bias"
    return out
