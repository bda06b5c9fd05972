"""One record per MLPerf training benchmark: what the rules and the installed checker say about it.

Every per-benchmark fact the harness needs outside a workload lives here once: the rulesets whose closed and
open divisions accept the key, the closed quality target per ruleset, whether a higher or a lower score is
better, how many runs a result set needs, where a closed run evaluates, which rulesets ship reference
convergence points (RCPs), and the newest ruleset. Workloads (`closed_target`, eval cadence), the review
tools (`check`, `report`, the RCP check, scoring) and the submission tools (`campaign`, `package`) read it.

Plain Python on purpose: `harness/review/` reads any log, including those of benchmarks the harness does
not run, without importing TensorFlow or a workload. The facts follow mlperf-logging 4.1.68's own files
(`compliance_checker/training_<ruleset>/`, `benchmark_meta.py`, `rcp_checker/training_<ruleset>/`);
tests/test_benchmark_rules.py holds every record against them. Rulesets start at 0.7.0: 0.6.0's parser
reads only the legacy line format, which mllog does not write.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Mapping

from harness.errors import HarnessError

RULESETS = ("0.7.0", "1.0.0", "1.1.0", "2.0.0", "2.1.0", "3.0.0", "3.1.0", "4.0.0", "4.1.0", "5.0.0", "5.1.0",
            "6.0.0", "6.1.0")
EPOCH, SAMPLE = "epoch", "sample"


def span(first: str, last: str) -> tuple[str, ...]:
    """The rulesets from `first` to `last`, both included."""
    return RULESETS[RULESETS.index(first):RULESETS.index(last) + 1]


# --------------------------------------------------------------------------------------- eval cadence

@dataclasses.dataclass(frozen=True)
class Cadence:
    """Where a closed run evaluates under one ruleset: at `first`, then every `every` (in `unit`s).

    `first_choices`: the positions the first eval may take (ResNet: epoch 1, 2, 3 or 4); `skip`: grid
    positions the rules leave out (SSD 0.7.0/1.0.0: 40, 50, 55, ...); `exact` False: v0.7's "at least as
    frequently", so the positions are latest allowed ones, not fixed ones.
    """
    unit: str
    first: float
    every: float
    first_choices: tuple[float, ...] = ()
    skip: tuple[float, ...] = ()
    exact: bool = True

    def positions(self, upto: float, first: float | None = None) -> list[float]:
        """The rules' eval positions up to `upto`, starting at `first` (default: `self.first`)."""
        start = self.first if first is None else first
        count = int(math.floor((upto - start) / self.every + 1e-9)) + 1 if upto >= start else 0
        out = [start + k * self.every for k in range(count)]
        return [int(p) if float(p).is_integer() else p for p in out if p not in self.skip]

    def through(self, upto: float) -> list[float]:
        """The eval positions up to and including the first at or past `upto` (a run stops only at an eval)."""
        grid = self.positions(max(upto, self.first) + (len(self.skip) + 1) * self.every)
        return [p for p in grid if p < upto - 1e-9] + [p for p in grid if p >= upto - 1e-9][:1]

    def marks(self, budget: float) -> list[float]:
        """The eval positions before `budget`, then `budget` itself (a run's last eval ends its budget)."""
        return [p for p in self.positions(budget) if p < budget - 1e-9] + [budget]

    @property
    def largest_gap(self) -> float:
        """The widest spacing between two of the rules' evals (SSD 0.7.0: 10, from 40 to 50)."""
        grid = self.positions(self.first + (len(self.skip) + 2) * self.every)
        return max(b - a for a, b in zip(grid, grid[1:]))

    def text(self) -> str:
        """The schedule as the rules word it: 'every 5 epochs' or '40, 50, 55, ... epochs'."""
        unit = f"{self.unit}s"
        if self.first == self.every and not self.skip:
            return f"every {self.every:,g} {unit}"
        grid = self.positions(self.first + (len(self.skip) + 2) * self.every)[:3]
        return f"{', '.join(f'{p:,g}' for p in grid)}, ... {unit}"


