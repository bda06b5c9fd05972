"""llama31_8b and gpt_oss_20b give the pinned loss, eval sums and gradients (tests/data/decoder_golden.json,
written by tests/helpers/decoder_golden.py): their variables keep their names (initialization and
checkpoints are keyed by them) and a change of the shared decoder code leaves every number as it was.

Tolerances sit above the round-off of oneDNN's kernels on against off (gradient norms 2e-7 relative, leading
values 1e-7 of their variable's gradient norm) and far below what a changed op or initializer moves."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import decoder_golden

pytestmark = pytest.mark.quick

with open(decoder_golden.GOLDEN) as f:
    GOLDEN = json.load(f)


def test_every_case_is_pinned():
    assert sorted(GOLDEN) == sorted(decoder_golden.CASES)


@pytest.mark.parametrize("name", sorted(decoder_golden.CASES))
def test_loss_and_gradients_are_unchanged(name):
    want, got = GOLDEN[name], decoder_golden.compute(name)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)
    assert sorted(got["terms"]) == sorted(want["terms"]) and sorted(got["eval"]) == sorted(want["eval"])
    for key, (total, count) in want["terms"].items():
        np.testing.assert_allclose(got["terms"][key], [total, count], rtol=1e-6, err_msg=key)
    for key, value in want["eval"].items():
        np.testing.assert_allclose(got["eval"][key], value, rtol=1e-6, err_msg=key)
    assert sorted(got["grad_norms"]) == sorted(want["grad_norms"])   # the same variables, by name
    for path, norm in want["grad_norms"].items():
        assert norm > 0, path
        np.testing.assert_allclose(got["grad_norms"][path], norm, rtol=1e-6, err_msg=path)
        np.testing.assert_allclose(got["grad_values"][path], want["grad_values"][path], rtol=1e-6,
                                   atol=1e-6 * norm, err_msg=path)
