"""flux1 without training: the reader of the reference's precomputed-embedding layout on files written here in
that layout (bfloat16 bits exact, the reference's per-replica order, `data count`, `data verify`), the objective's
draws (uniform t rounded to bfloat16, normals, distinct per sample and stream, the same on a rerun), the
per-ruleset evaluation_frequency and a closed log of the reference config's keys (tests/helpers/closed_log.py)
against the official checker of every ruleset that lists flux1, the closed refusals, the cost module, and the
diffusers export / import round trip. The golden comparison with diffusers is tests/test_flux1_golden.py; the
smoke runs and the mesh draws are tests/test_flux1_runs.py."""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.flux1 import data, flow
from benchmarks.flux1.config import DataConfig, ModelConfig
from harness import benchmark_rules as rules
from harness.errors import HarnessError

from conftest import REPO, cli_in_process


pytestmark = pytest.mark.quick

REFERENCE = os.path.join(REPO, "configs", "flux1", "reference.yaml")
SMOKE = os.path.join(REPO, "configs", "flux1", "smoke.yaml")
RULESETS = ("5.1.0", "6.0.0", "6.1.0")
TINY = dict(text_tokens=4, latent_size=4)
TINY_MODEL = dict(context_in_dim=8, vec_in_dim=6)


# ------------------------------------------------------------------------------------------- data

def write_set(root: str, n: int, with_timestep: bool, seed: int, shards: int = 2) -> list[dict]:
    """n rows in the reference's layout under root (`shards` Arrow stream shards); returns the float rows."""
    d, m = DataConfig(**TINY), ModelConfig(**TINY_MODEL)
    shp = data.shapes(d, m)
    rng = np.random.default_rng(seed)
    rows = [{k: rng.normal(size=s).astype(np.float32) for k, s in shp.items()} for _ in range(n)]
    bits = [{k: data.bf16_bits(v) for k, v in r.items()} for r in rows]
    if with_timestep:
        for i, b in enumerate(bits):
            b["timestep"] = i % 8
    cut = [n * s // shards for s in range(shards + 1)]
    for s in range(shards):
        data.write_shard(os.path.join(root, f"data-{s:05d}-of-{shards:05d}.arrow"), bits[cut[s]:cut[s + 1]],
                         [f"k{i}" for i in range(cut[s], cut[s + 1])])
    return rows


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("flux_data"))
    train = write_set(os.path.join(root, "cc12m_preprocessed"), 12, False, 0)
    evals = write_set(os.path.join(root, "coco_preprocessed"), 16, True, 1, shards=1)
    empty = os.path.join(root, "empty_encodings")
    os.makedirs(empty)
    np.save(os.path.join(empty, "t5_empty.npy"), np.full((1, 4, 8), 0.5, np.float16))
    np.save(os.path.join(empty, "clip_empty.npy"), np.full((1, 6), -0.25, np.float16))
    return root, train, evals


def source(root: str, **kw) -> data.EmbeddingsSource:
    d = DataConfig(source="embeddings", data_dir=root, eval_samples=16, **TINY, **kw)
    return data.EmbeddingsSource(d, ModelConfig(**TINY_MODEL))


def test_reader_decodes_the_bfloat16_bits_exactly_in_stored_order(dataset):
    root, train, evals = dataset
    src = source(root)
    src.validate()
    assert src.counts() == {"train_samples": 12, "eval_samples": 16}
    assert src.train_samples == 12
    rows = list(src.eval_records().as_numpy_iterator())
    assert [r["index"] for r in rows] == list(range(16)) and [r["timestep"] for r in rows] == [i % 8 for i in range(16)]
    for got, want in zip(rows, evals):
        for k in data.FEATURES:
            exact = want[k].astype(np.float32).astype(data.ml_dtypes.bfloat16).astype(np.float32)
            np.testing.assert_array_equal(data.decode(tf.constant(got[k]), tf.float32).numpy(), exact)
    empty = src.empty()
    assert np.all(data.decode_np(empty["t5"]) == 0.5) and np.all(data.decode_np(empty["clip"]) == -0.25)


