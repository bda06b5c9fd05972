"""Progress lines: the share of the run's budget on every line, the time to the next eval on eval lines."""
from __future__ import annotations

import pytest

from harness.train.progress import Progress

pytestmark = pytest.mark.quick


def test_lines_carry_the_share_of_the_budget_and_the_eta_to_the_next_eval(capsys):
    p = Progress(True, unit="sample", metric="log perplexity", target=0.99, relation="<=",
                 eval_steps=(8, 16, 32), global_batch=4)
    p.train(8, 32, 2.0, 0.1, 8.0, 2.0, print_line=True)
    p.eval(8, 32, 1.5, 8.0, {"log perplexity": 1.2}, 5.0)
    p.eval(32, 128, 0.9, 8.0, {"log perplexity": 0.95}, 20.0)
    train, first, last = capsys.readouterr().out.splitlines()
    assert "sample         32 ( 25% of budget) | loss" in train and "next eval in     2.0 s" in train
    # the budget is the last eval point (step 32); the next eval is 8 steps of 4 samples at 8 samples/s away
    assert first.startswith("sample       32 ( 25% of budget) |") and first.endswith("| next eval in ~4.0 s")
    assert "(100% of budget)" in last and "next eval" not in last
    assert "eval log perplexity 0.9500 (target <= 0.99)" in last


def test_without_a_schedule_lines_are_as_before(capsys):
    Progress(True).eval(1, 1, 1.0, 2.0, {"accuracy": 0.5}, 3.0)
    line = capsys.readouterr().out
    assert "budget" not in line and "next eval" not in line
