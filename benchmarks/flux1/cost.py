"""flux1's cost for `mlperf-harness plan`, the dry run's useful FLOPs and the run's MFU: multiply-adds per sample
(256 text + 256 image tokens at the reference's size) counted from the config.

Per token and block: a double block's two streams each q/k/v 3h^2, attention output h^2 and MLP 2hf over their
own tokens; a single block's linear1 h(3h + f) and linear2 (h + f)h over all tokens; every block's attention
scores and context 2 L^2 h (L = all tokens, bidirectional). Per sample: the modulations (6h^2 per stream, 3h^2
per single block, 2h^2 final), the embedders and the final linear. Training = 3 x forward; eval: the forward pass.
The reference's size: 11,891,178,560 parameters, 6.81 TFLOP forward and 20.4 TFLOP per training sample
(NVIDIA's v5.1 code declares MODEL_TFLOP_PER_SAMPLE=20.3).
"""
from __future__ import annotations

import math

from harness import benchmark_rules as rules
from harness.plan.cost import CostModel, ModelCost

TIME_DIM = 256  # the timestep embedding width (benchmarks/flux1/model.py; no TensorFlow import here)

CONVERGE_UNIT = "samples"  # the RCP tables count samples
# The eval's per-sample losses are gathered to the host and summed there (microseconds per sample); a fixed
# 10 ms per eval for the loop (assumption; --calibrate gives the device part from the logs' eval time).
EVAL_HOST_SECONDS_PER_SAMPLE = 0.0
EVAL_FIXED_SECONDS = 0.01
OPTIMIZER_BYTES_PER_PARAM = 28.0  # AdamW in float32: read weight, gradient, m, v; write weight, m, v
ACTIVATION_BYTES = 2.0            # bfloat16 activations
FSDP_WEIGHT_BYTES = 4.0           # FSDP gathers the float32 variable (benchmarks/lm/cost.py says why)


def tokens(cfg) -> tuple[int, int]:
    """(text tokens, image tokens) per sample."""
    d = cfg.data
    return d.text_tokens, (d.latent_size // 2) ** 2


def forward_macs_and_params(cfg) -> tuple[float, int]:
    """Multiply-adds of one sample's forward pass and the parameter count."""
    m = cfg.model
    h, f, heads_dim = m.hidden_size, m.mlp_hidden, m.head_dim
    n_txt, n_img = tokens(cfg)
    seq = n_txt + n_img
    stream_tok = 4 * h * h + 2 * h * f                        # q/k/v, output, MLP per token
    stream_params = (6 * h * h + 6 * h) + (3 * h * h + 3 * h) + 2 * heads_dim + (h * h + h) + (2 * h * f + f + h)
    single_tok = h * (3 * h + f) + (h + f) * h
    single_params = (3 * h * h + 3 * h) + (h * (3 * h + f) + 3 * h + f) + 2 * heads_dim + ((h + f) * h + h)
    attention = 2 * seq * seq * h
    macs = m.depth * (stream_tok * seq + 2 * 6 * h * h + attention)
    macs += m.depth_single_blocks * (single_tok * seq + 3 * h * h + attention)
    embed_params = ((m.in_channels + 1) * h + (m.context_in_dim + 1) * h + (TIME_DIM + 1) * h + (h + 1) * h
                    + (m.vec_in_dim + 1) * h + (h + 1) * h)
    macs += m.in_channels * h * n_img + m.context_in_dim * h * n_txt + (TIME_DIM + m.vec_in_dim + 2 * h) * h
    final_params = (2 * h * h + 2 * h) + (h * m.in_channels + m.in_channels)
    macs += 2 * h * h + h * m.in_channels * n_img
    params = embed_params + m.depth * 2 * stream_params + m.depth_single_blocks * single_params + final_params
    return float(macs), int(params)


def model_cost(cfg) -> ModelCost:
    macs, params = forward_macs_and_params(cfg)
    n_txt, n_img = tokens(cfg)
    m = cfg.model
    blocks = m.depth + m.depth_single_blocks
    return ModelCost(
        workload="flux1", source="counted (benchmarks/flux1/cost.py: block projections, attention, embedders)",
        train_flops_per_sample=3 * 2.0 * macs, eval_flops_per_sample=2.0 * macs, params=params,
        gradient_bytes=4.0 * params, optimizer_bytes_per_param=OPTIMIZER_BYTES_PER_PARAM,
        train_samples=cfg.data.train_samples or 1_099_776, eval_samples=cfg.data.eval_samples,
        sample_unit=f"image of {n_img} latent tokens with {n_txt} text tokens",
        # heads / MLP units split over the model axis: 2 activation all-reduces per block forward, 2 backward
        mp_bytes_per_sample=4 * blocks * (n_txt + n_img) * m.hidden_size * ACTIVATION_BYTES,
        fsdp_gather_bytes=FSDP_WEIGHT_BYTES * params if cfg.runtime.fsdp else 0.0,
        eval_host_seconds_per_sample=EVAL_HOST_SECONDS_PER_SAMPLE, eval_fixed_seconds=EVAL_FIXED_SECONDS,
        notes="with model.remat the hardware also recomputes each block's forward pass (4 x forward, not counted)")


def eval_positions(cfg, upto: float, global_batch: int) -> list[float]:
    """Eval points in samples (every `data.eval_every_samples`, else the rules' cadence) through the first at or
    past `upto`."""
    every = cfg.data.eval_every_samples or rules.flux_eval_every(global_batch)
    n = max(1, int(math.ceil(upto / every - 1e-9)))
    return [every * (i + 1) for i in range(n)]


def kept_activation_bytes(cfg, rows: int) -> int:
    """A lower bound of what a train step keeps for its backward pass on a device holding `rows` samples: each
    block's input stream (all that model.remat keeps), in the compute dtype."""
    n_txt, n_img = tokens(cfg)
    m = cfg.model
    width = 2 if cfg.runtime.precision in ("bfloat16", "float16") else 4
    return int((m.depth + m.depth_single_blocks) * rows * (n_txt + n_img) * m.hidden_size * width)


COST = CostModel(model_cost, eval_positions, CONVERGE_UNIT, kept_activation_bytes=kept_activation_bytes)
