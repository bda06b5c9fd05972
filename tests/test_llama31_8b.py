"""llama31_8b: Llama 3.1 RoPE scaling against its formula, the smoke and smoke-mesh runs (one each) whose logs
the official checker passes for 5.1.0, 6.0.0 and 6.1.0, FSDP on 4 logical devices equal to one device, the
closed division's refusals, and the dry run's per-device memory refusal. The XLA / bfloat16 / oneDNN steps
are in tests/test_xla_precision.py and tests/test_workload_contract.py (tests/step_cases.py)."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.lm import data, indexed_dataset
from benchmarks.lm.config import DataConfig
from harness import config as config_lib
from harness.errors import HarnessError
from harness.nn import layers
from harness.review import logparse

from conftest import REPO, cli_in_process, read_summary, runs_in_one_process, stderr_error_lines

CONFIGS = os.path.join(REPO, "configs", "llama31_8b")
SMOKE, MESH = os.path.join(CONFIGS, "smoke.yaml"), os.path.join(CONFIGS, "smoke-mesh.yaml")
RULESETS = {"5.1.0": "PASS", "6.0.0": "PASS", "6.1.0": "PASS"}


# ------------------------------------------------------------------------------------------ RoPE

def _llama3_frequencies(dim, base, factor, low, high, original):
    """The formula of NeMo's apply_rope_scaling and transformers' rope_type llama3, one frequency at a time."""
    out = []
    for i in range(dim // 2):
        freq = base ** (-2.0 * i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(freq)
        elif wavelen > original / low:
            out.append(freq / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return np.array(out)


def test_llama3_rope_scaling_follows_the_formula_and_is_off_by_default():
    scaling = layers.RopeScaling(8.0, 1.0, 4.0, 8192)
    got = layers.rope_frequencies(128, 500000.0, scaling).numpy()
    want = _llama3_frequencies(128, 500000.0, 8.0, 1.0, 4.0, 8192)
    np.testing.assert_allclose(got, want, rtol=2e-5)
    plain = 500000.0 ** (-np.arange(64) * 2.0 / 128)
    # All three regimes occur at the reference's dims: kept, divided by 8, and interpolated.
    assert np.sum(np.isclose(want, plain)) > 0 and np.sum(np.isclose(want, plain / 8)) > 0
    assert np.sum(~np.isclose(want, plain) & ~np.isclose(want, plain / 8)) > 0
    np.testing.assert_allclose(layers.rope_frequencies(128, 500000.0).numpy(), plain, rtol=2e-5)
    # rotary() turns pairs by position x frequency: position 1 of a unit vector on pair 0.
    x = np.zeros([1, 2, 1, 128], np.float32)
    x[..., 127] = 1.0
    y = layers.rotary(tf.constant(x), 500000.0, scaling).numpy()
    np.testing.assert_allclose([y[0, 1, 0, 63], y[0, 1, 0, 127]], [-math.sin(want[63]), math.cos(want[63])],
                               atol=1e-6)


@pytest.mark.parametrize("xla", [False, True])
def test_full_causal_attention_equals_the_masked_dense_attention(xla):
    from benchmarks.lm import attention

    rng = np.random.default_rng(4)
    q = tf.constant(rng.normal(size=[2, 24, 2, 3, 8]).astype(np.float32))
    k, v = (tf.constant(rng.normal(size=[2, 24, 2, 8]).astype(np.float32)) for _ in range(2))
    dense = attention.windowed_attention(q, k, v, None, 24, 24, like=q[:, :, 0, 0, 0]).numpy()
    # The XLA formulation, compiled by XLA; dense rows and queries in strips against their key prefixes
    # (what rows of 8192 tokens run) give the same numbers.
    run = tf.function(attention.causal_attention, jit_compile=True) if xla else attention.causal_attention
    np.testing.assert_allclose(run(q, k, v, xla=xla).numpy(), dense, atol=1e-6)
    np.testing.assert_allclose(run(q, k, v, chunk=8, xla=xla).numpy(), dense, atol=1e-6)
    # The default strips: rows from 512 tokens in two (or of 1024 beyond 2048), shorter rows one block.
    assert [attention.query_chunk(n) for n in (24, 511, 512, 1024, 2048, 4096, 8192)] == [
        24, 511, 256, 512, 1024, 1024, 1024]
    q = tf.constant(rng.normal(size=[1, 512, 1, 2, 4]).astype(np.float32))
    k, v = (tf.constant(rng.normal(size=[1, 512, 1, 4]).astype(np.float32)) for _ in range(2))
    np.testing.assert_allclose(run(q, k, v, xla=xla).numpy(), run(q, k, v, chunk=512, xla=xla).numpy(), atol=1e-6)


def _constant_elements(fn, *specs) -> list[int]:
    """Element counts of the constants over 1024 elements in the optimized XLA program of fn's forward and
    backward pass."""
    def grads(*args):
        with tf.GradientTape() as tape:
            tape.watch(args)
            y = tf.reduce_sum(fn(*args))
        return tape.gradient(y, args)
    hlo = tf.function(grads, jit_compile=True).experimental_get_compiler_ir(*specs)(stage="optimized_hlo")
    sizes = [math.prod(int(n) for n in m.group(1).split(",") if n)
             for m in re.finditer(r"\w+\[([\d,]*)\]\S* constant\(", hlo)]
    return [n for n in sizes if n > 1024]


def test_causal_masks_at_8192_tokens_are_not_folded_into_constants():
    """XLA folds masks built from constants into constants as large as the scores (a [seq, seq] mask is 256 MiB
    at 8192 tokens, a bias tiled over batch and heads more). The band_part masks stay iota compares; only
    TensorFlow's own folding (10 MiB per tensor at most) turns the first two strips' masks into constants."""
    from benchmarks.lm import attention

    seq = 8192
    specs = [tf.TensorSpec([1, seq, 1, 1, 8]), tf.TensorSpec([1, seq, 1, 8]), tf.TensorSpec([1, seq, 1, 8])]
    got = _constant_elements(lambda q, k, v: attention.causal_attention(q, k, v, xla=True), *specs)
    assert sum(got) <= 1024 * 1024 + 1024 * 2048, sorted(got)

    def from_positions(q, k, v):  # masks compared from constant positions: what the bound guards against
        pos = tf.range(seq)
        return tf.concat([attention._attend(
            q[:, i:i + 1024], k[:, :i + 1024], v[:, :i + 1024],
            tf.where(tf.reshape(pos[i:i + 1024], [-1, 1]) >= tf.reshape(pos[:i + 1024], [1, -1]), 0.0, -1e9),
            xla=True) for i in range(0, seq, 1024)], axis=1)
    assert sum(_constant_elements(from_positions, *specs)) > 4 * 1024 * 2048


# --------------------------------------------------------------------------------------- data

def test_smoke_language_needs_learning_to_get_below_the_open_rule():
    cfg = DataConfig(synthetic_doc_min=32, synthetic_doc_max=128, synthetic_main_prob=0.9)
    lang = data.Source(cfg, 64).language
    assert lang.entropy_rate() == pytest.approx(0.435, abs=0.01)  # reachable below the open rule's 1.0
    rows = lang.rows(0, 8, 257)
    counts = np.bincount(rows.reshape(-1), minlength=64)[1:]
    p = counts[counts > 0] / counts.sum()
    assert -(p * np.log(p)).sum() > 3.0                              # without context: far above 1.0


# --------------------------------------------------------------------------------- the smoke runs

@pytest.fixture(scope="module")
def smokes(tmp_path_factory):
    """Both smoke configs as shipped, in one process (4 logical CPUs, the mesh's; the one-device smoke takes
    the first), oneDNN's kernels forced on."""
    path = str(tmp_path_factory.mktemp("llama_smokes"))
    procs = runs_in_one_process(4, [[SMOKE], [MESH]], path, env={"TF_ENABLE_ONEDNN_OPTS": "1"})
    return {name: (proc, read_summary(os.path.join(path, str(n)), "llama31_8b") if proc.returncode == 0 else None)
            for n, (name, proc) in enumerate(zip(("smoke", "mesh"), procs))}