def test_each_replica_reads_its_contiguous_chunk_and_loops(dataset):
    """The reference's split_dataset_by_node order: 12 rows over 2 replicas = chunks [0, 6) and [6, 12); per step
    each replica's next 4 rows in turn; a host of replica 1 alone reads only its chunk."""
    order = data.replica_order(12, 2, 4, 0, 2)
    got = [next(order) for _ in range(16)]
    assert got == [0, 1, 2, 3, 6, 7, 8, 9, 4, 5, 0, 1, 10, 11, 6, 7]
    second = data.replica_order(12, 2, 4, 1, 1)
    assert [next(second) for _ in range(8)] == [6, 7, 8, 9, 10, 11, 6, 7]
    root, train, _ = dataset
    from harness.runtime.base import InputContext

    ds = source(root).train(InputContext(1, 0, 8, 0), replicas=2, local_batch=4)
    first = next(iter(ds.batch(8)))
    assert first["slot"].numpy().tolist() == list(range(8))   # each example's position in the global batch
    # the same under a strategy (the pipeline batches per replica, 4) and for host 1 of 2 (replica 1's rows)
    mirrored = source(root).train(InputContext(1, 0, 4, 0), replicas=2, local_batch=4)
    assert next(iter(mirrored.batch(16)))["slot"].numpy().tolist() == list(range(8)) * 2
    second_host = next(iter(source(root).train(InputContext(2, 1, 4, 0), replicas=2, local_batch=4).batch(8)))
    assert second_host["slot"].numpy().tolist() == [4, 5, 6, 7] * 2
    np.testing.assert_array_equal(second_host["mean"][:4].numpy(), first["mean"][4:].numpy())
    want = np.stack([train[i]["mean"] for i in [0, 1, 2, 3, 6, 7, 8, 9]])
    np.testing.assert_allclose(data.decode(first["mean"], tf.float32).numpy(), want, atol=0.01 * np.abs(want).max())


def test_reader_refuses_what_is_not_the_reference_layout_in_one_line(dataset, tmp_path):
    root, _, _ = dataset
    with pytest.raises(HarnessError, match="data.train_samples=5 but the training shards hold 12 rows"):
        source(root, train_samples=5).validate()
    bad = DataConfig(source="embeddings", data_dir=root, text_tokens=5, latent_size=4)
    with pytest.raises(HarnessError, match=r"holds uint16 \[4, 8\], the reference's layout is uint16"):
        data.EmbeddingsSource(bad, ModelConfig(**TINY_MODEL)).validate()
    (tmp_path / "cc12m_preprocessed").mkdir()
    (tmp_path / "cc12m_preprocessed" / "data-00000-of-00001.arrow").write_bytes(b"not arrow")
    with pytest.raises(HarnessError, match="not an Arrow IPC stream shard"):
        source(str(tmp_path)).counts()


def test_data_count_and_verify_know_the_files(dataset):
    root, _, _ = dataset
    sets = ["--set", f"data.data_dir={root}", "--set", "data.text_tokens=4", "--set", "data.latent_size=4",
            "--set", "model.context_in_dim=8", "--set", "model.vec_in_dim=6"]
    counted = cli_in_process("data", "count", REFERENCE, *sets)
    assert counted.returncode == 0, counted.stdout + counted.stderr
    assert "--set data.train_samples=12 --set data.eval_samples=16" in counted.stdout
    verified = cli_in_process("data", "verify", REFERENCE, *sets)
    # the reference's counts are 1,099,776 and 29,696: these files are named short of both
    assert verified.returncode != 0
    said = (verified.stdout + verified.stderr).replace(",", "")
    assert "12" in said and "1099776" in said and "29696" in said, said


# --------------------------------------------------------------------------------------- draws

def test_timesteps_round_to_bfloat16_and_draws_differ_per_sample_and_stream():
    t = flow.timesteps(tf.constant([0.3, 0.85, 0.99999])).numpy()
    np.testing.assert_array_equal(t, [0.30078125, 0.8515625, 1.0])          # rounded, not truncated (0.298828125)
    u = np.random.default_rng(0).random(10000).astype(np.float32)          # torch's .to(bfloat16): nearest even
    want = u.astype(data.ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(flow.timesteps(tf.constant(u)).numpy(), want)
    seed = tf.constant([7, 11], tf.int64)
    keys = flow.sample_keys(seed, flow.positions(64), flow.NOISE_STREAM)
    z = flow.normal(keys, [16, 64]).numpy()
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1.0) < 0.02 and len({tuple(r[0, :4]) for r in z}) == 64
    np.testing.assert_array_equal(z, flow.normal(flow.sample_keys(seed, flow.positions(64), flow.NOISE_STREAM),
                                                 [16, 64]).numpy())                          # a rerun: the same
    other = flow.normal(flow.sample_keys(seed, flow.positions(64), flow.VAE_STREAM), [16, 64]).numpy()
    assert abs(np.corrcoef(z.ravel(), other.ravel())[0, 1]) < 0.02                           # streams unrelated
    u = flow.uniform(flow.sample_keys(seed, flow.positions(4096), flow.T_STREAM), [1]).numpy()
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.02


