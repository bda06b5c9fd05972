"""What the decoder LMs (llama31_8b, gpt_oss_20b) share in their `mlperf-harness plan` cost: everything but
their blocks' counts. Each workload's cost.py counts its attention and feed-forward, `decoder_macs_and_params`
the rest, calls `decoder_model_cost` and declares its `COST`, whose eval positions are its rules record's
cadence (`rules_eval_positions`: the run's own, benchmarks/lm/rules.py).

Bytes, stated once: gradients are all-reduced (reduce-scattered under FSDP) in float32, the variables' dtype;
tensor parallelism all-reduces bfloat16 activations; FSDP all-gathers the float32 variables (the mesh runtime
reads the variable before the model casts it, docs/accelerators.md), and FSDP gathers the weights twice a
step, for the forward pass and again for the backward pass, then reduce-scatters the gradients
(harness/plan/project.py models the three). The harness's own DTensor FSDP keeps the forward's gathered
weights for the backward (one gather a step, at the memory cost of whole weights): a plan of it overstates its
traffic by one gather; set `fsdp_gathers_per_step: 1` in a --model_cost file to model that.
"""
from __future__ import annotations

from typing import Any, Callable

from harness.plan.cost import ModelCost

from benchmarks.lm.rules import DecoderRules

CONVERGE_UNIT = "samples"  # the RCP tables count rows (samples) to converge
# Where the eval runs (harness/plan/project.py): the eval loss is summed on the devices (the forward pass split
# over the chips); nothing is scored per sample on the host; a fixed 10 ms per eval gathers the sums
# (assumption; --calibrate gives the device part from the logs' eval time)
EVAL_HOST_SECONDS_PER_SAMPLE = 0.0
EVAL_FIXED_SECONDS = 0.01
# AdamW in float32: read weight, gradient, m, v (16 B), write weight, m, v (12 B)
OPTIMIZER_BYTES_PER_PARAM = 28.0
GRADIENT_BYTES = 4.0     # per parameter: float32 gradients
ACTIVATION_BYTES = 2.0   # per activation element: bfloat16
FSDP_WEIGHT_BYTES = 4.0  # per parameter: the float32 variable is what FSDP gathers
FSDP_GATHERS_PER_STEP = 2  # forward, then backward (the forward's copy is freed: what makes FSDP save memory)


def decoder_macs_and_params(cfg, attention_keys: float, ffn_macs: float, ffn_params: int) -> tuple[float, int]:
    """Multiply-adds per row of `data.seq_length` tokens and the parameter count of the decoder stack
    (benchmarks/lm/decoder.py) from its blocks' counts. Per token and layer: the q/k/v/o projections
    h*hd*(2*heads + 2*kv_heads) and the feed-forward's `ffn_macs`; attention's scores and context
    2*heads*hd per key a token's query sees, `attention_keys` summed over the layers; the LM head h*V (the
    embedding lookup is free). Parameters: embedding and LM head, per layer the projections, `ffn_params`
    and two norms, the final norm."""
    m, s = cfg.model, cfg.data.seq_length
    h, vocab = m.hidden_size, m.vocab_size
    projections = h * m.head_dim * (2 * m.num_heads + 2 * m.num_kv_heads)
    per_token = m.num_layers * (projections + ffn_macs) + 2 * m.num_heads * m.head_dim * attention_keys + h * vocab
    params = 2 * vocab * h + m.num_layers * (projections + ffn_params + 2 * h) + h
    return float(per_token * s), int(params)


def decoder_model_cost(cfg, workload: str, macs_per_row: float, params: int, source: str,
                       notes: str = "") -> ModelCost:
    """The ModelCost of a decoder LM from its forward multiply-adds per row of `data.seq_length` tokens and its
    parameter count. Training = 3 x forward; eval: the forward pass."""
    m, s = cfg.model, cfg.data.seq_length
    return ModelCost(
        workload=workload, source=source,
        train_flops_per_sample=3 * 2.0 * macs_per_row, eval_flops_per_sample=2.0 * macs_per_row, params=params,
        gradient_bytes=GRADIENT_BYTES * params, optimizer_bytes_per_param=OPTIMIZER_BYTES_PER_PARAM,
        # no training file: the samples the schedule trains
        train_samples=cfg.data.train_samples or cfg.optimizer.max_steps * cfg.schedule.global_batch_size,
        eval_samples=cfg.data.eval_samples, sample_unit=f"row of {s} tokens",
        # tensor parallelism on the mesh's model axis (heads / ff or expert hidden / vocab split): 2 activation
        # all-reduces per layer forward and 2 backward
        mp_bytes_per_sample=4 * m.num_layers * s * m.hidden_size * ACTIVATION_BYTES,
        fsdp_gather_bytes=FSDP_WEIGHT_BYTES * params if cfg.runtime.fsdp else 0.0,
        fsdp_gathers_per_step=FSDP_GATHERS_PER_STEP,
        eval_host_seconds_per_sample=EVAL_HOST_SECONDS_PER_SAMPLE, eval_fixed_seconds=EVAL_FIXED_SECONDS,
        notes=notes)


