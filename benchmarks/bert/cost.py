"""BERT's cost for `mlperf-harness plan`: multiply-adds per sequence counted from the config.

Per encoder layer: Q, K, V and output projections 4*s*h^2, feed-forward 2*s*h*ff, attention scores and
context 2*s^2*h; the masked-LM head runs on the max_predictions positions (transform h^2 and the vocab
projection h*V), plus the pooler. BERT-large at s=512 counts 0.34 T FLOPs per forward sequence.
Training = 3 x forward. Eval: the forward pass over eval_samples sequences.

That is the cost of a sequence padded to s. Implementations that skip the padding (NVIDIA's `--unpad
--unpad_fmha` from v0.7 on, packing) pay for the real tokens only: `real_token_cost` scales the parts that
grow with the tokens by the fraction of real tokens f (the projections, the feed-forward and the masked-LM
head, whose masked positions are 15% of the real tokens), attention's scores and context by the mean
squared length over s^2 (each sequence attends over its own length), and leaves the pooler (one per
sequence) alone.
"""
from __future__ import annotations

import dataclasses

from harness import benchmark_rules as rules
from harness.plan.cost import CostModel, ModelCost

CONVERGE_UNIT = "samples"
# Where the eval runs: masked-LM accuracy is counted on the devices (split over the chips); nothing per sample
# on the host; a fixed 10 ms per eval gathers the counters (an assumption; --calibrate measures the rest)
EVAL_HOST_SECONDS_PER_SAMPLE = 0.0
EVAL_FIXED_SECONDS = 0.01
# LAMB in float32: read weight, gradient, m, v (16 B) and write weight, m, v (12 B) for the update, then
# read weight and update again for the trust ratio (8 B)
OPTIMIZER_BYTES_PER_PARAM = 36.0

# The MLPerf BERT dataset's sequence lengths at s=512: the histogram Graphcore published with "Packing:
# Towards 2x NLP BERT Acceleration" (Krell et al. 2021, arXiv 2107.02027), `wikipedia_histogram` in
# graphcore/tutorials blogs_code/packedBERT/histograms.py (commit e9dbe4825f034a47871c4db0deb86d727cbd69b9):
# 16,279,552 sequences of the MLPerf reference's Wikipedia pre-training data, counts by length 1..512.
# scripts/bert_sequence_lengths.py computes from it: mean real length 255.83 tokens (f = 0.4997; the
# paper's "speed-up theoretical limit" 2.0013 = 1 / f), mean squared length 0.3770 x 512^2 (23% of the
# sequences are full). f bounds the squared term from above (every length <= s) and f^2 from below (all
# lengths equal); this dataset sits at 0.509 of the way from f^2 to f, a spread kept for other fractions.
DATASET_SEQ_LENGTH = 512
DATASET_REAL_TOKEN_FRACTION = 0.4997
DATASET_SQUARED_LENGTH_FRACTION = 0.3770
DATASET_SOURCE = ("MLPerf BERT Wikipedia data at 512: mean 255.8 real tokens, from the length histogram of "
                  "Krell et al. 2021 (arXiv 2107.02027)")


def forward_macs_by_kind(cfg) -> dict[str, int]:
    """Forward multiply-adds of one sequence padded to s, by how they grow with its real length L:
    `tokens` (linear in L), `attention` (scores and context, L^2), `sequence` (once per sequence)."""
    m, d = cfg.model, cfg.data
    h, ff, layers, vocab, s, p = m.hidden_size, m.ff_size, m.num_layers, m.vocab_size, d.seq_length, \
        d.max_predictions
    return {"tokens": layers * (4 * s * h * h + 2 * s * h * ff) + p * (h * h + h * vocab),
            "attention": layers * 2 * s * s * h,
            "sequence": h * h + 2 * h}


def squared_length_fraction(fraction: float) -> float:
    """Mean squared real length over s^2 at a mean real length of `fraction` x s: the dataset's spread
    between the bounds f^2 and f, which gives the measured value at the dataset's own fraction and is an
    approximation at any other."""
    f0 = DATASET_REAL_TOKEN_FRACTION
    spread = (DATASET_SQUARED_LENGTH_FRACTION - f0 * f0) / (f0 - f0 * f0)
    return fraction * fraction + spread * (fraction - fraction * fraction)