def test_pack_is_the_einops_rearrangement_and_unpack_inverts_it():
    x = np.arange(2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4)
    packed = flow.pack(tf.constant(x)).numpy()
    # token (h, w) = h * 2 + w holds channels c * 4 + ph * 2 + pw
    assert packed.shape == (2, 4, 12) and packed[1, 3, 5] == x[1, 1, 2 + 0, 2 + 1]
    np.testing.assert_array_equal(flow.unpack(tf.constant(packed), 3, 4).numpy(), x)


# ------------------------------------------------------------------------------------------ rules

def test_evaluation_frequency_per_ruleset_and_the_cadence():
    assert [rules.flux_evaluation_frequency(r, 512) for r in RULESETS] == [262144] * 3
    assert [rules.flux_evaluation_frequency(r, 2304) for r in RULESETS] == [262144, 262144, 262656]
    assert rules.cadence("flux1", "6.0.0", 2304).every == 262656       # where the reference evaluates
    assert rules.closed_target("flux1", "5.1.0") == 0.586 and not rules.record("flux1").higher_is_better


@pytest.fixture(scope="module")
def closed_logs(tmp_path_factory):
    from tests.helpers.closed_log import checked_workload, write_run_log

    tmp = tmp_path_factory.mktemp("flux_closed")
    out = {}
    for name, overrides in (("512", []), ("2304 for 6.1.0", ["schedule.global_batch_size=2304"])):
        cfg, workload = checked_workload(REFERENCE, overrides)
        path = str(tmp / f"{name.split()[0]}.txt")
        out[name] = (path, write_run_log(path, cfg, workload, [0.78, 0.66, 0.60, 0.585]), workload)
    return out


def test_a_closed_log_of_the_reference_config_passes_every_ruleset_that_lists_flux1(closed_logs):
    from harness import mlperf

    path, points, workload = closed_logs["512"]
    assert [p.samples for p in points] == [262144 * k for k in range(1, 5)]
    keys = workload.mllog_hparams()
    assert keys["evaluation_frequency"] == 262144 and keys["opt_adamw_epsilon"] == 1e-8
    assert keys["micro_batch_size"] == 64 and keys["lowest_numerical_precision_in_linear"] == "bfloat16"
    listed = [r for r in rules.RULESETS if r in rules.record("flux1").closed]
    assert listed == list(RULESETS)
    for ruleset in listed:
        verdict = mlperf.run_compliance_checker(path, ruleset)
        assert verdict.passed, (ruleset, verdict.errors)
    # GBS 2304 logged for 6.1.0 (evaluation_frequency 262656) passes 6.1.0 and fails 5.1.0 / 6.0.0 (262144)
    path, points, workload = closed_logs["2304 for 6.1.0"]
    assert points[0].samples == 262656 and workload.mllog_hparams()["evaluation_frequency"] == 262656
    got = {r: mlperf.run_compliance_checker(path, r).passed for r in RULESETS}
    assert got == {"5.1.0": False, "6.0.0": False, "6.1.0": True}


@pytest.mark.parametrize("override, message", [
    ("optimizer.epsilon=1e-6", "the checker fixes optimizer.epsilon=1e-08"),
    ("data.cfg_dropout=0", "the reference has data.cfg_dropout=0.1"),
    ("model.init_checkpoint=/x", "remove model.init_checkpoint"),
    ("model.axes_dim=[16, 48, 56]", "sums to 120, not the head size 128"),
])
def test_closed_departures_are_refused_in_one_line(override, message):
    from harness import config as config_lib
    from harness.dryrun.standin import standin_checked

    cfg = config_lib.load_config(REFERENCE, [override])
    with pytest.raises(HarnessError) as e:
        standin_checked(cfg)
    assert "\n" not in str(e.value) and message in str(e.value)


