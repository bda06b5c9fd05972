"""The workload contract, for every registered workload: two train steps and one eval on one device and
on 2 logical CPUs (mirrored) give finite, equal losses (so the loop's gradient reduction is right for
this workload) and count every eval example exactly once on an eval set that does not divide the batch;
and flux1's random draws on a DTensor mesh (per replica, a rerun, one device).

The selected workloads run in one subprocess per oneDNN mode (logical devices must be configured before
TensorFlow starts), shared with tests/test_xla_precision.py through tests/step_cases.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks import registry
from step_cases import ONEDNN_OFF, SMALL, step_case, step_case_onednn_off

# Measured on an AVX-512 CPU: two steps' losses and the evals agree to the last bit or within 1 ulp.
ONEDNN_LOSS_RTOL = 1e-4
ONEDNN_EVAL_ABS = 1e-3


def test_every_registered_workload_has_a_contract_case():
    assert sorted(SMALL) == registry.names()
    assert set(ONEDNN_OFF) <= set(SMALL)


@pytest.mark.step_cases(onednn=("1",))
@pytest.mark.parametrize("name", registry.names())
def test_one_train_step_and_eval_on_one_and_two_replicas(name):
    out = step_case(name)
    one, two = out["one"], out["two"]
    assert (one["replicas"], two["replicas"]) == (1, 2)
    assert np.all(np.isfinite(one["losses"])) and np.isfinite(one["score"])
    assert one["counted"] == two["counted"] == one["eval_samples"] == 45
    # The second loss follows one update: equal only if the replicas' gradients were combined right.
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    assert two["score"] == pytest.approx(one["score"], abs=1e-6)


@pytest.mark.step_cases(onednn=("1", "0"))
@pytest.mark.parametrize("name", ONEDNN_OFF)
def test_steps_agree_with_onednn_kernels_on_and_off(name):
    """oneDNN on (step_case forces it) and off (TensorFlow's default kernels): both run the train and eval
    steps of the workloads that hold every kind of op oneDNN replaces (step_cases.ONEDNN_OFF says which and
    why), to the same losses within float32 reduction-order differences."""
    on, off = step_case(name), step_case_onednn_off(name)
    assert (on["onednn"], off["onednn"]) == (True, False)
    assert np.all(np.isfinite(off["plain_losses"])) and np.isfinite(off["plain_eval"])
    np.testing.assert_allclose(off["plain_losses"], on["plain_losses"], rtol=ONEDNN_LOSS_RTOL)
    assert off["plain_eval"] == pytest.approx(on["plain_eval"], abs=ONEDNN_EVAL_ABS)


@pytest.mark.step_cases(onednn=("1",), name="flux1")
def test_flux1_draws_differ_per_mesh_replica_and_equal_a_rerun_and_one_device():
    """flux1's noise, VAE sample and t per sample on a DTensor mesh of 2 data-parallel devices (the step case's
    process; tests/helpers/flux1_mesh_draws.py): the replicas draw different numbers (their samples' global
    positions differ), a rerun from a fresh pipeline draws the same, and one device draws them too."""
    d = step_case("flux1")["mesh_draws"]
    assert len(d["mesh"]) == len(d["one"]) == 2                            # two steps
    for step, (mesh, rerun, one) in enumerate(zip(d["mesh"], d["mesh_rerun"], d["one"])):
        assert len(mesh) == 2 and len(one) == 1
        assert mesh[0]["slot"] == [0, 1, 2, 3] and mesh[1]["slot"] == [4, 5, 6, 7] == one[0]["slot"][4:]
        assert mesh == rerun
        for key in ("noise", "vae", "t"):
            first, second = np.array(mesh[0][key]), np.array(mesh[1][key])
            assert not np.array_equal(first, second), (step, key)
            if key != "t":                                                  # t: bfloat16, ties possible
                assert not np.any(first == second), (step, key)              # no normal repeated
            np.testing.assert_array_equal(np.concatenate([first, second]), one[0][key], err_msg=key)
    assert not np.any(np.array(d["mesh"][0][0]["noise"]) == np.array(d["mesh"][1][0]["noise"]))   # per step