def epoch_cadence(schedule: Any) -> Cadence:
    """A config's own epoch cadence (its `schedule` section): every schedule.eval_every_epochs (0: 1) from
    schedule.eval_offset_epochs (0: from the first spacing). The run's default `eval_schedule` and `plan` read it."""
    every = schedule.eval_every_epochs or 1.0
    return Cadence(EPOCH, schedule.eval_offset_epochs or every, every)


def epoch_positions(schedule: Any, upto: float) -> list[float]:
    """A config's eval epochs through the first at or past `upto`: schedule.eval_epochs when given, else its
    cadence (`epoch_cadence`)."""
    if schedule.eval_epochs:
        listed = sorted(float(e) for e in schedule.eval_epochs)
        return [e for e in listed if e < upto - 1e-9] + [e for e in listed if e >= upto - 1e-9][:1]
    return epoch_cadence(schedule).through(upto)


RESNET_EVAL_EVERY = 4  # epochs, first at epoch 1-4: "every 4 epochs with offset 0 or 1 or 2 or 3"
BERT_V07_FIRST, BERT_V07_EVERY = 3_000_000, 500_000  # v0.7: "starting at 3M samples, then every 500K"
SSD_FIRST, SSD_EVERY, SSD_V10_SKIP = 40, 5, 45  # 0.7.0/1.0.0: epochs 40, 50, 55, ...; 1.1.0: every 5
LM_EVAL_SAMPLES = 12_288  # the decoder LMs: every 12,288 samples, rounded up to whole batches
LORA_EVAL_SAMPLES = 384   # llama2_70b_lora: every 384 samples, rounded up to whole batches
DSV3_SKIP_STEPS, DSV3_SKIP_SAMPLES = 42, 24_576  # deepseekv3_671b 6.1.0: first eval at step 42 + 24576 // gbs


FLUX_EVAL_SAMPLES = 262_144  # flux1: every 262,144 samples, ceil(262144 / gbs) * gbs where gbs does not divide it


def flux_eval_every(global_batch: int) -> int:
    """flux1: samples between evals; the reference evaluates after step s when s % ceil(262144 / gbs) == 0."""
    return math.ceil(FLUX_EVAL_SAMPLES / global_batch) * global_batch


def flux_evaluation_frequency(ruleset: str, global_batch: int) -> int:
    """The `evaluation_frequency` a closed flux1 log must state: the 5.1.0 and 6.0.0 checkers want 262144 at
    any gbs, the 6.1.0 checker ceil(262144 / gbs) * gbs (the same where gbs divides 262144)."""
    return FLUX_EVAL_SAMPLES if ruleset in ("5.1.0", "6.0.0") else flux_eval_every(global_batch)


def _flux_cadence(ruleset: str, global_batch: int) -> Cadence:
    every = flux_eval_every(global_batch)
    return Cadence(SAMPLE, every, every)


def bert_eval_every(global_batch: int) -> int:
    """Rules >= 1.0: FLOOR(0.05 * (230.23 * gbs + 3,000,000), 25,000) samples between evals."""
    return int(math.floor(0.05 * (230.23 * global_batch + 3_000_000) / 25_000)) * 25_000


def lm_eval_every(global_batch: int) -> int:
    """llama31_8b and gpt_oss_20b: every 12,288 samples, or ceil(12288 / gbs) * gbs when gbs does not divide it."""
    return math.ceil(LM_EVAL_SAMPLES / global_batch) * global_batch


def lora_eval_every(global_batch: int) -> int:
    """llama2_70b_lora: every 384 samples, or ceil(384 / gbs) * gbs when gbs does not divide it."""
    return math.ceil(LORA_EVAL_SAMPLES / global_batch) * global_batch


