"""The DTensor mesh runtime: a 2x2 mesh of logical CPUs trains the smoke BERT (cut to one layer) like one
device does, with every model-sharded weight split M ways; ResNet runs on the mesh data parallel.

Logical CPU devices must be configured before TensorFlow starts, so each case runs in a subprocess.
"""
from __future__ import annotations

import os

import numpy as np

from conftest import REPO, TINY_RESNET, cli_in_process, read_summary, run_cli, script_result, sets, stderr_error_lines

SMOKE = os.path.join(REPO, "configs", "bert", "smoke.yaml")
SMOKE_MESH = os.path.join(REPO, "configs", "bert", "smoke-mesh.yaml")
STEPS = 8
LOSS_RTOL = 1e-4  # float32 reductions are ordered differently on 4 devices; nothing else may differ


def test_mesh_matches_single_device_and_shards_weights_1_over_m():
    out = script_result(f"""
        import json
        import tensorflow as tf
        from harness import config as C
        from harness.train import loop
        from harness.runtime import make_runtime
        from benchmarks.bert.workload import BertWorkload

        def train(path):
            # One layer, 64 wide: the split is what is compared, not the depth (half the tracing).
            cfg = C.load_config(path, ["data.train_samples=4096", "data.eval_samples=100", "model.num_layers=1",
                                       "model.hidden_size=64", "model.ff_size=256"])
            rt = make_runtime(cfg.runtime)
            wl = BertWorkload(cfg, rt)
            wl.validate()
            wl.build()
            steps = loop.CompiledSteps(rt, wl)
            train_data = loop.train_input(rt, wl, 64, cfg.seed)
            it = iter(train_data)
            losses = [float(steps.train_loop(it, tf.constant(1))["loss"]) for _ in range({STEPS})]
            eval_data = loop.eval_input(rt, wl, 64, cfg.seed)
            metrics, counted = loop.evaluate(steps, eval_data, 2)
            autotune = ([d.options().autotune.enabled for d in (train_data, eval_data)]
                        if cfg.runtime.kind == "mesh" else None)
            return rt, losses, dict(counted=counted, accuracy=metrics[wl.METRIC], autotune=autotune)

        mesh, mesh_losses, mesh_totals = train({SMOKE_MESH!r})
        shards = {{v.path: [list(v.variable.shape), [list(s) for s in mesh.local_shapes(v.variable)], list(v.dims)]
                  for v in mesh.variables()}}
        _, single_losses, single_totals = train({SMOKE!r})

        # layers.take on the same mesh: rank 5 split over `data` on axis 1 and over `model` on axis 3, the
        # layouts where DTensor reads wrong shards for the short forms t[i] and t[:, i] (harness/nn/layers.py)
        import numpy as np
        from tensorflow.experimental import dtensor
        from harness.nn.layers import take
        x = np.arange(3 * 4 * 2 * 6 * 2, dtype=np.float32).reshape(3, 4, 2, 6, 2)
        split = dtensor.Layout([dtensor.UNSHARDED, "data", dtensor.UNSHARDED, "model", dtensor.UNSHARDED], mesh.mesh)
        whole = lambda t: dtensor.relayout(t, dtensor.Layout.replicated(mesh.mesh, t.shape.rank))
        t = dtensor.relayout(dtensor.copy_to_mesh(tf.constant(x), dtensor.Layout.replicated(mesh.mesh, 5)), split)
        taken = []
        for index, axis in ((1, 0), (2, 1), (-1, 2)):
            with dtensor.default_mesh(mesh.mesh):
                got = tf.function(lambda v: whole(take(v, index, axis)))(t)
            taken.append(bool(np.array_equal(dtensor.unpack(got)[0].numpy(), np.take(x, index, axis))))
        print("RESULT " + json.dumps(dict(mesh=mesh_losses, single=single_losses, shards=shards, taken=taken,
                                          mesh_totals=mesh_totals, single_totals=single_totals,
                                          model=mesh.sizes["model"], replicas=mesh.num_replicas)))
    """, timeout=400)
    mesh, single = np.array(out["mesh"]), np.array(out["single"])
    assert np.all(np.isfinite(mesh)) and mesh[-1] < mesh[0]
    np.testing.assert_allclose(mesh, single, rtol=LOSS_RTOL)
    # The eval over the padded, split set counts exactly eval_samples on both.
    assert out["mesh_totals"]["counted"] == out["single_totals"]["counted"] == 100
    # The mesh's pipelines run no autotune model thread (the training one asks for it): tearing down
    # DTensorDataset's per-device iterators would otherwise wait out each thread's sleep.
    assert out["mesh_totals"]["autotune"] == [False, False]
    # At most one masked-LM prediction (of ~500) may flip on float32 reduction order.
    np.testing.assert_allclose(out["mesh_totals"]["accuracy"], out["single_totals"]["accuracy"], atol=2.5e-3)

    m, sharded = out["model"], 0
    assert m == 2 and out["replicas"] == 2
    for path, (shape, locals_, dims) in out["shards"].items():
        assert len(locals_) == 4, path
        split = [i for i, d in enumerate(dims) if d in ("heads", "ff", "vocab")]
        expect = [s // m if i == (split[0] if split else -1) else s for i, s in enumerate(shape)]
        assert all(l == expect for l in locals_), (path, shape, locals_)
        sharded += bool(split)
    assert sharded >= 10  # attention, feed-forward, embeddings, masked-LM bias and their LAMB slots
    assert out["taken"] == [True, True, True]


def test_resnet_runs_data_parallel_on_the_mesh(tmp_out):
    proc = run_cli("run", os.path.join(REPO, "configs", "resnet", "smoke.yaml"), "--output_dir", tmp_out,
                   "--set", "runtime.kind=mesh", "--set", "runtime.cpu_devices=2",
                   "--set", "runtime.mesh={data: 2, model: 1}", "--set", "schedule.max_epochs=4",
                   "--set", "data.train_samples=256", "--set", "data.eval_samples=101",
                   *sets(*TINY_RESNET))  # the runtime is what is tested, not the model
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = read_summary(tmp_out)
    assert summary["runtime"].startswith("mesh data=2 x model=1")
    assert summary["compliant"] and summary["evals"][0]["counted"] == 101


def test_a_mesh_over_several_cpu_hosts_is_one_clear_line(tmp_out, monkeypatch):
    """Several DTensor clients (a pod slice) are read from DTENSOR_NUM_CLIENTS; over CPUs DTensor's
    multi-client collectives fail in TF 2.21, so the harness says so before touching a device."""
    for key, value in {"DTENSOR_NUM_CLIENTS": "2", "DTENSOR_CLIENT_ID": "0", "DTENSOR_JOB_NAME": "worker",
                       "DTENSOR_JOBS": "127.0.0.1:1,127.0.0.1:2"}.items():
        monkeypatch.setenv(key, value)
    proc = cli_in_process("run", os.path.join(REPO, "configs", "bert", "smoke-mesh.yaml"), "--output_dir", tmp_out)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    errors = stderr_error_lines(proc)
    assert len(errors) == 1 and "DTENSOR_NUM_CLIENTS=2" in errors[0] and "TPUs or GPUs" in errors[0], proc.stderr
    assert not os.path.exists(os.path.join(tmp_out, "bert"))  # no run directory, no log
