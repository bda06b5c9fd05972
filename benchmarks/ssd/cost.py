"""SSD300's cost for `mlperf-harness plan`: multiply-adds of the ResNet-34 backbone (conv4_x at stride 1,
as the reference), the extra layers and the box/class heads, counted from the config. Training = 3 x
forward. Eval: the forward pass over the eval images; COCOeval on the host is EVAL_HOST_SECONDS.
"""
from __future__ import annotations

from harness import benchmark_rules as rules
from harness.plan.cost import CostModel, ModelCost, conv_macs

CONVERGE_UNIT = "epochs"
# Where the eval runs: the forward pass and box decoding on the devices (split over the chips); COCO mAP
# (pycocotools COCOeval) on one host, 3 ms per eval image (15 s for 5,000: an assumption of the order the
# harness's own SSD eval shows); a fixed 10 ms per eval. --calibrate gives the device part from the logs.
EVAL_HOST_SECONDS_PER_SAMPLE = 3e-3
EVAL_FIXED_SECONDS = 0.01
# SGD with momentum in float32: read weight, gradient, momentum (12 B), write weight and momentum (8 B)
OPTIMIZER_BYTES_PER_PARAM = 20.0


def forward_macs_and_params(cfg) -> tuple[int, int]:
    from benchmarks.ssd.anchors import anchors_per_location
    from benchmarks.ssd.model import STAGE_WIDTHS, STRIDED, backbone_blocks, extra_kinds

    m = cfg.model
    macs, size = conv_macs(m.image_size, 7, 3, m.width, 2)
    params = 49 * 3 * m.width + 2 * m.width
    size = -(-size // 2)
    for b in backbone_blocks(m):
        x, out = conv_macs(size, 3, b.in_ch, b.out_ch, b.stride)
        y, _ = conv_macs(out, 3, b.out_ch, b.out_ch)
        macs += x + y
        params += 9 * b.in_ch * b.out_ch + 9 * b.out_ch * b.out_ch + 4 * b.out_ch
        if b.projection:
            p, _ = conv_macs(size, 1, b.in_ch, b.out_ch, b.stride)
            macs, params = macs + p, params + b.in_ch * b.out_ch + 2 * b.out_ch
        size = out
    channels, sizes = [m.width * STAGE_WIDTHS[-1]], [size]
    for kind, (mid, out_ch) in zip(extra_kinds(m.feature_sizes), m.extra_channels):
        a, _ = conv_macs(sizes[-1], 1, channels[-1], mid)
        if kind == STRIDED:
            b, nxt = conv_macs(sizes[-1], 3, mid, out_ch, 2)
        else:
            b, nxt = conv_macs(sizes[-1], 3, mid, out_ch, 1, pad=False)
        macs += a + b
        params += channels[-1] * mid + mid + 9 * mid * out_ch + out_ch
        channels.append(out_ch)
        sizes.append(nxt)
    for ch, n, a in zip(channels, sizes, anchors_per_location(m.aspect_ratios)):
        outs = a * (4 + m.num_classes)
        h, _ = conv_macs(n, 3, ch, outs)
        macs += h
        params += 9 * ch * outs + outs
    return macs, params


def model_cost(cfg) -> ModelCost:
    macs, params = forward_macs_and_params(cfg)
    return ModelCost(
        workload="ssd", source="counted (benchmarks/ssd/cost.py: backbone, extra layers, heads)",
        train_flops_per_sample=3 * 2.0 * macs, eval_flops_per_sample=2.0 * macs, params=params,
        gradient_bytes=4.0 * params, optimizer_bytes_per_param=OPTIMIZER_BYTES_PER_PARAM,
        train_samples=cfg.data.train_samples, eval_samples=cfg.data.eval_samples, sample_unit="image",
        eval_host_seconds_per_sample=EVAL_HOST_SECONDS_PER_SAMPLE, eval_fixed_seconds=EVAL_FIXED_SECONDS,
        notes="spatial partitioning's halo exchanges are not modelled")


def eval_positions(cfg, upto: float, global_batch: int) -> list[float]:
    """The run's eval epochs through the first at or past `upto`: closed, the rules' (1.0.0: 40, 50, 55, ...;
    the workload's `rules_epochs`), open the config's own (the default `eval_schedule`)."""
    if cfg.submission.division == "closed":
        return rules.cadence("ssd", cfg.ruleset, global_batch).through(upto)
    return rules.epoch_positions(cfg.schedule, upto)


COST = CostModel(model_cost, eval_positions, CONVERGE_UNIT)