def lora_eval_skip(global_batch: int) -> int:
    """llama2_70b_lora: the first floor(0.125 * gbs + 2) evals are skipped (3 at GBS 8: first at 1536)."""
    return int(math.floor(0.125 * global_batch + 2))


def dsv3_first_eval_step(global_batch: int) -> int:
    """deepseekv3_671b under 6.1.0: the first eval after step floor(42 + 24576 / gbs) (43 for 15360-24576);
    the checker's FIRST_CHECK wants the first eval_accuracy at that step x gbs samples."""
    return DSV3_SKIP_STEPS + DSV3_SKIP_SAMPLES // global_batch


def _dsv3_cadence(ruleset: str, global_batch: int) -> Cadence:
    """An eval after every step: 6.1.0 from its first-eval step; 6.0.0 from any step up to that one (the
    rules say every step, its checker has no first-eval rule, and a log that skips the first evals as
    6.1.0 does passes both)."""
    first = dsv3_first_eval_step(global_batch)
    if ruleset == "6.0.0":
        return Cadence(SAMPLE, global_batch, global_batch,
                       first_choices=tuple(k * global_batch for k in range(1, first + 1)))
    return Cadence(SAMPLE, first * global_batch, global_batch)


# dlrmv4 (6.1.0 closed_dlrmv4.yaml): one pass over Yambda-5B's train windows, evals on the AUC window.
DLRMV4_TRAIN_SAMPLES, DLRMV4_EVAL_SAMPLES = 2_290_835_423, 2_058_204


def dlrmv4_eval_every(global_batch: int) -> int:
    """max(1, ceil(0.001 * train_samples / gbs)) * gbs samples between evals (the checker's ceil; the
    reference rounds, which differs at e.g. GBS 4096)."""
    return max(1, int(math.ceil(0.001 * DLRMV4_TRAIN_SAMPLES / global_batch))) * global_batch


def dlrmv4_first_eval(global_batch: int) -> int:
    """The checker's FIRST_CHECK: ceil(floor((4480 gbs + 135331840) / 3) / every) * every samples."""
    every = dlrmv4_eval_every(global_batch)
    return int(math.ceil(math.floor((4480 * global_batch + 135331840) / 3) / every)) * every


def dlrmv4_lr_band(global_batch: int) -> tuple[float, float]:
    """The closed base learning rate's bounds: [0.5, 1.5] x 1e-6 x gbs / 8192 (dense and sparse alike)."""
    return 0.5e-6 * global_batch / 8192, 1.5e-6 * global_batch / 8192


def _dlrmv4_cadence(ruleset: str, global_batch: int) -> Cadence:
    return Cadence(SAMPLE, dlrmv4_first_eval(global_batch), dlrmv4_eval_every(global_batch))


def _lora_cadence(ruleset: str, global_batch: int) -> Cadence:
    every = lora_eval_every(global_batch)
    return Cadence(SAMPLE, (lora_eval_skip(global_batch) + 1) * every, every)


def _resnet_cadence(ruleset: str, global_batch: int) -> Cadence:
    every = RESNET_EVAL_EVERY
    return Cadence(EPOCH, every, every, first_choices=tuple(range(1, every + 1)), exact=ruleset != "0.7.0")


def _bert_cadence(ruleset: str, global_batch: int) -> Cadence:
    if ruleset == "0.7.0":
        return Cadence(SAMPLE, BERT_V07_FIRST, BERT_V07_EVERY, exact=False)
    every = bert_eval_every(global_batch)
    return Cadence(SAMPLE, every, every)


def _ssd_cadence(ruleset: str, global_batch: int) -> Cadence | None:
    if ruleset == "1.1.0":
        return Cadence(EPOCH, SSD_EVERY, SSD_EVERY)
    if ruleset in ("0.7.0", "1.0.0"):
        return Cadence(EPOCH, SSD_FIRST, SSD_EVERY, skip=(SSD_V10_SKIP,), exact=ruleset != "0.7.0")
    return None  # from 2.0.0 the key is RetinaNet, whose cadence is not recorded here


