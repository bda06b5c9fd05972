"""deepseekv3_671b's rules record (benchmarks/lm/rules.py): the reference's run, each departure refused in one
line (rows of 4096 tokens, 1024 eval rows, the C4 index files, GBS >= 15360 with the learning rate on the
rules' square-root line, the fixed optimizer, the MoE losses and MTP, the MLCommons checkpoint), and an eval
after every step from the step the run's rulesets allow (`closed_first_eval_steps`: 6.1.0's floor(42 + 24576 /
gbs), 6.0.0's any step up to that; harness/benchmark_rules.py holds the cadence). TensorFlow-free: `plan`
counts the evals from the same cadence."""
from __future__ import annotations

import math
from typing import Any

from harness import benchmark_rules as rules
from harness.benchmark_rules import SAMPLE, Cadence

from benchmarks.lm.rules import DecoderRules, pretraining_keys

# The checker's bounds (closed_deepseekv3_671b.yaml) and the reference's learning rate rule, 2.4e-5 x
# sqrt(gbs / 16384) within 1e-9.
CLOSED_MIN_BATCH = 15360
LR_AT_16384, LR_TOLERANCE = 2.4e-5, 1e-9
# The decay the reference's scheduler applies on every step, whatever the optimizer (and the log) says.
CLOSED_APPLIED_DECAY = 0.033


def closed_learning_rate(global_batch: int) -> float:
    """The rules' peak learning rate at `global_batch`: 2.4e-5 x sqrt(gbs / 16384)."""
    return LR_AT_16384 * math.sqrt(global_batch / 16384)


def closed_first_eval_steps(cfg: Any, global_batch: int) -> list[int]:
    """The steps a closed run's first eval may follow under every ruleset its log is checked against:
    [floor(42 + 24576 / gbs)] with 6.1.0 among them, 1 to that step under 6.0.0 alone."""
    allowed: set[int] | None = None
    for ruleset in [cfg.ruleset, *cfg.check_rulesets]:
        rule = rules.cadence("deepseekv3_671b", ruleset, global_batch)
        if rule is None:
            continue
        steps = {round(p / global_batch) for p in (rule.first_choices or (rule.first,))}
        allowed = steps if allowed is None else allowed & steps
    return sorted(allowed or {1})


def cadence(cfg: Any, global_batch: int) -> Cadence:
    """An eval after data.first_eval_step (by default closed the rules' first, the earliest every ruleset
    allows; open the first eval_every_samples mark), then every data.eval_every_samples (else every step)."""
    d = cfg.data
    every = d.eval_every_samples or global_batch
    if d.first_eval_step > 0:
        first = d.first_eval_step
    elif cfg.submission.division == "closed":
        first = closed_first_eval_steps(cfg, global_batch)[0]
    else:
        first = max(1, math.ceil(every / global_batch))
    return Cadence(SAMPLE, first * global_batch, every)


def checks(cfg: Any) -> str | None:
    """The reference's rules no fixed value states."""
    d, o, name, gbs = cfg.data, cfg.optimizer, cfg.workload, cfg.schedule.global_batch_size
    if gbs < CLOSED_MIN_BATCH:
        return f"closed {name} needs schedule.global_batch_size >= {CLOSED_MIN_BATCH} (the checker's bound; got {gbs})"
    if d.eval_every_samples not in (0, gbs):
        return f"closed {name} evaluates after every step: set data.eval_every_samples=0 (got {d.eval_every_samples})"
    allowed = closed_first_eval_steps(cfg, gbs)
    if d.first_eval_step > 0 and d.first_eval_step not in allowed:
        where = f"step {allowed[0]}" if len(allowed) == 1 else f"a step from {allowed[0]} to {allowed[-1]}"
        return (f"closed {name} at global batch {gbs} evaluates first after {where} under rulesets "
                f"{', '.join([cfg.ruleset, *cfg.check_rulesets])} (6.1.0: floor(42 + 24576 / gbs)): set "
                f"data.first_eval_step=-1 (got {d.first_eval_step})")
    lr, want = o.base_learning_rate, closed_learning_rate(gbs)
    if abs(lr - want) >= LR_TOLERANCE:
        return (f"closed {name}: optimizer.base_learning_rate must be 2.4e-5 x sqrt(global_batch_size / 16384) = "
                f"{want:.9f} at global batch {gbs}, within {LR_TOLERANCE:g} (got {lr:g})")
    if not math.isclose(o.applied_decay(), CLOSED_APPLIED_DECAY, rel_tol=1e-9, abs_tol=0.0):
        return (f"closed {name}: the reference's scheduler applies a weight decay of {CLOSED_APPLIED_DECAY:g} on "
                f"every step: set optimizer.applied_weight_decay={CLOSED_APPLIED_DECAY:g} (it applies "
                f"{o.applied_decay():g})")
    return None


# What the checker (optimizer keys, moe_aux_loss_coeff) and the reference (MTP, the bias update) fix.
RULES = DecoderRules(
    fixed=(("optimizer.warmup_steps", 4), ("optimizer.max_steps", 12000), ("optimizer.beta_1", 0.9),
           ("optimizer.beta_2", 0.95), ("optimizer.epsilon", 1e-8), ("optimizer.weight_decay", 0.1),
           ("optimizer.clip_norm", 1.0), ("model.seq_aux_loss_coef", 0.01), ("model.mtp_layers", 1),
           ("model.mtp_loss_weight", 0.1), ("model.bias_update_rate", 1e-3)),
    fixed_by="the reference fixes", row_length=4096, eval_rows=1024, data_source="indexed",
    data_text="trains on the reference's C4 .bin/.idx files",
    checkpoint="continues pre-training from the MLCommons DeepSeek-V3 checkpoint",
    cadence=cadence, checks=checks, keys=pretraining_keys)
