"""RCP preflight: from a few pilot runs, the odds that a full result set passes the RCP test.

`check --rcp` judges finished result sets; this module answers before the submission runs are booked. From
k >= 2 pilot logs at the batch size to be submitted it reads each run's samples (epochs) to converge with
mlperf-logging's own reader, fits a spread, simulates many n-run result sets (n: the installed checker's
`submission_runs` for the benchmark) and has the checker judge each set with the calls `check_directory`
makes: `RCP_Checker._eval_submission_record` for the olympic mean, the pass decision and the normalization
factor, on the record `rcp.checker_record` takes from the checker's own lookups (entry at the batch, or the
interpolation). How many non-converged runs a set may hold is probed from the checker's
`get_submission_epochs` on generated logs, not restated here.

The model, and why:
- Samples to converge are positive, right-skewed (a slow seed costs more than a fast one saves) and vary
  multiplicatively with the learning-rate schedule: log-normal.
- k is small, so the pilots' mean and spread are themselves uncertain. Each simulated set draws its own
  (mu, sigma) from the posterior of the log-normal given the pilots (non-informative prior: sigma^2 =
  (c - 1) s^2 / chi2(c - 1), mu ~ N(mean, sigma^2 / c), c converged pilots), so two lucky pilots do not
  give a confident answer.
- sigma is floored at the RCP's own relative spread at this batch (its `RCP Stdev` / `RCP Mean`, taken to
  log space): the reference runs are 2n or more seeds of the same hyperparameters, and the checker's
  speedup limit already assumes that a submission spreads like the reference. Pilots that agree by chance
  (or sit on the same eval point) do not shrink the spread below it. It is capped at SIGMA_CAP, far above
  any real spread, so the posterior's tail (infinite mean with 2 pilots) stays finite.
- The verdict is the RCP test's: the pass probability of sets of n converged runs. A failed run makes a
  result invalid, not faster than the reference, so failures are reported on their own: a pilot whose
  run_stop is not a success counts as failed, and the per-run failure rate is drawn from Beta(f + 1/2,
  c + 1/2), the Jeffreys posterior of f failures in f + c pilots, with no prior from public logs (those
  come from other systems, and sets with failures were mostly not published: 12 of 2,417 v4.0 logs
  failed), so two clean pilots cannot tell 0% from 20%.
- Runs to launch follow the MLPerf scoring rules (training_rules.adoc, Scoring): M >= n runs in launch
  order, every window of n consecutive runs scored olympically with a failed run as infinitely slow and a
  window holding more failed runs than a set tolerates as infinite; the median window is submitted, and an
  infinite median makes the whole result invalid. Windows are ranked by samples (epochs) to converge, i.e.
  at equal throughput per run. Each simulation draws one campaign of MAX_LAUNCH * n runs; its first M runs
  are the campaign of M.
Eval points are discrete (a run converges at an eval); the simulation is continuous, so the probabilities
near the limit are approximate to about one eval interval of the mean.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import tempfile
from typing import Any

import numpy as np

from harness import benchmark_rules as rules
from harness.errors import HarnessError
from harness.review import rcp

SIMULATIONS = 20_000
SEED = 0  # fixed: the same pilots give the same numbers on every machine
MAX_LAUNCH = 3  # runs to launch are searched up to this many times n
NOT_CONVERGED = 1e9  # what mlperf-logging's reader returns for a run that did not converge
# Upper bound of a set's log-space sigma: 4x the widest spread of any RCP entry in mlperf-logging 4.1.68
# (unet3d, 0.25) but one whose spread is a single outlier run (gpt3_ref_3072, 1.6, which keeps its own).
# With 2 pilots the sigma posterior has an infinite mean; its far tail would overflow exp().
SIGMA_CAP = 1.0


@dataclasses.dataclass
class Pilot:
    path: str
    value: float | None  # samples (epochs) to converge; None: did not converge


@dataclasses.dataclass
class Preflight:
    benchmark: str
    ruleset: str
    batch: int
    runs: int  # n: logs in a result set, the checker's submission_runs
    pilots: list[Pilot]
    record: str
    rcp_mean: float
    fastest_allowed: float
    rcp_sigma: float  # the RCP's relative spread in log space (the floor)
    pilot_sigma: float  # the converged pilots' sample std of log values
    tolerated: int  # non-converged runs the checker accepts in one set
    failure_rate: float  # posterior mean of the per-run failure rate
    pass_converged: float  # P(an n-run set of converged runs passes the RCP test): the verdict
    norm_expected: float  # mean checker normalization factor over passing converged sets
    normalized_share: float  # share of passing converged sets with a factor above 1
    set_valid: float  # P(an n-run set holds at most `tolerated` failed runs)
    valid: dict[int, float]  # M runs launched -> P(the median window of n is valid), MLPerf scoring rules
    valid_pass: dict[int, float]  # M in shown_launches(n) -> P(valid and the median window passes the RCP test)
    launch: int | None  # smallest M with valid[M] >= confidence (None: no M up to MAX_LAUNCH * n)
    confidence: float
    simulations: int
    reading: rcp.Reading | None = None

    @property
    def pass_all(self) -> float:
        """P(an n-run set, failed runs included, is valid and passes the RCP test)."""
        return self.valid_pass[self.runs]

    @property
    def unit(self) -> str:
        return "samples" if rules.record(self.benchmark).unit == rules.SAMPLE else "epochs"

    @property
    def converged(self) -> list[float]:
        return [p.value for p in self.pilots if p.value is not None]


def read_pilots(paths: list[str], ruleset: str | None) -> tuple[str, rcp.Reading, int, list[Pilot]]:
    """(benchmark, how the logs are read, batch, pilots) from the logs, read by mlperf-logging's RCP reader
    with the checker's options the logs call for; one HarnessError line for fewer than 2 logs, copies of one
    log, mixed benchmarks or batch sizes, or a benchmark/ruleset without RCPs."""
    logs, benchmark, reading, _ = rcp.read_set(paths, ruleset)
    if len(logs) < 2:
        raise HarnessError(f"the RCP preflight needs at least 2 pilot runs' result logs (got {len(logs)}: "
                           f"{logs[0]}); one run shows no spread")
    pilots, batches = [], {}
    for path in logs:
        converged, value, bs, bench = rcp.read_run(path, reading.ruleset, reading.train_samples)
        if bench != benchmark:
            raise HarnessError(f"{path}: a {bench!r} log, but {logs[0]} is {benchmark!r}; pilots must be "
                               "runs of one benchmark")
        if bs == -1:
            raise HarnessError(f"{path}: no global_batch_size line; the RCP depends on the batch size")
        batches.setdefault(bs, path)
        pilots.append(Pilot(path, value if converged else None))
    if len(batches) != 1:
        where = ", ".join(f"{b} ({p})" for b, p in sorted(batches.items()))
        raise HarnessError(f"pilots at different global batch sizes: {where}; run them at the batch to submit")
    return benchmark, reading, next(iter(batches)), pilots


@functools.lru_cache(maxsize=None)
def tolerated_failures(benchmark: str, ruleset: str, runs: int) -> int:
    """How many non-converged logs an n-run set may hold, asked of the checker's `get_submission_epochs`
    on generated logs (it returns no epochs for a set with too many)."""
    from mlperf_logging.rcp_checker import rcp_checker as official

    def log(status: str) -> str:
        def line(key: str, value: Any, **metadata: Any) -> str:
            event = {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": key, "value": value,
                     "metadata": metadata}
            return ":::MLLOG " + json.dumps(event)

        # Both metrics, so that stable_diffusion's reader (FID and CLIP per eval step) finds a passing eval.
        evals = [line("eval_accuracy", v, epoch_num=1, samples_count=1, step_num=1, metric=m)
                 for m, v in (("FID", 1.0), ("CLIP", 1.0))]
        return "\n".join([line("submission_benchmark", benchmark), line("global_batch_size", 1), *evals,
                          line("run_stop", None, status=status)]) + "\n"

    with tempfile.TemporaryDirectory() as tmp, rcp._quiet_logging():
        files = []
        for i in range(runs):
            files.append(os.path.join(tmp, f"result_{i}.txt"))
        tolerated = 0
        for failed in range(1, runs + 1):
            for i, path in enumerate(files):
                with open(path, "w") as f:
                    f.write(log("aborted" if i < failed else "success"))
            _, epochs, _ = official.get_submission_epochs(files, ruleset, False)
            if epochs is None:
                break
            tolerated = failed
    return tolerated


@functools.lru_cache(maxsize=None)
def rcp_checker(benchmark: str, ruleset: str) -> Any:
    """mlperf-logging's RCP_Checker for `benchmark` under `ruleset`, built once per process: its set-up runs a
    binary search per RCP entry, and judging a set changes nothing in it (llama31_405b's speedup is
    rewritten, to the same value, on every call)."""
    from mlperf_logging.rcp_checker import rcp_checker as official

    with rcp._quiet_logging():
        return official.RCP_Checker(rcp.USAGE, ruleset, benchmark, False)


def log_sigma(relative_std: float) -> float:
    """The log-normal sigma whose relative standard deviation is `relative_std`."""
    return math.sqrt(math.log1p(relative_std ** 2))


def shown_launches(runs: int) -> list[int]:
    """The campaign sizes M whose submitted window the checker judges and the output shows (all M up to
    MAX_LAUNCH * n get P(valid result), which needs no checker call)."""
    return sorted({runs, runs + 1, runs + 2, runs + runs // 2, 2 * runs, MAX_LAUNCH * runs})


def window_scores(values: np.ndarray, failed: np.ndarray, runs: int, tolerated: int) -> np.ndarray:
    """Olympic score of every window of `runs` consecutive runs (columns) of each simulated campaign (rows):
    `tolerated` runs dropped at each end (the checker's trim: 1, unet3d 4), a failed run counting as
    infinitely slow. A window with more than `tolerated` failed runs (an invalid result) keeps an inf after
    the trim, so it scores inf, as the rules count it."""
    sims, total = values.shape
    slow = np.where(failed, np.inf, values)
    scores = np.empty((sims, total - runs + 1))
    for start in range(total - runs + 1):
        window = np.sort(slow[:, start:start + runs], axis=1)
        scores[:, start] = window[:, tolerated:runs - tolerated].mean(axis=1)
    return scores


def median_windows(scores: np.ndarray, launched: int, runs: int) -> np.ndarray:
    """Start of the window the MLPerf rules submit from `launched` runs: the median of the launched-order
    windows' scores; for an even count, the slower of the two middle ones (the rules name one median set)."""
    count = launched - runs + 1
    order = np.argsort(scores[:, :count], axis=1, kind="stable")
    return order[:, count // 2]


def simulate(benchmark: str, ruleset: str, batch: int, pilots: list[Pilot], confidence: float = 0.9,
             simulations: int = SIMULATIONS, seed: int = SEED) -> Preflight:
    """The preflight numbers for `pilots` (see the module docstring for the model)."""
    from scipy import stats

    if not 0 < confidence < 1:
        raise HarnessError(f"--confidence {confidence}: give a probability strictly between 0 and 1")
    values = [p.value for p in pilots if p.value is not None]
    failed = len(pilots) - len(values)
    if len(values) < 2:
        raise HarnessError(f"only {len(values)} of {len(pilots)} pilot runs converged; the spread needs at least 2 "
                           "converged pilots")
    checker = rcp_checker(benchmark, ruleset)
    n = int(checker.submission_runs)
    with rcp._quiet_logging():
        name, record = rcp.checker_record(checker, batch)
    if record is None:
        largest = max(r["BS"] for r in checker.pruned_rcp_data.values())
        raise HarnessError(f"global batch {batch} is above the largest {benchmark} RCP batch under ruleset {ruleset} "
                           f"({largest}); the checker asks for a new RCP there, so no pass probability exists")
    tolerated = tolerated_failures(benchmark, ruleset, n)

    rng = np.random.default_rng(seed)
    c = len(values)
    logs = np.log(values)
    mu_hat, s_hat = float(logs.mean()), float(logs.std(ddof=1))
    floor = log_sigma(float(record["RCP Stdev"]) / float(record["RCP Mean"]))
    drawn = np.sqrt((c - 1) * s_hat ** 2 / rng.chisquare(c - 1, simulations))
    sigma = np.clip(drawn, floor, max(SIGMA_CAP, floor))
    mu = rng.normal(mu_hat, sigma / math.sqrt(c))
    most = MAX_LAUNCH * n
    # One campaign of `most` runs in launch order per simulation; its first M runs are the campaign of M.
    runs = np.exp(mu[:, None] + sigma[:, None] * rng.standard_normal((simulations, most)))
    rate = rng.beta(failed + 0.5, c + 0.5, simulations)
    fails = rng.random((simulations, most)) < rate[:, None]

    passed_converged = np.zeros(simulations, bool)
    factors = np.ones(simulations)
    with rcp._quiet_logging():
        for i in range(simulations):
            # The checker sorts the list it gets and, for llama31_405b, rewrites the record's speedup from
            # its own fields (the same value each time): both harmless to repeat. results_dir '' is what
            # check_directory passes when it is not asked to write scaling.json.
            passed_converged[i], factors[i] = checker._eval_submission_record(record, runs[i, :n].tolist(), "")

    scores = window_scores(runs, fails, n, tolerated)
    launched = list(range(n, most + 1))
    rows = np.arange(simulations)
    starts = np.stack([median_windows(scores, m, n) for m in launched], axis=1)  # (simulation, M)
    ok = np.isfinite(scores[rows[:, None], starts])
    valid = {m: float(ok[:, k].mean()) for k, m in enumerate(launched)}
    # The checker judges the submitted windows of the shown M, each distinct window once.
    shown = shown_launches(n)
    starts, ok = starts[:, [m - n for m in shown]], ok[:, [m - n for m in shown]]
    keys = rows[:, None] * scores.shape[1] + starts
    unique = np.unique(keys[ok])
    judged = np.zeros(unique.size, bool)
    with rcp._quiet_logging():
        for j, key in enumerate(unique):
            i, start = divmod(int(key), scores.shape[1])
            window = np.where(fails[i, start:start + n], NOT_CONVERGED, runs[i, start:start + n])
            judged[j] = checker._eval_submission_record(record, window.tolist(), "")[0]
        rcp_mean = float(record["RCP Mean"])
        fastest = rcp_mean / float(record["Max Speedup"])
    passes = np.zeros(keys.shape, bool)
    passes[ok] = judged[np.searchsorted(unique, keys[ok])]
    valid_pass = {m: float(passes[:, k].mean()) for k, m in enumerate(shown)}
    launch = next((m for m in valid if valid[m] >= confidence), None)
    set_valid = float(np.mean(stats.binom.cdf(tolerated, n, rate)))
    good = factors[passed_converged]
    return Preflight(benchmark, ruleset, batch, n, pilots, name, rcp_mean, fastest, floor, s_hat, tolerated,
                     float(rate.mean()), float(passed_converged.mean()),
                     float(good.mean()) if good.size else float("nan"),
                     float((good > 1).mean()) if good.size else 0.0, set_valid, valid, valid_pass, launch,
                     confidence, simulations)


def preflight(paths: list[str], ruleset: str | None = None, confidence: float = 0.9,
              simulations: int = SIMULATIONS, seed: int = SEED) -> Preflight:
    benchmark, reading, batch, pilots = read_pilots(paths, ruleset)
    p = simulate(benchmark, reading.ruleset, batch, pilots, confidence, simulations, seed)
    return dataclasses.replace(p, reading=reading)


def verdict(p: Preflight) -> str:
    """From the RCP test alone (sets of converged runs): LIKELY PASS at or above the confidence, LIKELY FAIL
    below one half, AT RISK between. Failed runs are the failure-risk line's business: they make a result
    invalid, not faster than the reference."""
    if p.pass_converged >= p.confidence:
        return "LIKELY PASS"
    return "LIKELY FAIL" if p.pass_converged < 0.5 else "AT RISK"


def format_preflight(p: Preflight) -> list[str]:
    unit = p.unit

    def num(x: float) -> str:
        return f"{x:,.0f}" if unit == "samples" else f"{x:.2f}"

    conv = p.converged
    n, t = p.runs, p.tolerated
    lines = [f"RCP preflight: {p.benchmark}, ruleset {p.ruleset}, global batch {p.batch}, "
             f"{len(p.pilots)} pilot run(s); a result set is {n} runs",
             f"  RCP {p.record}: mean {num(p.rcp_mean)} {unit} to converge, fastest allowed olympic mean "
             f"{num(p.fastest_allowed)} ({p.fastest_allowed / p.rcp_mean:.3f} x the mean)"]
    if p.reading is not None:
        lines[1:1] = p.reading.lines()
    for pilot in p.pilots:
        if pilot.value is None:
            lines.append(f"  {pilot.path}: did not converge (run_stop not a success); counted as a failed run")
        else:
            lines.append(f"  {pilot.path}: {num(pilot.value)} {unit} ({100 * (pilot.value / p.rcp_mean - 1):+.1f}% "
                         "vs the RCP mean)")
    geo = math.exp(sum(math.log(v) for v in conv) / len(conv))
    lines += [
        f"  fit: log-normal, pilots' geometric mean {num(geo)} {unit} ({geo / p.rcp_mean:.3f} x the RCP mean, "
        f"{100 * (geo / p.fastest_allowed - 1):+.1f}% vs the fastest allowed), "
        f"spread {100 * p.pilot_sigma:.1f}% (log sigma of {len(conv)} converged), floored at the RCP's "
        f"{100 * p.rcp_sigma:.1f}%; mean and spread drawn per set from their posterior",
        f"  RCP test: simulated {p.simulations:,} sets of {n} converged runs (seed {SEED}), each judged by "
        "mlperf_logging's RCP_Checker._eval_submission_record:",
        f"    pass probability: {p.pass_converged:.3f}",
    ]
    if math.isnan(p.norm_expected):
        lines.append("    expected normalization factor: none (no simulated set passed)")
    else:
        lines.append(f"    expected normalization factor (the checker's, over passing sets): {p.norm_expected:.3f}; "
                     f"normalized in {100 * p.normalized_share:.0f}% of them")
    lines += [
        f"  failure risk (not in the verdict): {len(p.pilots) - len(conv)} of {len(p.pilots)} pilots did not "
        f"converge; per-run failure rate ~ Beta(failed + 1/2, converged + 1/2) (the pilots alone, no prior from "
        f"other systems' logs), mean {100 * p.failure_rate:.1f}%",
        f"    P(a set of {n} holds at most {t} failed run(s), the most the checker accepts): {p.set_valid:.3f}; "
        f"valid and passing the RCP test: {p.pass_all:.3f}",
    ]
    shown = shown_launches(n)
    table = ", ".join(f"M={m}: {p.valid[m]:.3f} ({p.valid_pass[m]:.3f})" for m in shown)
    lines += [
        f"  runs to launch (MLPerf scoring: of M >= {n} runs in launch order, the window of {n} consecutive runs "
        f"with the median olympic score is submitted; a window with more than {t} failed run(s) scores "
        "infinite and an infinite median makes the result invalid; windows ranked by "
        f"{unit} to converge, i.e. at equal throughput):",
        f"    P(valid result) (and valid passing the RCP test): {table}",
    ]
    if p.launch is not None:
        lines.append(f"    runs to launch: {p.launch} (the smallest M with P(valid result) >= {p.confidence:g})")
    else:
        best = max(p.valid, key=lambda m: (p.valid[m], -m))
        lines.append(f"    runs to launch: none up to {MAX_LAUNCH * n} reaches P(valid result) >= {p.confidence:g} "
                     f"(best {p.valid[best]:.3f} at M={best}): the failure rate, not the count launched, limits "
                     "it; more pilots narrow the rate")
    lines.append(f"  verdict: {verdict(p)} (RCP pass probability {p.pass_converged:.3f}; LIKELY PASS at >= "
                 f"confidence {p.confidence:g}, LIKELY FAIL below 0.5)")
    return lines


def main(paths: list[str], rulesets: list[str], confidence: float) -> int:
    """`check --rcp --preflight`: exit 1 when a set is likely to fail the RCP test, else 0."""
    if not paths:
        raise HarnessError("check --rcp --preflight takes the pilot runs' result logs or directories")
    if len(rulesets) > 1:
        raise HarnessError("check --rcp --preflight takes at most one --ruleset")
    p = preflight(paths, rulesets[0] if rulesets else None, confidence)
    print("\n".join(format_preflight(p)))
    return 1 if verdict(p) == "LIKELY FAIL" else 0