def _lm_cadence(ruleset: str, global_batch: int) -> Cadence:
    every = lm_eval_every(global_batch)
    return Cadence(SAMPLE, every, every)


# ------------------------------------------------------------------------------ a workload's closed rules

@dataclasses.dataclass(frozen=True)
class ClosedRules:
    """What the closed division fixes of one workload's config, declared once and checked by one loop
    (`Workload.validate_closed`); a workload without one checks nothing there.

    `fixed`: (dotted config key, value) pairs, numbers compared within 1e-9 (`fixed_by` says whose rule);
    `row_length` / `eval_rows`: data.seq_length and data.eval_samples; `data_source` (and `data_text`, what
    it is): the data.source a closed run reads; `checkpoint`: None no rule, "" no model.init_checkpoint (a
    run from the reference's initialization), else what the closed run starts from (then required);
    `cadence(cfg, global_batch)`: where this config's run evaluates (the rules' cadence in the closed
    division, the config's own in the open), TensorFlow-free so that `plan` counts the run's evals;
    `checks(cfg)`: the rules no pair states (checked first), the first departure as one line's text (None:
    none).
    """
    fixed: tuple[tuple[str, Any], ...] = ()
    fixed_by: str = "the rules fix"
    row_length: int | None = None
    eval_rows: int | None = None
    data_source: str = ""
    data_text: str = ""
    checkpoint: str | None = None
    cadence: Callable[[Any, int], Cadence] | None = None
    checks: Callable[[Any], str | None] | None = None

    def departures(self, cfg: Any, name: str) -> str | None:
        """The first rule `cfg` departs from, as one line's text (None: none)."""
        d = cfg.data
        problem = self.checks(cfg) if self.checks is not None else None
        if problem:
            return problem
        if self.data_source and d.source != self.data_source:
            return f"closed {name} {self.data_text}: set data.source={self.data_source} (got {d.source})"
        if self.row_length is not None and d.seq_length != self.row_length:
            return f"closed {name} trains on rows of {self.row_length} tokens (got data.seq_length={d.seq_length})"
        if self.eval_rows is not None and d.eval_samples != self.eval_rows:
            return f"closed {name} scores {self.eval_rows} eval rows (got data.eval_samples={d.eval_samples})"
        for key, want in self.fixed:
            got = _lookup(cfg, key)
            same = (math.isclose(got, want, rel_tol=1e-9, abs_tol=0.0) if isinstance(want, (int, float))
                    and not isinstance(want, bool) else got == want)
            if not same:
                return f"closed {name}: {self.fixed_by} {key}={want:g} (got {got:g})" if isinstance(want, (
                    int, float)) else f"closed {name}: {self.fixed_by} {key}={want} (got {got})"
        if self.checkpoint == "" and cfg.model.init_checkpoint:
            return (f"closed {name} pretrains from the reference's random initialization: remove "
                    f"model.init_checkpoint")
        if self.checkpoint and not cfg.model.init_checkpoint:
            return f"closed {name} {self.checkpoint}: set model.init_checkpoint to its Hugging Face directory"
        return None


def _lookup(cfg: Any, key: str) -> Any:
    """The config value at a dotted path (`optimizer.beta_1`)."""
    value = cfg
    for part in key.split("."):
        sections = getattr(value, "sections", None) or {}
        value = sections[part] if part in sections else getattr(value, part)
    return value


# ------------------------------------------------------------------------------------------ records

@dataclasses.dataclass(frozen=True)
class Target:
    """A closed quality target: `value` (the bound eval_accuracy must reach), or None when the checker
    judges more than one number (`text` says what); `small_batch` = (gbs, target below that batch)."""
    value: float | None
    text: str
    small_batch: tuple[int, float] | None = None