@pytest.mark.parametrize("name", ["smoke", "mesh"])
def test_smoke_reaches_the_open_target_with_a_log_all_three_checkers_pass(smokes, name):
    proc, summary = smokes[name]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert summary["status"] == "success" and summary["evals"][-1]["score"] <= 0.99
    assert summary["evals"][0]["score"] > 2.0                        # it had to learn (log 64 = 4.16 at init)
    assert all(e["score"] > 0.99 for e in summary["evals"][:-1])
    assert {r: v["verdict"] for r, v in summary["compliance"].items()} == RULESETS
    events = logparse.parse_log(summary["log"])
    keys = {e.key: e.value for e in events}
    assert keys["submission_division"] == "open" and keys["submission_benchmark"] == "llama31_8b"
    assert keys["opt_learning_rate_decay_steps"] == 1_200_000 - keys["opt_learning_rate_warmup_steps"]
    order = [e.key for e in events]
    assert order.index("opt_learning_rate_warmup_steps") < order.index("opt_learning_rate_decay_steps")
    assert keys["tensor_parallelism"] == (2 if name == "mesh" else 1) and keys["expert_parallelism"] == 1
    assert all({"samples_count", "epoch_num"} <= set(e.metadata) for e in events if e.key == "eval_accuracy")


def test_smoke_mesh_with_fsdp_scores_as_one_device(smokes):
    one, mesh = smokes["smoke"][1], smokes["mesh"][1]
    assert one and mesh
    np.testing.assert_allclose([e["score"] for e in mesh["evals"]], [e["score"] for e in one["evals"]], rtol=1e-4)


