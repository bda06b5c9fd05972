"""The suite's wall time on N pytest-xdist workers, projected from per-test durations: `make test`'s
`--dist loadfile` scheduling as tests/conftest.py shapes it (its work units: files, SHARED_WORKER groups,
EACH_TEST_A_UNIT tests and `<unit>~` ids; LONGEST_FIRST units first), replayed with each test's measured
seconds. On a shared machine the wall time of a run says little; the per-test seconds of `--durations=0` and
this replay say where the critical path is and what a split would give.

    pytest -q -p no:xdist --durations=0 tests/test_a.py tests/test_b.py > durations.txt
    python scripts/suite_schedule.py durations.txt [more.txt ...] [--workers 2] [--units] [--whole_files]
    SUITE_CPU_LOG=cpu.jsonl make test; python scripts/suite_schedule.py --cpu cpu.jsonl [--units]

A test's seconds are its setup + call + teardown lines (a module fixture's cost is in the setup of the first
test that uses it). Tests are replayed in the order of the files given, within a file in the order listed
there (pytest's --durations output is sorted by time, so the order inside a unit is approximate; the units'
order and sizes, which decide the critical path, are not). Prints each worker's busy seconds, the projected
wall time (the last worker's end) and, with --units, every unit's seconds.

With --cpu, the input is tests/conftest.py's per-test CPU log instead, and a test's seconds are the CPU seconds
of its pytest process and of the subprocesses it reaped: what it costs, however busy the machine was. Their sum
over the cores is the least wall time the suite can take on that many cores.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

import conftest  # noqa: E402

LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")


def duration_line(line: str) -> tuple[str, float] | None:
    """(nodeid, seconds) of a `--durations=0` line (setup, call or teardown), else None."""
    m = LINE.match(line)
    return (m.group(3), float(m.group(1))) if m else None


def cpu_line(line: str) -> tuple[str, float]:
    """(nodeid, CPU seconds: the pytest process's and its reaped subprocesses') of a SUITE_CPU_LOG line."""
    r = json.loads(line)
    return r["test"], r["cpu"] + r["children"]


def read_seconds(paths: list[str], parse=duration_line) -> dict[str, float]:
    """nodeid -> its lines' seconds summed (setup + call + teardown), in first-seen order."""
    seconds: dict[str, float] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                got = parse(line)
                if got:
                    seconds[got[0]] = seconds.get(got[0], 0.0) + got[1]
    return seconds


def whole_file(nodeid: str) -> str:
    """The work unit of plain `--dist loadfile`, with conftest's SHARED_WORKER groups: the file."""
    name = os.path.basename(nodeid.split("::", 1)[0])
    return conftest.SHARED_WORKER.get(name, name)


def units(seconds: dict[str, float], scope=conftest._scope) -> "collections.OrderedDict[str, list[float]]":
    """Work unit -> its tests' seconds, the units in the order the workers take them (LONGEST_FIRST first)."""
    by_unit: dict[str, list[float]] = {}
    for nodeid, s in seconds.items():
        by_unit.setdefault(scope(nodeid), []).append(s)
    order = sorted(by_unit, key=conftest.unit_rank)
    return collections.OrderedDict((u, by_unit[u]) for u in order)


def replay(queue: "collections.OrderedDict[str, list[float]]", workers: int) -> list[float]:
    """xdist's LoadScopeScheduling: each worker takes a unit at the start, and another whenever it has at most
    2 tests left (at the start too); it runs its tests in order. Returns each worker's end."""
    queue = collections.OrderedDict(queue)
    pending: list[list[float]] = [[] for _ in range(workers)]
    now = [0.0] * workers
    for w in range(workers):
        if queue:
            pending[w] += queue.popitem(last=False)[1]
    for w in range(workers):
        if queue and len(pending[w]) <= 2:
            pending[w] += queue.popitem(last=False)[1]
    while any(pending):
        w = min((i for i in range(workers) if pending[i]), key=lambda i: now[i])
        now[w] += pending[w].pop(0)
        if len(pending[w]) <= 2 and queue:
            pending[w] += queue.popitem(last=False)[1]
    return now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("durations", nargs="+", help="pytest --durations=0 outputs (with --cpu: SUITE_CPU_LOG files)")
    parser.add_argument("--cpu", action="store_true", help="the inputs are per-test CPU logs (tests/conftest.py)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--units", action="store_true", help="print every work unit's seconds")
    parser.add_argument("--whole_files", action="store_true",
                        help="one unit per file (SHARED_WORKER groups kept): the scheduling before the splits")
    args = parser.parse_args()
    seconds = read_seconds(args.durations, cpu_line if args.cpu else duration_line)
    if not seconds:
        sys.exit("error: no duration lines found (run pytest with --durations=0)")
    queue = units(seconds, whole_file if args.whole_files else conftest._scope)
    if args.units:
        for unit, tests in sorted(queue.items(), key=lambda kv: -sum(kv[1])):
            print(f"{sum(tests):9.1f} s  {len(tests):4d} tests  {unit}")
    ends = replay(queue, args.workers)
    total = sum(seconds.values())
    print(f"{len(seconds)} tests, {len(queue)} work units, {total:.0f} s serial; on {args.workers} workers: "
          + ", ".join(f"{e:.0f} s" for e in ends) + f"; projected wall {max(ends):.0f} s "
          f"(the longest unit {max(sum(t) for t in queue.values()):.0f} s)")
    if args.cpu:
        print(f"{total:.0f} CPU seconds: at least {total / args.workers:.0f} s of wall time on {args.workers} cores")


if __name__ == "__main__":
    main()