@dataclasses.dataclass(frozen=True)
class Variant:
    """One model a key has named: `ssd` was SSD-ResNet34 to 1.1.0 and RetinaNet from 2.0.0. `marker`: a
    hyperparameter key only this model's logs carry, which tells a log's variant when nothing else does."""
    model: str
    rulesets: tuple[str, ...]
    marker: str = ""


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """Everything the harness knows about one MLPerf training benchmark key."""
    key: str
    variants: tuple[Variant, ...]  # oldest first; their rulesets together are `closed`
    open: tuple[str, ...]  # rulesets whose open division accepts the key
    targets: Mapping[str, Target]  # closed target per closed ruleset
    higher_is_better: bool
    runs: int  # result logs a result set needs (the checker states one count per key)
    rcp: tuple[str, ...]  # closed rulesets that ship RCPs for the key
    unit: str = EPOCH  # what eval positions count: epochs or training samples
    cadence: Callable[[str, int], Cadence | None] | None = None  # (ruleset, gbs) -> where closed runs evaluate
    closed_fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # logged keys closed runs must hold
    # Checker keys that bind the run's size in every division, with the smallest values the checker accepts: a
    # log failing the checker is re-checked with them (harness/train/size_bound.py, a diagnosis only).
    size_bound: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def closed(self) -> tuple[str, ...]:
        """Rulesets whose closed division accepts the key, oldest first."""
        return tuple(r for r in RULESETS if any(r in v.rulesets for v in self.variants))

    @property
    def newest(self) -> str:
        return self.closed[-1]

    @property
    def rulesets(self) -> tuple[str, ...]:
        """Rulesets that accept the key in either division."""
        return tuple(r for r in RULESETS if r in self.closed or r in self.open)


def _bench(key: str, targets: list[tuple[tuple[str, ...], Target]], higher: bool, runs: int,
           rcp: tuple[str, ...] = (), open_: tuple[str, ...] | None = None,
           variants: tuple[Variant, ...] = (), **extra: Any) -> Benchmark:
    """A record from (rulesets, target) spans; a target's text defaults to its bound with the relation;
    `open_` defaults to the closed rulesets."""
    relation = ">=" if higher else "<="
    by_ruleset = {r: t if t.text else dataclasses.replace(t, text=f"{relation} {t.value:g}")
                  for rulesets, t in targets for r in rulesets}
    closed = tuple(r for r in RULESETS if r in by_ruleset)
    return Benchmark(key, variants or (Variant(key, closed),), closed if open_ is None else open_, by_ruleset,
                     higher, runs, rcp, **extra)


def _at(rulesets: tuple[str, ...], value: float | None, text: str = "",
        small_batch: tuple[int, float] | None = None) -> list[tuple[tuple[str, ...], Target]]:
    """One target over `rulesets`."""
    return [(rulesets, Target(value, text, small_batch))]