# ------------------------------------------------------------------------------------------- cost

def test_cost_counts_the_reference_parameters_and_flops():
    from benchmarks.flux1 import cost
    from harness import config as config_lib

    cfg = config_lib.load_config(REFERENCE, [])
    c = cost.model_cost(cfg)
    assert c.params == 11_891_178_560
    assert c.train_flops_per_sample / 1e12 == pytest.approx(20.42, abs=0.05)
    assert c.eval_flops_per_sample / 1e12 == pytest.approx(6.807, abs=0.01)
    assert cost.eval_positions(cfg, 600_000, 512)[:3] == [262144, 524288, 786432]
    assert math.isclose(c.train_samples, 1_099_776)


# ----------------------------------------------------------------------------------- diffusers layout

def test_export_to_the_diffusers_layout_and_import_round_trip(tmp_path):
    """Every variable of a model with random weights -> diffusers' names and files -> a second model: equal; the
    files are what FluxTransformer2DModel.from_pretrained reads (config.json's class and sizes, the weights'
    file name), and the final layer's halves are swapped on the way (diffusers holds scale, shift)."""
    import json

    from benchmarks.flux1 import diffusers_names
    from benchmarks.flux1.model import Flux
    from harness.nn import hf_checkpoint
    from harness.runtime import distribute

    m = ModelConfig(hidden_size=64, num_heads=2, depth=1, depth_single_blocks=1, axes_dim=[8, 12, 12],
                    context_in_dim=32, vec_in_dim=16)
    rt = distribute.make_default("float32", False)
    with rt.scope():
        one = Flux(rt, "flux", 0, m)
    rng = np.random.default_rng(3)
    for v in rt.variables():
        v.variable.assign(rng.normal(size=v.variable.shape).astype(np.float32))
    values = {v.path: v.variable.numpy() for v in rt.variables()}
    layout = diffusers_names.layout(m)
    assert {p for o in layout.outs for p in o.paths} == set(values)         # every variable is exported
    tensors, produce = hf_checkpoint.export_tensors(layout, lambda p: values[p], np.float32)
    cfg = type("Cfg", (), {"model": m})()
    out = str(tmp_path / "transformer")
    files = hf_checkpoint.write_checkpoint(out, tensors, produce, diffusers_names.config(cfg, "float32"),
                                           10 ** 9, diffusers_names.STEM)
    assert files == ["config.json", "diffusion_pytorch_model.safetensors"]
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["_class_name"] == "FluxTransformer2DModel"
    w = hf_checkpoint.Checkpoint(out, stem=diffusers_names.STEM).read("norm_out.linear.weight")
    np.testing.assert_array_equal(w[:64], values["flux/final_layer/adaLN/lin/kernel"][:, 64:].T)  # scale first
    rt2 = distribute.make_default("float32", False)
    with rt2.scope():
        Flux(rt2, "flux", 1, m)
    hf_checkpoint.load_into(rt2, out, diffusers_names.FORMAT, m)
    for v in rt2.variables():
        np.testing.assert_array_equal(v.variable.numpy(), values[v.path], err_msg=v.path)
    del one
    with pytest.raises(HarnessError, match="num_layers=1, the model has model.depth=2"):
        hf_checkpoint.check_config(out, diffusers_names.FORMAT, dataclasses.replace(m, depth=2))


@pytest.mark.parametrize("evals, verdict", [(28, "PASS"), (26, "FAIL")])
def test_check_rcp_judges_ten_reference_logs(tmp_path, evals, verdict):
    """GBS 512: the 6.1.0 RCP's mean is 7,223,524 samples, its lowest allowed mean for 10 runs 7,112,400 (27.13
    evals of 262,144): 10 runs converging at the 28th eval pass, at the 26th they are faster than the RCPs allow."""
    from harness.review import rcp
    from tests.helpers.closed_log import checked_workload, write_run_log

    cfg, workload = checked_workload(REFERENCE)
    for seed in range(1, 11):
        cfg.seed = seed
        write_run_log(str(tmp_path / f"result_{seed - 1}.txt"), cfg, workload,
                      [0.77 - 0.006 * k for k in range(evals - 1)] + [0.585])
    report = rcp.rcp_report([str(tmp_path)], "6.1.0")
    assert [r.value for r in report.runs] == [evals * 262144] * 10
    assert report.verdict == verdict, report.detail
