"""ResNet-50 v1.5's cost for `mlperf-harness plan`: multiply-adds counted layer by layer from the config.

At 224x224 this counts 4.09 G multiply-adds per forward image (the figure usually quoted for ResNet-50
v1.5) and 25.56 M parameters; training = 3 x forward. Eval: the forward pass over 50,000 images.
"""
from __future__ import annotations

from harness import benchmark_rules as rules
from harness.plan.cost import CostModel, ModelCost, conv_macs

CONVERGE_UNIT = "epochs"
# Where the eval runs: top-1 is counted on the devices (the forward pass and its input pipeline split over
# the chips); nothing is scored per sample on the host; a fixed 10 ms per eval gathers two counters and
# runs the loop (an assumption; --calibrate gives the device part from the logs' eval time)
EVAL_HOST_SECONDS_PER_SAMPLE = 0.0
EVAL_FIXED_SECONDS = 0.01
# LARS with momentum in float32: read weight, gradient, momentum (12 B), write weight, momentum (8 B), read
# weight and gradient again for the layer norms (8 B)
OPTIMIZER_BYTES_PER_PARAM = 28.0


def forward_macs_and_params(cfg) -> tuple[int, int]:
    m = cfg.model
    size = cfg.data.image_size
    macs, params = 0, 0
    stem_k, stem_s = (7, 2) if m.stem == "imagenet" else (3, 1)
    a, size = conv_macs(size, stem_k, 3, m.width, stem_s)
    macs, params = macs + a, params + stem_k * stem_k * 3 * m.width + 2 * m.width
    if m.stem == "imagenet":
        size = -(-size // 2)  # max pool
    in_ch = m.width
    for stage, count in enumerate(m.blocks):
        filters = m.width * 2 ** stage
        for i in range(count):
            stride = 2 if (i == 0 and stage > 0) else 1
            x, _ = conv_macs(size, 1, in_ch, filters)
            y, out = conv_macs(size, 3, filters, filters, stride)
            z, _ = conv_macs(out, 1, filters, 4 * filters)
            macs += x + y + z
            params += in_ch * filters + 9 * filters * filters + filters * 4 * filters + 2 * (6 * filters)
            if stride != 1 or in_ch != 4 * filters:
                p, _ = conv_macs(size, 1, in_ch, 4 * filters, stride)
                macs, params = macs + p, params + in_ch * 4 * filters + 8 * filters
            size, in_ch = out, 4 * filters
    classes = cfg.data.num_classes
    macs += in_ch * classes
    params += in_ch * classes + classes
    return macs, params


def model_cost(cfg) -> ModelCost:
    macs, params = forward_macs_and_params(cfg)
    return ModelCost(
        workload="resnet", source="counted (benchmarks/resnet/cost.py: convolutions and the classifier)",
        train_flops_per_sample=3 * 2.0 * macs, eval_flops_per_sample=2.0 * macs, params=params,
        gradient_bytes=4.0 * params, optimizer_bytes_per_param=OPTIMIZER_BYTES_PER_PARAM,
        train_samples=cfg.data.train_samples, eval_samples=cfg.data.eval_samples, sample_unit="image",
        eval_host_seconds_per_sample=EVAL_HOST_SECONDS_PER_SAMPLE, eval_fixed_seconds=EVAL_FIXED_SECONDS,
        notes="spatial partitioning's halo exchanges are not modelled")


def eval_positions(cfg, upto: float, global_batch: int) -> list[float]:
    """The config's eval epochs (schedule.eval_epochs, else every eval_every_epochs from eval_offset_epochs: the
    run's default `eval_schedule`) through the first at or past `upto`: a run stops only at an eval."""
    return rules.epoch_positions(cfg.schedule, upto)


COST = CostModel(model_cost, eval_positions, CONVERGE_UNIT)