_ALL = [
    _bench("resnet", _at(span("0.7.0", "4.0.0"), 0.759), True, 5, span("1.0.0", "4.0.0"), cadence=_resnet_cadence),
    _bench("bert", _at(("0.7.0",), 0.706, text=">= 0.712 below global batch 8192, else >= 0.706",
                       small_batch=(8192, 0.712)) + _at(span("1.0.0", "5.0.0"), 0.720),
           True, 10, span("1.0.0", "5.0.0"), unit=SAMPLE, cadence=_bert_cadence,
           closed_fixed={"max_sequence_length": 512}),
    _bench("transformer", _at(("0.7.0",), 0.25), True, 10),
    _bench("gnmt", _at(("0.7.0",), 0.24), True, 10),
    _bench("ssd", _at(span("0.7.0", "1.1.0"), 0.23) + _at(span("2.0.0", "4.1.0"), 0.34), True, 5,
           span("1.0.0", "4.1.0"), cadence=_ssd_cadence,
           variants=(Variant("SSD-ResNet34", span("0.7.0", "1.1.0"), marker="max_samples"),
                     Variant("RetinaNet", span("2.0.0", "4.1.0")))),
    _bench("retinanet", _at(span("5.0.0", "5.1.0"), 0.34), True, 5, span("5.0.0", "5.1.0")),
    _bench("maskrcnn", _at(span("0.7.0", "3.1.0"), None, text="BBOX >= 0.377 and SEGM >= 0.339"), True, 5,
           span("1.0.0", "3.1.0")),
    _bench("minigo", _at(span("0.7.0", "2.1.0"), 0.5), True, 10),
    # dlrm's RCP files ship, but the RCP checker has no run count for the key and stops on it: no RCPs here.
    _bench("dlrm", _at(span("0.7.0", "2.1.0"), 0.8025), True, 5, ()),
    _bench("dlrm_dcnv2", _at(span("3.0.0", "6.0.0"), 0.80275), True, 10, span("3.0.0", "6.0.0")),
    _bench("rnnt", _at(span("1.0.0", "3.1.0"), 0.058), False, 10, span("1.0.0", "3.1.0")),
    _bench("unet3d", _at(span("1.0.0", "4.0.0"), 0.908), True, 40, span("1.0.0", "4.0.0")),
    _bench("gpt3", _at(span("3.0.0", "4.1.0"), 2.69), False, 3, span("3.0.0", "4.1.0"),
           open_=span("4.0.0", "4.1.0")),
    _bench("stable_diffusion", _at(span("3.1.0", "5.0.0"), None, text="FID <= 90 and CLIP >= 0.15"), True, 10,
           span("3.1.0", "5.0.0"), unit=SAMPLE),
    _bench("gnn", _at(span("4.0.0", "4.1.0"), 0.72), True, 10, span("4.0.0", "4.1.0")),
    _bench("rgat", _at(span("5.0.0", "5.1.0"), 0.72), True, 10, span("5.0.0", "5.1.0")),
    _bench("llama2_70b_lora", _at(span("4.0.0", "6.1.0"), 0.925), False, 10, span("4.0.0", "6.1.0"),
           open_=span("5.0.0", "6.1.0"), unit=SAMPLE, cadence=_lora_cadence),
    _bench("llama31_405b", _at(span("5.0.0", "6.0.0"), 5.6), False, 3, span("5.0.0", "6.0.0"),
           unit=SAMPLE),
    _bench("llama31_8b", _at(span("5.1.0", "6.1.0"), 3.3), False, 10, span("5.1.0", "6.1.0"),
           unit=SAMPLE, cadence=_lm_cadence),
    _bench("flux1", _at(span("5.1.0", "6.1.0"), 0.586), False, 10, span("5.1.0", "6.1.0"), unit=SAMPLE,
           cadence=_flux_cadence),
    _bench("gpt_oss_20b", _at(span("6.0.0", "6.1.0"), 3.34), False, 10, span("6.0.0", "6.1.0"),
           unit=SAMPLE, cadence=_lm_cadence),
    # No CPU-size run passes closed_deepseekv3_671b.yaml's bounds, which bind both divisions.
    _bench("deepseekv3_671b", _at(span("6.0.0", "6.1.0"), 3.6), False, 3, span("6.0.0", "6.1.0"),
           unit=SAMPLE, cadence=_dsv3_cadence,
           size_bound={"global_batch_size": 15360, "max_sequence_length": 4096, "eval_samples": 1024}),
    # Its checker (open too) fixes max_sequence_length 65536, which no toy trajectory holds.
    _bench("qwen35_397b_grpo", _at(("6.1.0",), 0.69, text="> 0.69"), True, 3, ("6.1.0",), unit=SAMPLE,
           size_bound={"max_sequence_length": 65536}),
    _bench("dlrmv4", _at(("6.1.0",), 0.75), True, 10, ("6.1.0",), unit=SAMPLE, cadence=_dlrmv4_cadence,
           closed_fixed={"train_samples": DLRMV4_TRAIN_SAMPLES, "eval_samples": DLRMV4_EVAL_SAMPLES,
                         "max_sequence_length": 4096, "opt_name": "Adam", "opt_adam_beta_1": 0.95,
                         "opt_adam_beta_2": 0.999, "opt_adam_epsilon": 1e-8, "opt_weight_decay": 0.0,
                         "opt_gradient_clip_norm": 1.0, "opt_sparse_name": "RowWiseAdagrad",
                         "opt_learning_rate_warmup_steps": 24000, "opt_learning_rate_warmup_start_lr": 0.0,
                         "eval_every_data_pct": 0.001},
           # Its open checker pins Yambda-5B's sample counts and the LR band 1e-6 x GBS / 8192 (x0.5-1.5),
           # which at a CPU-size batch is too small to train: shown at the reference's GBS 8192 and LR 1e-6.
           size_bound={"train_samples": DLRMV4_TRAIN_SAMPLES, "eval_samples": DLRMV4_EVAL_SAMPLES,
                       "global_batch_size": 8192, "opt_base_learning_rate": 1e-6,
                       "opt_sparse_base_learning_rate": 1e-6}),
]
BENCHMARKS: dict[str, Benchmark] = {b.key: b for b in _ALL}