def forward_macs_and_params(cfg) -> tuple[int, int]:
    m = cfg.model
    h, ff, layers, vocab = m.hidden_size, m.ff_size, m.num_layers, m.vocab_size
    macs = sum(forward_macs_by_kind(cfg).values())
    layer_params = 4 * h * h + 4 * h + 2 * h * ff + ff + h + 4 * h
    params = (vocab * h + m.max_position * h + 2 * h + 2 * h + layers * layer_params + h * h + h
              + h * h + h + 2 * h + vocab + 2 * h + 2)
    return macs, params


def model_cost(cfg) -> ModelCost:
    macs, params = forward_macs_and_params(cfg)
    m, s = cfg.model, cfg.data.seq_length
    return ModelCost(
        workload="bert", source="counted (benchmarks/bert/cost.py: encoder matmuls, attention, MLM head)",
        train_flops_per_sample=3 * 2.0 * macs, eval_flops_per_sample=2.0 * macs, params=params,
        gradient_bytes=4.0 * params, optimizer_bytes_per_param=OPTIMIZER_BYTES_PER_PARAM,
        train_samples=cfg.data.train_samples, eval_samples=cfg.data.eval_samples, sample_unit="sequence",
        # Megatron-style split: 2 activation all-reduces per layer forward and 2 backward, bf16
        mp_bytes_per_sample=4 * m.num_layers * s * m.hidden_size * 2.0,
        eval_host_seconds_per_sample=EVAL_HOST_SECONDS_PER_SAMPLE, eval_fixed_seconds=EVAL_FIXED_SECONDS)


def real_token_cost(cfg, fraction: float) -> ModelCost:
    """The cost of a sequence whose real (non-padding) tokens are `fraction` of s on average, for logs of
    implementations that skip the padding (the module docstring)."""
    kinds = forward_macs_by_kind(cfg)
    squared = squared_length_fraction(fraction)
    macs = kinds["tokens"] * fraction + kinds["attention"] * squared + kinds["sequence"]
    full = model_cost(cfg)
    own = abs(fraction - DATASET_REAL_TOKEN_FRACTION) < 5e-5 and cfg.data.seq_length == DATASET_SEQ_LENGTH
    how = (f"{fraction:.4g} of the {cfg.data.seq_length} tokens real (--real_token_fraction): token-wise parts "
           f"x {fraction:.4g}, attention x {squared:.4g} (mean squared length over s^2: "
           + ("the MLPerf dataset's, measured)" if own else
              "the MLPerf dataset's spread between f^2 and f, an approximation)"))
    return dataclasses.replace(
        full, source=f"{full.source}; {how}", train_flops_per_sample=3 * 2.0 * macs,
        eval_flops_per_sample=2.0 * macs, mp_bytes_per_sample=full.mp_bytes_per_sample * fraction,
        notes=how)


def eval_cadence(cfg, global_batch: int) -> rules.Cadence:
    """Where the run evaluates, in samples (its `eval_schedule` and `plan` read this): every
    `data.eval_every_samples`, else the ruleset's rule (the record's cadence: 0.7.0 from 3M samples, every 500K;
    1.0+ every FLOOR(0.05 * (230.23 * gbs + 3M), 25K))."""
    if cfg.data.eval_every_samples:
        return rules.Cadence(rules.SAMPLE, cfg.data.eval_every_samples, cfg.data.eval_every_samples)
    rule = rules.cadence("bert", cfg.ruleset, global_batch)
    return rules.Cadence(rules.SAMPLE, int(rule.first), int(rule.every))


def eval_positions(cfg, upto: float, global_batch: int) -> list[float]:
    """Eval points in samples through the first at or past `upto`."""
    return eval_cadence(cfg, global_batch).through(upto)


COST = CostModel(model_cost, eval_positions, CONVERGE_UNIT, real_token_cost=real_token_cost,
                 dataset_real_tokens=(DATASET_SEQ_LENGTH, DATASET_REAL_TOKEN_FRACTION, DATASET_SOURCE))
