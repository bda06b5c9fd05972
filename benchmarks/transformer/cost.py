"""Transformer-big's cost for `mlperf-harness plan`, per training row of row_length packed tokens.

Encoder layer: 4*s*h^2 (attention projections) + 2*s*h*f (feed-forward) + 2*s^2*h (scores, context);
decoder layer: twice the attention (self and cross) + feed-forward; output logits s*h*V against the shared
embedding. Training = 3 x forward. Eval: beam search over the eval sentences, counted per generated token
with the decoder's cached keys (beam x (source + extra_decode_length) steps at most).

Epochs to converge: the Transformer has no RCP table (it left MLPerf before RCPs, 1.0), so CONVERGENCE
below is documented from public v0.7 results that are NOT among the scale families scripts/validate_plan.py
checks: 3.0 epochs at 256-320 rows of 256 tokens (Tencent GN10X-8xV100 65,536 tokens, Fujitsu
gx_V100x8 81,920 tokens), 5.06 epochs at 2,048 rows (Google tpu-v3-8192 TF 5.625 and JAX 4.5, mean).
"""
from __future__ import annotations

from harness import benchmark_rules as rules
from harness.plan.cost import CostModel, ModelCost

CONVERGE_UNIT = "epochs"
CONVERGENCE = {"batch_unit": "rows of 256 tokens", "points": [(256, 3.0), (2048, 5.06)],
               "source": "public v0.7 results outside the validated families (benchmarks/transformer/cost.py)"}
# Where the eval runs: beam search on the devices (split over the chips); detokenizing and BLEU on one host
# per sentence: 0.9 ms a sentence, the harness's own corpus_bleu (benchmarks/transformer/bleu.py) timed on
# 3,003 sentences of 27 words on a 2-core host (2.7 s); a fixed 10 ms per eval (assumption)
EVAL_HOST_SECONDS_PER_SAMPLE = 0.9e-3
EVAL_FIXED_SECONDS = 0.01
# Adam in float32: read weight, gradient, m, v (16 B), write weight, m, v (12 B)
OPTIMIZER_BYTES_PER_PARAM = 28.0
MEAN_SOURCE_TOKENS = 32  # newstest2014 English sentences, subword tokens (order of magnitude; eval only)


def row_length(cfg) -> int:
    return cfg.data.row_length or cfg.data.max_sequence_length


def forward_macs_and_params(cfg) -> tuple[int, int]:
    m = cfg.model
    h, f, layers, vocab, s = m.hidden_size, m.filter_size, m.num_layers, m.vocab_size, row_length(cfg)
    enc = 4 * s * h * h + 2 * s * h * f + 2 * s * s * h
    dec = 8 * s * h * h + 2 * s * h * f + 4 * s * s * h
    macs = layers * (enc + dec) + s * h * vocab
    enc_params = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
    dec_params = enc_params + 4 * h * h + 4 * h + 2 * h
    params = vocab * h + layers * (enc_params + dec_params) + 4 * h
    return macs, params


def eval_macs_per_sentence(cfg) -> float:
    m, e = cfg.model, cfg.section("eval")
    h, f, layers, vocab = m.hidden_size, m.filter_size, m.num_layers, m.vocab_size
    src = MEAN_SOURCE_TOKENS
    steps = src + e.extra_decode_length
    encoder = src * layers * (4 * h * h + 2 * h * f) + layers * 2 * src * src * h
    per_token = layers * (8 * h * h + 2 * h * f) + h * vocab + layers * 2 * h * (steps / 2 + src)
    return encoder + e.beam_size * steps * per_token


def model_cost(cfg) -> ModelCost:
    macs, params = forward_macs_and_params(cfg)
    m, s = cfg.model, row_length(cfg)
    return ModelCost(
        workload="transformer", source="counted (benchmarks/transformer/cost.py: matmuls, attention, logits)",
        train_flops_per_sample=3 * 2.0 * macs, eval_flops_per_sample=2.0 * eval_macs_per_sentence(cfg),
        params=params, gradient_bytes=4.0 * params, optimizer_bytes_per_param=OPTIMIZER_BYTES_PER_PARAM,
        train_samples=cfg.data.train_samples or 566340, eval_samples=cfg.data.eval_samples,
        sample_unit=f"row of {s} tokens",
        # heads / ff / vocab split: 2 all-reduces per encoder layer, 3 per decoder layer, forward and backward
        mp_bytes_per_sample=2 * 5 * m.num_layers * s * m.hidden_size * 2.0,
        eval_host_seconds_per_sample=EVAL_HOST_SECONDS_PER_SAMPLE, eval_fixed_seconds=EVAL_FIXED_SECONDS)


def eval_positions(cfg, upto: float, global_batch: int) -> list[float]:
    """The config's evals (the run's default `eval_schedule`) before `upto`, and one AT `upto`, not rounded up:
    CONVERGENCE holds logged eval positions already (public runs evaluate at fractional epochs)."""
    return [e for e in rules.epoch_positions(cfg.schedule, upto) if e < upto - 1e-9] + [upto]


COST = CostModel(model_cost, eval_positions, CONVERGE_UNIT, convergence=CONVERGENCE)