# ------------------------------------------------------------------------------------------ lookups

def names() -> list[str]:
    return sorted(BENCHMARKS)


def record(key: str | None) -> Benchmark:
    """The record of benchmark `key`; HarnessError (one line) when no ruleset knows it."""
    if key not in BENCHMARKS:
        what = "names no benchmark" if key is None else f"{key!r} is not an MLPerf training benchmark"
        raise HarnessError(f"{what} (mlperf-logging's rulesets {RULESETS[0]}-{RULESETS[-1]} know: "
                           f"{', '.join(names())})")
    return BENCHMARKS[key]


def get(key: str | None) -> Benchmark | None:
    """The record of `key`, or None (a log of something else)."""
    return BENCHMARKS.get(key) if key is not None else None


def newest_ruleset(key: str) -> str:
    return record(key).newest


def default_ruleset(key: str, logged_keys: Iterable[str] = ()) -> str:
    """The ruleset to check a log against when its run says none: the newest one of the model the log shows
    (a variant's marker key among `logged_keys`), else the benchmark's newest."""
    rec = record(key)
    logged = set(logged_keys)
    for variant in rec.variants:
        if variant.marker and variant.marker in logged:
            return variant.rulesets[-1]
    return rec.newest


def check_accepts(key: str | None, ruleset: str, division: str | None = None) -> Benchmark:
    """The record of `key` when `ruleset` accepts it (in `division`, when given); HarnessError otherwise."""
    rec = record(key)
    if ruleset not in RULESETS:
        raise HarnessError(f"ruleset {ruleset!r} is not one the harness reads ({', '.join(RULESETS)})")
    accepted = rec.open if division == "open" else rec.closed if division == "closed" else rec.rulesets
    if ruleset not in accepted:
        where = f"{division} " if division in ("closed", "open") else ""
        raise HarnessError(f"ruleset {ruleset} has no {where}{key} benchmark; {key} is in rulesets "
                           f"{', '.join(accepted) or 'none'}")
    return rec


def closed_target(key: str, ruleset: str, global_batch: int | None = None) -> float:
    """The closed-division target of `key` under `ruleset` (at `global_batch` where the target depends on it)."""
    rec = check_accepts(key, ruleset, "closed")
    target = rec.targets[ruleset]
    if target.value is None:
        raise HarnessError(f"closed {key} ({ruleset}) has no single target: {target.text}")
    if target.small_batch and global_batch is not None and global_batch < target.small_batch[0]:
        return target.small_batch[1]
    return target.value


def reaches(key: str | None, value: float, target: float) -> bool:
    """Whether `value` reaches `target` for `key` (>=, or <= where a lower score is better)."""
    rec = get(key)
    return value >= target if rec is None or rec.higher_is_better else value <= target