def rules_eval_positions(record: DecoderRules) -> Callable[[Any, float, int], list[float]]:
    """The eval positions `plan` counts for a decoder benchmark: its record's cadence (the run's
    `eval_schedule`'s) through the first at or past `upto`, in samples."""
    def eval_positions(cfg: Any, upto: float, global_batch: int) -> list[float]:
        return record.cadence(cfg, global_batch).through(upto)
    return eval_positions


# Host memory of a CPU run's train step (harness/train/host_memory.py). Counted per token in elements of the
# compute dtype, what the forward keeps for the backward pass (TensorFlow's graph executor frees the rest):
# per layer the two norms' inputs and outputs, the residual sums and the projections' outputs (~8 x hidden),
# q, k and v before and after RoPE (4 x their widths), the attention scores three times over (scores,
# scaled and biased, probabilities) for every key a query sees plus the causal bias, the feed-forward's
# hidden units five times over (gate, up, silu and its sigmoid, product). One layer's worth more is live in
# the backward pass (its gradients); with model.remat only each layer's input is kept, and the layer being
# recomputed is live twice. The loss (harness/nn/cross_entropy.py) holds one block of float32 logits at a
# time, LOSS_BLOCK_COPIES of it (logits, exponentials, one-hot and gradient; recomputed the same way in the
# backward pass), or all the logits as one kept block where they fit KEEP_ELEMENTS, plus LM-head-sized
# float32 gradients beside the head's own: a block's part and the running sum. Measured against real runs in
# docs/running.md ("Host memory").
LOSS_BLOCK_COPIES = 4
HEAD_GRADIENT_PARTIALS = 2


def loss_bytes(cfg, rows: int) -> int:
    """Peak bytes of the blockwise loss beyond the head's own gradient, for `rows` rows on one device."""
    # lazily: the plan's cost reads stay TensorFlow-free
    from harness.nn.cross_entropy import BLOCK_ELEMENTS, KEEP_ELEMENTS, block_length

    m, s = cfg.model, cfg.data.seq_length
    whole = rows * s * m.vocab_size
    if whole <= KEEP_ELEMENTS:
        block = whole
    else:
        block = rows * block_length(rows, s, m.vocab_size, BLOCK_ELEMENTS) * m.vocab_size
    return 4 * (LOSS_BLOCK_COPIES * block + HEAD_GRADIENT_PARTIALS * m.hidden_size * m.vocab_size)


def kept_activation_bytes(cfg, rows: int) -> int:
    """A lower bound of what a decoder's train step keeps for its backward pass on a device that holds
    `rows` rows' hidden stream: each layer's input (all that `model.remat` keeps; more without it), in the
    compute dtype. The dry run refuses a device that cannot hold this beside the weights and optimizer state."""
    m = cfg.model
    width = 2 if cfg.runtime.precision in ("bfloat16", "float16") else 4
    return int(m.num_layers * rows * cfg.data.seq_length * m.hidden_size * width)


def decoder_activation_bytes(cfg, rows: int, score_keys: float, ffn_units: float, extra_units: float = 0,
                             score_copies: int = 3, ffn_copies: int = 5) -> int:
    """Peak bytes of a decoder LM's train step beyond its variables, for `rows` rows of data.seq_length
    tokens: `score_keys` is the keys one query's scores span summed over the layers, `ffn_units` the hidden
    units the feed-forward keeps per token and layer (the dense SwiGLU's ffn_hidden; the routed experts'),
    `extra_units` what a block's options keep besides per token and layer, `score_copies` and `ffn_copies`
    how many times over the scores and the hidden units are kept (the plain block's 3 and 5, below)."""
    m, s = cfg.model, cfg.data.seq_length
    width = 2 if cfg.runtime.precision in ("bfloat16", "float16") else 4
    tokens = rows * s
    qkv = m.head_dim * (m.num_heads + 2 * m.num_kv_heads)
    groups = m.num_heads // max(1, m.num_kv_heads)
    per_layer = 8 * m.hidden_size + 4 * qkv + ffn_copies * ffn_units + extra_units  # per token, scores aside
    scores = (score_copies * m.num_heads + groups) * score_keys                    # per token, all layers
    if m.remat:
        kept = m.num_layers * m.hidden_size + 2 * (per_layer + scores / max(1, m.num_layers))
    else:
        kept = m.num_layers * per_layer + scores + per_layer + scores / max(1, m.num_layers)
    return int(tokens * kept * width + loss_bytes(cfg, rows))
