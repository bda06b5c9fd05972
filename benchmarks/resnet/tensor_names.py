"""MLPerf tensor names (as the checker's rulesets list them for `weights_initialization`) -> variable paths.

The names are the MXNet reference ResNet-50 v1.5's: `conv0`/`bn0` the stem, `stageS_unitU_convK` /
`bnK` the K-th conv and batch norm of a bottleneck (1x1, 3x3, 1x1), `conv1sc`/`bnsc` its projection
shortcut, `fc1` the classifier. Built from the config alone (the model need not exist yet), following
the same structure as `model.ResNet`, so a model with fewer blocks simply lacks the deeper names.
"""
from __future__ import annotations

from harness.config import Config


def weights_initialization_map(cfg: Config) -> dict[str, str]:
    m = cfg.model
    out = {"conv0_weight": "resnet/stem/conv/kernel",
           "bn0_gamma": "resnet/stem/bn/gamma", "bn0_beta": "resnet/stem/bn/beta",
           "fc1_weight": "resnet/fc/kernel", "fc1_bias": "resnet/fc/bias"}
    in_ch = m.width
    for stage, count in enumerate(m.blocks, start=1):
        filters = m.width * 2 ** (stage - 1)
        for unit in range(1, count + 1):
            name, path = f"stage{stage}_unit{unit}", f"resnet/stage{stage}/block{unit}"
            for k, part in enumerate(("a", "b", "c"), start=1):
                out[f"{name}_conv{k}_weight"] = f"{path}/{part}/conv/kernel"
                out[f"{name}_bn{k}_gamma"] = f"{path}/{part}/bn/gamma"
                out[f"{name}_bn{k}_beta"] = f"{path}/{part}/bn/beta"
            stride = 2 if (unit == 1 and stage > 1) else 1
            if stride != 1 or in_ch != 4 * filters:  # the block has a projection shortcut
                out[f"{name}_conv1sc_weight"] = f"{path}/proj/conv/kernel"
                out[f"{name}_bnsc_gamma"] = f"{path}/proj/bn/gamma"
                out[f"{name}_bnsc_beta"] = f"{path}/proj/bn/beta"
            in_ch = 4 * filters
    return out