# ------------------------------------------------------------------------- FSDP on 4 logical devices

SMALL = ["data.seq_length=64", "data.synthetic_train_rows=8", "data.eval_samples=2",
         "schedule.global_batch_size=4", "model.num_layers=1"]


@pytest.fixture(scope="module")
def fsdp():
    cases = {"data4": [MESH, SMALL + ["runtime.mesh={data: 4, model: 1}", "runtime.fsdp=true"], 2],
             "data4_remat": [MESH, SMALL + ["runtime.mesh={data: 4, model: 1}", "runtime.fsdp=true",
                                            "model.remat=true"], 2],
             "one": [SMOKE, SMALL, 2]}
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "helpers", "fsdp_case.py"), json.dumps(cases)],
                          cwd=REPO, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_fsdp_on_four_devices_steps_as_one_device_with_every_weight_split(fsdp):
    np.testing.assert_allclose(fsdp["data4"]["losses"], fsdp["one"]["losses"], rtol=2e-5)
    np.testing.assert_allclose(fsdp["data4_remat"]["losses"], fsdp["one"]["losses"], rtol=2e-5)  # recomputed layers
    layouts, shapes = fsdp["data4"]["layouts"], fsdp["data4"]["shapes"]
    for path, layout in layouts.items():
        if any(s % 4 == 0 for s in shapes[path]):
            assert "data" in layout, (path, shapes[path], layout)
    down = [p for p in layouts if p.endswith("layer_0/mlp/down/kernel")]
    assert len(down) == 3 and all("data" in layouts[p] for p in down)  # the weight and its two AdamW slots


# ------------------------------------------------------------------------------- closed refusals

CPU = ["runtime.kind=default", "runtime.fsdp=false", "runtime.mesh={data: 1, model: 1}", "runtime.layout={}"]


def _closed(tmp_path, *extra, monkeypatch=None):
    """A closed run's one refusal line. `monkeypatch`: skip the reference-data check (`data verify`), so a
    test's small files with other names reach the checks after it."""
    if monkeypatch is not None:
        from harness.data import verify as data_verify
        monkeypatch.setattr(data_verify, "check_closed_data", lambda workload: "data verify: skipped (test)")
    args = ["run", os.path.join(CONFIGS, "reference.yaml"), "--output_dir", str(tmp_path / "runs"),
            "--set", f"data.data_dir={tmp_path}", "--set", "data.train_prefix=c4", "--set", "data.eval_prefix=c4"]
    for s in CPU + list(extra):
        args += ["--set", s]
    proc = cli_in_process(*args)
    lines = stderr_error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[0]


def test_closed_run_of_a_toy_model_is_refused(tmp_path):
    line = _closed(tmp_path, "model.num_layers=2", "model.hidden_size=64")
    assert "Llama 3.1 8B" in line and "model.num_layers=2 (reference 32)" in line


def test_closed_run_on_files_whose_counts_do_not_match_is_refused(tmp_path, monkeypatch):
    indexed_dataset.write(str(tmp_path / "c4"), [np.arange(1, 3000) % 1000 + 1, np.arange(40)])
    # The same files are refused first for not being the reference's (data verify) ...
    assert "closed division needs the reference's data" in _closed(tmp_path)
    # ... and past that check, for their counts.
    assert "holds 0 rows of 8193 tokens but data.eval_samples=1024" in _closed(tmp_path, monkeypatch=monkeypatch)


