"""`mlperf-harness run CONFIG --dry_run`: compile a config's steps under XLA before hardware is booked.

`compile_report` compiles one replica of the config at full size (`compile.py`), or, for a model too big for
this host, at smaller sizes whose numbers are extrapolated (`extrapolate.py`); `main` prints the report and
refuses a config whose state does not fit the device it names (`memory.py`). The command line hands
`compile_report` to `plan --compile` too.

Numbers come from XLA itself (`xla.py`): the HLO module TensorFlow hands to XLA and the optimized module's
buffer assignment. No data set, checkpoint or MLPerf log is touched.
"""
from __future__ import annotations

import json

from harness import config as config_lib
from harness.dryrun.compile import compile_replica
from harness.dryrun.extrapolate import linear_stand_in, micro_batched_stand_in
from harness.dryrun.memory import check_device_memory, floor_activations, kept_activations, too_big_for_host
from harness.dryrun.report import CompileReport, stage, stages_on
from harness.dryrun.standin import standin_checked


def compile_report(config_path: str, overrides: list[str], optimize: bool = True,
                   stand_in: bool = True, full: config_lib.Config | None = None) -> CompileReport:
    """Builds the full-size model of `config_path` on a stand-in replica and compiles its steps
    (`optimize=False`: trace and count only, no XLA HLO passes, so no peak memory; for quick checks). A model
    too big for this host is compiled smaller and extrapolated (`linear_stand_in`) where its workload allows;
    `full`: the config such a smaller compile stands in for (`Workload.stand_in_for`)."""
    cfg = config_lib.load_config(config_path, overrides)
    sizes = getattr(cfg.workload_class, "DRY_RUN_LINEAR", None)
    # The pre-log checks run on the config as given, also when the model is compiled at smaller sizes below:
    # a size that does not split over the layout is refused here as `run` would refuse it.
    checked = standin_checked(cfg)
    if stand_in and sizes and too_big_for_host(cfg):
        stage(f"{cfg.workload} is too big to build here: compiling smaller stand-ins and extrapolating")
        pairs = getattr(cfg.workload_class, "DRY_RUN_PAIRS", ())
        if cfg.schedule.gradient_accumulation_steps > 2:
            report = micro_batched_stand_in(config_path, overrides, optimize, cfg, sizes, pairs)
        else:
            report = linear_stand_in(config_path, overrides, optimize, cfg, sizes, pairs)
        report.stand_in += checked[0].workload.dry_run_notes()
        return floor_activations(report, kept_activations(cfg, report))
    return compile_replica(config_path, cfg, optimize, full, checked)


def main(config_path: str, overrides: list[str], json_path: str | None = None) -> int:
    """`run CONFIG --dry_run`: prints the report (and writes it as JSON); 0, or HarnessError -> 2."""
    stages_on()
    report = compile_report(config_path, overrides)
    for line in report.lines():
        print(line)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
        print(f"json: {json_path}")
    cfg = config_lib.load_config(config_path, overrides)
    check_device_memory(report, cfg.submission.platform, kept_activations(cfg, report))
    return 0
