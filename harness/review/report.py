"""Review report over MLPerf result logs: per-run table, olympic score, integrity findings, plots.

Input: log files and/or directories (searched recursively). Output in ``out_dir``: ``report.md``
and one convergence PNG per result set. A result set is what MLPerf scores together: the runs
sharing the logged (benchmark, org, platform) and, for logs inside a submission tree
(``.../results/<system>/<benchmark>/result_N.txt``), the same <system> directory, because
different systems can log the same platform string (e.g. Google's v0.7 TF and JAX submissions). Plots use
matplotlib's Agg canvas directly (no pyplot, no display), so this works on headless machines and leaves global
state alone.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.errors import HarnessError
from harness.mlperf import checker_version
from harness.review.integrity import Finding, check_integrity, check_seeds, check_status
from harness import benchmark_rules as rules
from harness.review.logparse import BadLine, LogEvent, RunSummary, parse_log, summarize
from harness.review.scoring import OlympicScore, olympic_score

LOG_SUFFIXES = (".txt", ".log")


@dataclass
class Run:
    summary: RunSummary
    events: list[LogEvent]
    findings: list[Finding]


@dataclass
class ResultSet:
    key: tuple[str, str, str, str]  # (benchmark, org, platform, system dir or ''); 'unknown' if not logged
    runs: list[Run]
    score: OlympicScore | None = None
    seed_findings: list[Finding] = field(default_factory=list)
    plot_path: str | None = None

    @property
    def label(self) -> str:
        text = " / ".join(self.key[:3])
        return f"{text} [{self.key[3]}]" if self.key[3] else text


def _has_mllog(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return any(":::MLLOG" in line for line in f)
    except OSError:
        return False


def find_logs(inputs: list[str]) -> list[str]:
    """Expand inputs to log files. Directories: result_*.txt and *.txt/*.log holding MLLOG lines.

    Explicit files are kept as given (parse_log reports what is wrong with them); a path that does
    not exist is a HarnessError, since it is most likely a typo.
    """
    found: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            for root, dirs, files in os.walk(item):
                dirs.sort()
                for name in sorted(files):
                    p = os.path.join(root, name)
                    # incomplete_result_*.log: a run that died; the harness keeps it for people, not scores.
                    if (name.endswith(LOG_SUFFIXES) and not name.startswith("incomplete_result_")
                            and _has_mllog(p)):
                        found.append(p)
        elif os.path.exists(item):
            found.append(item)
        else:
            raise HarnessError(f"input {item} does not exist")
    seen: set[str] = set()
    return [p for p in found if not (os.path.realpath(p) in seen or seen.add(os.path.realpath(p)))]


def plot_convergence(summaries: list[RunSummary], target: float | None, title: str,
                     labels: list[str] | None = None, benchmark: str | None = None) -> Figure:
    """Accuracy vs eval position (left) and vs minutes since run_start (right), one line per run.

    Minutes are measured from max(run_start, init_stop): the timed region cannot legally begin
    before init_stop, and a run_start logged earlier (see integrity) would squash every other run;
    such runs are marked with '*' in the legend. The target is a dashed horizontal line.
    """
    fig = Figure(figsize=(13, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax_pos, ax_time = fig.subplots(1, 2)
    labels = labels or [os.path.basename(s.path) for s in summaries]
    axis_name = summaries[0].eval_axis if summaries else "epoch_num"
    benchmark = benchmark or next((s.benchmark for s in summaries if s.benchmark), None)
    metric = rules.metric(benchmark)
    # A benchmark the record counts in samples logs samples as epoch_num too (the checkers read it so).
    samples = axis_name == "samples_count" or (rules.get(benchmark) is not None and rules.unit(benchmark) == "samples")
    position = "samples" if samples else "epoch"
    starred = False
    for s, label in zip(summaries, labels):
        if not s.evals:
            continue
        if s.status != "success":
            label += f" ({s.status or 'no run_stop'})"
        xs = [e[0] for e in s.evals]
        ys = [e[1] for e in s.evals]
        t0 = s.run_start_ms
        if t0 is not None and s.init_stop_ms is not None and s.init_stop_ms > t0:
            t0, label, starred = s.init_stop_ms, label + " *", True
        if t0 is None:
            t0 = s.evals[0][2]
        minutes = [(e[2] - t0) / 60000.0 for e in s.evals]
        (line,) = ax_pos.plot(xs, ys, marker="o", markersize=3, label=label)
        ax_time.plot(minutes, ys, marker="o", markersize=3, color=line.get_color(), label=label)
    for ax in (ax_pos, ax_time):
        if target is not None:
            ax.axhline(target, linestyle="--", color="black", linewidth=1.2,
                       label=f"target {rules.relation(benchmark)} {target:g}")
        ax.set_ylabel(metric + (" (lower is better)" if rules.relation(benchmark) == "<=" else ""))
        ax.grid(True, alpha=0.3)
    if ax_time.get_legend_handles_labels()[0]:  # one legend, beside the plots: it never covers a curve
        ax_time.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax_pos.set_xlabel(position)
    ax_time.set_xlabel("minutes since run_start" + ("  (* = since init_stop: run_start logged before it)"
                                                     if starred else ""))
    ax_pos.set_title(f"{metric} vs {position}")
    ax_time.set_title(f"{metric} vs time")
    fig.suptitle(title)
    return fig


def _fmt(v: float | int | None, spec: str = ".3f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, spec) if isinstance(v, float) else str(v)


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "unknown"


def _display_paths(paths: list[str]) -> dict[str, str]:
    """Paths relative to their common directory: short but unambiguous in tables."""
    if not paths:
        return {}
    base = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in paths])
    return {p: os.path.relpath(os.path.abspath(p), base) for p in paths}


def _load(paths: list[str], targets: dict[str, float] | None) -> tuple[list[Run], list[str]]:
    runs: list[Run] = []
    skipped: list[str] = []
    for p in paths:
        bad: list[BadLine] = []
        try:
            events = parse_log(p, bad)
        except HarnessError as e:
            skipped.append(str(e))
            continue
        summary = summarize(events, p, targets)
        # The status is judged by a closed target, or by the caller's; an open run sets its own, which its log
        # states as target_accuracy: drawn and judged against that, not the closed one.
        given = bool(targets) and summary.benchmark in targets
        own = open_target(events) if summary.division == "open" and not given else None
        if own is not None:
            summary.target, summary.ruleset = own, None
        status = check_status(events, summary.target if given or summary.division != "open" else None)
        runs.append(Run(summary, events, check_integrity(events, bad_lines=bad) + status))
    return runs, skipped


def open_target(events: list[LogEvent]) -> float | None:
    """An open-division log's own quality target (its target_accuracy), or None."""
    value = next((e.value for e in events if e.key == "target_accuracy"), None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _synthetic(run: Run) -> bool:
    return any(e.key == "harness_data_source" and e.value == "synthetic" for e in run.events)


def _submission_system(path: str) -> str:
    """<system> of a submission-tree path .../results/<system>/<benchmark>/<file>, else ''."""
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    return parts[-3] if len(parts) >= 4 and parts[-4] == "results" else ""


def _group(runs: list[Run]) -> list[ResultSet]:
    groups: dict[tuple[str, str, str, str], list[Run]] = defaultdict(list)
    for r in runs:
        s = r.summary
        key = (s.benchmark or "unknown", s.org or "unknown", s.platform or "unknown", _submission_system(s.path))
        groups[key].append(r)
    return [ResultSet(k, v) for k, v in sorted(groups.items())]


def _run_table(rs: ResultSet, names: dict[str, str]) -> list[str]:
    axis = rs.runs[0].summary.eval_axis if rs.runs else "epoch_num"
    unit = rules.unit(rs.key[0]) if rules.get(rs.key[0]) else "samples" if axis == "samples_count" else "epochs"
    metric = rules.metric(rs.key[0])
    lines = [
        f"| file | seed | status | time to train (min) | {unit} to converge | last {metric} | init (s) "
        "| train (s) | eval (s) | throughput (samples/s) | findings |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rs.runs:
        s = r.summary
        errors = sum(f.severity == "error" for f in r.findings)
        warnings = len(r.findings) - errors
        lines.append(
            f"| {names[s.path]} | {_fmt(s.seed)} | {s.status or '-'} | {_fmt(s.time_to_train_min)} "
            f"| {_fmt(s.epochs_or_samples_to_converge, 'g')} | {_fmt(s.last_accuracy, '.4f')} "
            f"| {_fmt(s.init_time_s, '.1f')} | {_fmt(s.train_time_s, '.1f')} | {_fmt(s.eval_time_s, '.1f')} "
            f"| {_fmt(s.throughput, '.1f')} | {errors} error(s), {warnings} warning(s) |")
    return lines


def _score_lines(score: OlympicScore, names: dict[str, str]) -> list[str]:
    if score.score_min is None:
        lines = [f"**Olympic score: none** ({score.reason})"]
    else:
        used = ", ".join(f"{names[u.path]} ({_fmt(u.minutes)})" for u in score.used)
        lines = [f"**Olympic score: {score.score_min:.3f} min** (mean of {len(score.used)} runs: {used})"]
    for run, why in score.dropped:
        lines.append(f"- dropped {names[run.path]} ({_fmt(run.minutes)} min): {why}")
    if score.note:
        lines.append(f"- note: {score.note}")
    return lines


def _set_target(rs: ResultSet) -> float | None:
    """The result set's target: its first run's (runs of one set share a benchmark and, normally, a ruleset)."""
    return next((r.summary.target for r in rs.runs if r.summary.target is not None), None)


def _target_line(rs: ResultSet) -> str:
    """The set's metric, direction, target and where the target comes from, and its division."""
    target = _set_target(rs)
    metric, unit = rules.metric(rs.key[0]), rules.unit(rs.key[0])
    if target is None:
        return f"Quality target: unknown ({metric}; positions in {unit})"
    first = next(r.summary for r in rs.runs if r.summary.target is not None)
    where = (f"closed, ruleset {first.ruleset}" if first.ruleset else
             f"{first.division or 'open'} division: the run's own target_accuracy")
    return (f"Quality target: {metric} {rules.relation(first.benchmark)} {target:g} ({where}); positions in "
            f"{unit}")


def _set_flags(rs: ResultSet) -> list[str]:
    """What makes the set no MLPerf result however it scores: synthetic data, too few runs."""
    flags = []
    synthetic = [r for r in rs.runs if _synthetic(r)]
    if synthetic:
        flags.append(f"**SYNTHETIC DATA**: {len(synthetic)} of {len(rs.runs)} run(s) trained on synthetic data; "
                     f"not an MLPerf result")
    required = rules.runs_required(rs.key[0])
    if required is not None and len(rs.runs) < required:
        flags.append(f"**INCOMPLETE SET**: {len(rs.runs)} run(s); {rs.key[0]} needs {required} for a result")
    return flags


def write_report(inputs: list[str], out_dir: str, targets: dict | None = None, quiet: bool = False) -> str:
    """Write report.md (+ PNGs) for the logs under ``inputs``; returns the report path.

    Each log's quality target is its benchmark's closed target under the log's ruleset (the run's
    summary.json / config.yaml beside it, else the benchmark's newest); ``targets`` overrides it per
    benchmark (e.g. {'bert': 0.712}). Raises HarnessError when no input yields a readable MLPerf log.
    """
    paths = find_logs(inputs)
    runs, skipped = _load(paths, targets)
    if not runs:
        detail = f" ({skipped[0]})" if skipped else ""
        raise HarnessError(f"no readable MLPerf result logs in {', '.join(inputs) or 'no inputs'}{detail}")
    names = _display_paths([r.summary.path for r in runs])
    os.makedirs(out_dir, exist_ok=True)
    sets = _group(runs)
    for rs in sets:
        rs.score = olympic_score([r.summary for r in rs.runs], None if rs.key[0] == "unknown" else rs.key[0])
        rs.seed_findings = check_seeds([r.summary for r in rs.runs])
        for f in rs.seed_findings:
            for p, n in names.items():
                f.message = f.message.replace(p, n)
        target = _set_target(rs)
        fig = plot_convergence([r.summary for r in rs.runs], target, f"{rs.label} convergence",
                               [names[r.summary.path] for r in rs.runs],
                               None if rs.key[0] == "unknown" else rs.key[0])
        rs.plot_path = os.path.join(out_dir, f"convergence_{_safe_name('_'.join(k for k in rs.key if k))}.png")
        fig.savefig(rs.plot_path, dpi=110)

    md = ["# MLPerf result review", ""]
    md.append(f"{len(runs)} log(s) read" + (f", {len(skipped)} skipped" if skipped else "") + ".")
    md.append("Time to train = run_start -> run_stop. Train / eval time = sums of block_start->block_stop "
              "and eval_start->eval_stop intervals (they overlap when evals run asynchronously). "
              "Throughput = training samples in logged blocks / time inside blocks (see harness/review/logparse.py). "
              "Findings come from harness/review/integrity.py: checks the official compliance checker does not make.")
    md.append(f"Official checker installed: mlperf-logging {checker_version()} (verdicts depend on its version).")
    md.append("")
    for rs in sets:
        md += [f"## {rs.label}", ""]
        md.append(_target_line(rs))
        md.append("")
        for flag in _set_flags(rs):
            md += [flag, ""]
        md += _run_table(rs, names)
        md.append("")
        md += _score_lines(rs.score, names)
        md.append("")
        md.append("### Integrity findings")
        md.append("")
        any_finding = False
        for r in rs.runs:
            for f in r.findings:
                any_finding = True
                md.append(f"- **{f.severity}** `{f.code}` {names[r.summary.path]}: {f.message}")
        for f in rs.seed_findings:
            any_finding = True
            md.append(f"- **{f.severity}** `{f.code}` {f.message}")
        if not any_finding:
            md.append("None.")
        md.append("")
        md.append(f"![convergence]({os.path.basename(rs.plot_path)})")
        md.append("")
    if skipped:
        md += ["## Skipped inputs", ""] + [f"- {s}" for s in skipped] + [""]
    report_path = os.path.join(out_dir, "report.md")
    with open(report_path, "w", encoding="utf-8") as f:
        f.write("\n".join(md))

    if not quiet:
        print(f"MLPerf review: {len(runs)} log(s) -> {report_path}")
        for rs in sets:
            score = rs.score
            text = f"{score.score_min:.3f} min" if score.score_min is not None else f"none ({score.reason})"
            errors = sum(f.severity == "error" for r in rs.runs for f in r.findings) + \
                sum(f.severity == "error" for f in rs.seed_findings)
            flags = "".join(f"; {f.split(':', 1)[0].strip('*')}" for f in _set_flags(rs))
            print(f"  {rs.label}: {len(rs.runs)} run(s), olympic score {text}, {errors} integrity error(s){flags}")
    return report_path


def main(argv_inputs: list[str], out_dir: str) -> int:
    """CLI entry: 0 once the report is written (findings do not fail it).

    No readable log raises HarnessError, which the CLI turns into one line and exit code 2.
    """
    write_report(list(argv_inputs), out_dir)
    return 0


if __name__ == "__main__":  # python -m harness.review.report OUT_DIR INPUT...
    if len(sys.argv) < 3:
        print("usage: python -m harness.review.report OUT_DIR INPUT...", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(main(sys.argv[2:], sys.argv[1]))
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