def relation(key: str | None) -> str:
    rec = get(key)
    return ">=" if rec is None or rec.higher_is_better else "<="


def runs_required(key: str | None) -> int | None:
    rec = get(key)
    return rec.runs if rec else None


def has_rcp(key: str | None, ruleset: str) -> bool:
    rec = get(key)
    return rec is not None and ruleset in rec.rcp


def cadence(key: str | None, ruleset: str, global_batch: int) -> Cadence | None:
    """Where a closed `key` run evaluates under `ruleset`, or None when the record states no cadence."""
    rec = get(key)
    if rec is None or rec.cadence is None or ruleset not in rec.closed:
        return None
    return rec.cadence(ruleset, global_batch)



# ---------------------------------------------------------------------------------- what the numbers are

# What each benchmark's eval_accuracy measures (the logs carry only the number): for report axes and tables.
# From the reference implementations' eval code (github.com/mlcommons/training) and the checkers' targets.
METRICS = {
    "resnet": "top-1 accuracy", "bert": "masked-LM accuracy", "transformer": "BLEU", "gnmt": "BLEU",
    "ssd": "mAP", "retinanet": "mAP", "maskrcnn": "box / mask mAP", "minigo": "win rate", "dlrm": "AUC",
    "dlrm_dcnv2": "AUC", "rnnt": "word error rate", "unet3d": "mean Dice", "gpt3": "log perplexity",
    "stable_diffusion": "FID / CLIP score", "gnn": "accuracy", "rgat": "accuracy", "llama2_70b_lora": "eval loss",
    "llama31_405b": "log perplexity", "llama31_8b": "log perplexity", "flux1": "validation loss",
    "gpt_oss_20b": "log perplexity", "deepseekv3_671b": "log perplexity", "qwen35_397b_grpo": "pass@4",
}


def metric(key: str | None) -> str:
    """The name of what `key`'s eval_accuracy measures ('eval accuracy' when the record names none)."""
    return METRICS.get(key or "", "eval accuracy")


def unit(key: str | None) -> str:
    """'samples' or 'epochs': what `key`'s eval positions and convergence are counted in."""
    rec = get(key)
    return "samples" if rec is not None and rec.unit == SAMPLE else "epochs"


# Where each language model's tokenizer comes from: an export writes weights only, never a tokenizer.
TOKENIZERS = {
    "llama31_8b": "meta-llama/Llama-3.1-8B on Hugging Face (gated: accept the Llama 3.1 Community License); the "
                  "reference's C4 files are tokenized with it",
    "llama2_70b_lora": "meta-llama/Llama-2-70b-hf on Hugging Face (gated: accept the Llama 2 Community License); "
                       "the reference's GovReport files are tokenized with it",
    "gpt_oss_20b": "openai/gpt-oss-20b on Hugging Face (o200k_harmony, Apache-2.0)",
    "deepseekv3_671b": "deepseek-ai/DeepSeek-V3 on Hugging Face (MIT code licence, DeepSeek model licence)",
    # The MMDiT reads text as frozen encoders' outputs: the reference's preprocessing tokenizes with them.
    "flux1": "the frozen text encoders' tokenizers, not the transformer's: google/t5-v1_1-xxl (256 tokens) and "
             "openai/clip-vit-large-patch14 (77 tokens) on Hugging Face, as the reference's precomputed "
             "embeddings were made",
}


def tokenizer_source(key: str | None, vocab_size: int, reference_vocab: int | None) -> str:
    """Where the exported model's tokenizer comes from; a model of another vocabulary size has none."""
    source = TOKENIZERS.get(key or "")
    if source is None:
        return "none: this model is not a language model"
    if reference_vocab is not None and vocab_size != reference_vocab:
        return (f"none: this model's {vocab_size}-id vocabulary is not the reference's {reference_vocab} (a smoke "
                f"model on synthetic token ids); the reference's is {source}")
    return source