def test_closed_run_whose_train_samples_differ_from_the_files_rows_is_refused(tmp_path, monkeypatch):
    # 1024 rows of 8192 tokens (+1): enough eval rows, but data.train_samples claims twice the training rows.
    indexed_dataset.write(str(tmp_path / "c4"), [np.arange(1024 * 8192 + 1) % 1000 + 1])
    line = _closed(tmp_path, "data.train_samples=2048", monkeypatch=monkeypatch)
    assert "data.train_samples=2048" in line and "1024" in line, line



def test_closed_run_with_an_optimizer_value_the_checker_fixes_is_refused_before_training(tmp_path, monkeypatch):
    line = _closed(tmp_path, "optimizer.beta_2=0.99", monkeypatch=monkeypatch)
    assert "optimizer.beta_2=0.95" in line and "0.99" in line, line
    line = _closed(tmp_path, "optimizer.end_learning_rate=0.0001", monkeypatch=monkeypatch)
    assert "0.1 x base_learning_rate" in line, line


@pytest.mark.parametrize("name, masked", [("llama31_8b", False), ("gpt_oss_20b", True)])
def test_eod_inputs_are_scored_as_each_reference_scores_them(name, masked):
    """llama31_8b's reference takes the loss at every position (eod_mask_loss=False); gpt_oss_20b's masks EOD."""
    from benchmarks import registry
    from harness.runtime import make_runtime

    cfg = config_lib.load_config(os.path.join(REPO, "configs", name, "smoke.yaml"))
    wl = registry.get(name)(cfg, make_runtime(cfg.runtime))
    eod, vocab = cfg.data.eod_id, cfg.model.vocab_size
    hidden = 4

    class Zeros:  # hidden states of zeros and a zero head: every token's logits are equal
        def __call__(self, inputs):
            return tf.zeros(list(inputs.shape) + [hidden]), []

        def head(self):
            return tf.zeros([hidden, vocab])

    wl.model = Zeros()
    tokens = tf.constant([[5, eod, 7, 9, eod, 3]])
    _, weights, _, _ = wl.position_losses({"tokens": tokens}, None)
    want = [0.0 if (masked and t == eod) else 1.0 for t in tokens.numpy()[0, :-1]]
    assert weights.numpy()[0].tolist() == want


# ------------------------------------------------------------------------ dry run memory per device

def test_dry_run_refuses_8b_with_adamw_unsharded_on_one_h100_and_passes_fsdp_over_8(capsys):
    from benchmarks.llama31_8b import cost
    from harness.platforms import device_memory
    from harness.dryrun.memory import check_device_memory
    from dry_run_shared import reduced_report

    params = cost.model_cost(config_lib.load_config(os.path.join(CONFIGS, "gpu-8x-h100.yaml"), [])).params
    assert params == 8_030_261_248
    assert device_memory("8xh100-80gb-gpu") == (81559 * 2**20, "H100 80 GB")
    assert device_memory("tpu-v5p-16")[0] == 95 * 10**9 and device_memory("cpu-smoke") is None
    report = reduced_report(os.path.join("configs", "llama31_8b", "gpu-8x-h100.yaml"))
    whole = dataclasses.replace(report, weight_bytes_per_device=4 * params, gradient_bytes_per_device=4 * params,
                                optimizer_bytes_per_device=8 * params, peak_bytes_per_device=None)
    with pytest.raises(HarnessError, match=r"needs 119.7 GiB per device .* one H100 80 GB holds 79.6 GiB"):
        check_device_memory(whole, "8xh100-80gb-gpu")
    sharded = dataclasses.replace(whole, weight_bytes_per_device=params // 2, gradient_bytes_per_device=params // 2,
                                  optimizer_bytes_per_device=params)
    check_device_memory(sharded, "8xh100-80gb-gpu")            # 15 GiB: passes
    check_device_memory(whole, "cpu-smoke")                    # an unknown device is not checked
    check_device_memory(dataclasses.replace(sharded, peak_bytes_per_device=200 * 2**30,
                                                   activation_bytes_per_device=185 * 2**30), "tpu-v5p-16")
    assert "warning: the train step's peak estimate is 200.0 GiB" in capsys.readouterr().out


def test_dry_run_shows_rematerialization_keeping_less_for_the_backward_pass():
    from harness.dryrun import command
    from dry_run_shared import REDUCED

    config = os.path.join(CONFIGS, "gpu-8x-h100.yaml")
    small = REDUCED["llama31_8b"] + ["model.num_layers=2", "data.seq_length=128"]
    kept = {remat: command.compile_report(config, small + [f"model.remat={remat}"]).activation_bytes_per_device
            for remat in ("true", "false")}
    assert 0 < kept["true"] < 0.7 * kept["false"], kept
