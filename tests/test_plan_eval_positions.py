"""`plan` counts the evals the run makes: for every workload and every shipped config, the eval positions of
the workload's declared cost (`COST.eval_positions`, TensorFlow-free) are the run's `eval_schedule`. No model is
built: the workload is made on the default runtime (whatever the config's) and asked for its schedule only."""
from __future__ import annotations

import glob
import math
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.quick

CONFIGS = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "configs", "*", "*.yaml")))
SHOWN = 12  # schedule points compared from the start (the whole schedule can hold 100,000 of them)


def overrides(cfg) -> list[str]:
    """Sizes a shipped config leaves to data files this machine lacks (0 = counted from the files), and the
    batch-norm span left to the default runtime's one replica: neither moves an eval."""
    out = ["data.train_samples=1000000"] if getattr(cfg.data, "train_samples", None) == 0 else []
    return out + (["model.bn_span=0"] if getattr(cfg.model, "bn_span", 0) else [])


def default_runtime():
    from harness.config import RuntimeConfig
    from harness.runtime import make_runtime

    return make_runtime(RuntimeConfig())


def schedule_and_positions(path: str) -> tuple[list, list, list]:
    """(the run's eval positions, plan's through the last of the first SHOWN, plan's through the budget), plan's
    as the run logs them: a sample count rounded up to the step boundary the eval follows."""
    from benchmarks import registry
    from harness import config as config_lib

    cfg = config_lib.load_config(os.path.join(REPO, path), [])
    cfg = config_lib.load_config(os.path.join(REPO, path), overrides(cfg))
    schedule = registry.get(cfg.workload)(cfg, default_runtime()).eval_schedule()
    run = [p.epoch_num for p in schedule.points]
    cost = registry.cost_model(cfg.workload)
    gbs = cfg.schedule.global_batch_size

    def logged(positions: list) -> list:
        if schedule.unit == "epoch":
            return positions
        return sorted({math.ceil(p / gbs - 1e-9) * gbs for p in positions})

    head = run[:SHOWN]
    return run, logged(cost.eval_positions(cfg, head[-1], gbs)), logged(cost.eval_positions(cfg, run[-1], gbs))


@pytest.mark.parametrize("path", CONFIGS)
def test_plan_counts_the_evals_the_run_makes(path):
    run, head, whole = schedule_and_positions(path)
    shown = run[:SHOWN]
    assert [p for p in head if p <= shown[-1] + 1e-9] == shown, (head, shown)
    # the budget ends the run at an eval of its own where it is off the cadence; plan stops at the cadence's
    through = [p for p in whole if p <= run[-1] + 1e-9]
    assert through in (run, run[:-1]) and whole[-1] >= run[-1] - 1e-9, (whole[-3:], run[-3:])


def test_the_deepseek_reference_plan_starts_after_the_rules_first_eval():
    """6.1.0's first eval follows step 42 + 24576 // gbs (43 at 16384): plan counts no eval before it."""
    run, head, _ = schedule_and_positions("configs/deepseekv3_671b/reference.yaml")
    assert run[0] == head[0] == 43 * 16384 and head[1] - head[0] == 16384


def test_the_cost_side_imports_no_tensorflow():
    """plan's facts (every workload's COST) load without TensorFlow."""
    code = ("import sys\nfrom benchmarks import registry\n"
            "for name in registry.names():\n    assert registry.cost_model(name) is not None, name\n"
            "import harness.plan.planner\n"
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr[-2000:]
