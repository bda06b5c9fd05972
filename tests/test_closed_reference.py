"""Closed means the reference: a closed run on real data must build the reference model (refused at
load in one line otherwise), `check` and `package` flag a closed log whose model disclosure or fixed keys say
otherwise, file sources check every stated sample count against the files (one line with the right number,
costly counts cached beside the data, `mlperf-harness data count`), and the COCO source finds both converters'
shard names. Every refusal happens at load: nothing here trains.
"""
from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from harness import config as config_lib
from harness.config import RuntimeConfig
from harness.errors import HarnessError
from harness.review import checklog, integrity, logparse
from harness.runtime import make_runtime
from harness.submission import package, runs
from harness.train import datafiles, reference
from harness.train.run import execute

from conftest import REPO, cli_in_process, stderr_error_lines

pytestmark = pytest.mark.quick

CONFIGS = os.path.join(REPO, "configs")
GOOGLE_SSD = os.path.join(REPO, "tests", "data", "public_v0.7", "Google", "results", "tpu-v3-8192-TF", "ssd",
                          "result_1.txt")


def config(workload: str, name: str = "smoke.yaml") -> str:
    return os.path.join(CONFIGS, workload, name)


# ------------------------------------------------------------------------------------------ files

@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, dict]:
    """Small real-format data of every workload, written by the repo's own writers: the --set overrides
    that read each (with the right counts)."""
    from benchmarks.bert import tfrecord_writer as bert_writer
    from benchmarks.bert.config import DataConfig as BertData
    from benchmarks.bert.data import SyntheticSource as BertSynthetic
    from benchmarks.resnet.tfrecord_writer import write_imagenet_tfrecords
    from benchmarks.ssd import tfrecord_writer as ssd_writer
    from benchmarks.ssd.data import count_images_with_boxes
    from benchmarks.transformer import tfrecord_writer as wmt_writer

    root = tmp_path_factory.mktemp("real_format")
    out: dict[str, dict] = {}
    folder = str(root / "imagenet")
    write_imagenet_tfrecords(folder, 12, 5, image_size=40, num_classes=10, train_shards=2, eval_shards=1)
    out["resnet"] = {"source": "tfrecord", "data_dir": folder, "train_samples": 12, "eval_samples": 5}

    folder = str(root / "bert")
    os.makedirs(folder)
    arrays = BertSynthetic(BertData(seq_length=32, max_predictions=5), 256).generate(14, stream=1)
    bert_writer.write(os.path.join(folder, "part-00000-of-00002"), bert_writer.rows(arrays, 0, 6))
    bert_writer.write(os.path.join(folder, "part-00001-of-00002"), bert_writer.rows(arrays, 6, 10))
    bert_writer.write(os.path.join(folder, "eval_10k"), bert_writer.rows(arrays, 10, 14))
    out["bert"] = {"source": "tfrecord", "data_dir": folder, "train_samples": 10, "eval_samples": 4}

    folder = str(root / "wmt")
    out["transformer"] = wmt_writer.write_synthetic(folder, train_pairs=200, eval_sentences=8, seed=1, shards=3)

    folder = str(root / "coco")
    paths = ssd_writer.write_synthetic(folder, 24, 6, image_size=32, seed=1, num_shards=2, empty_fraction=0.2)
    out["ssd"] = {"source": "tfrecord", "data_dir": folder, "annotation_file": paths["val_json"],
                  "train_samples": count_images_with_boxes(paths["train"]), "eval_samples": 6}
    assert out["ssd"]["train_samples"] < 24  # some images are empty, so the count differs from the images
    return out


def data_sets(data: dict, **changes) -> list[str]:
    return [f"data.{k}={v}" for k, v in {**data, **changes}.items()]


# ------------------------------------------------------------------------- reference model at load

REFUSALS = {
    "resnet": "the reference ResNet-50 v1.5: model.blocks=[1, 1, 1] (reference [3, 4, 6, 3]), model.width=8 "
              "(reference 64), model.stem=small (reference imagenet), data.image_size=32 (reference 224), "
              "data.num_classes=10 (reference 1000); use submission.division=open",
    "bert": "the reference BERT-large: model.num_layers=1 (reference 24), model.hidden_size=128 (reference 1024), "
            "model.num_heads=4 (reference 16), model.ff_size=512 (reference 4096), model.vocab_size=32 (reference "
            "30522), model.max_position=32 (reference 512), model.hidden_dropout=0 (reference 0.1), "
            "model.attention_dropout=0 (reference 0.1), data.seq_length=32 (reference 512), data.max_predictions=5 "
            "(reference 76); use submission.division=open",
    "ssd": "the reference SSD300 on ResNet-34: model.image_size=64 (reference 300), model.width=16 (reference 64), "
           "model.blocks=[1, 1, 1] (reference [3, 4, 6]), ",
}


@pytest.mark.parametrize("workload", ["resnet", "bert", "ssd"])
def test_closed_run_on_real_data_refuses_a_model_that_is_not_the_reference(workload, files, tmp_path):
    out = str(tmp_path / "runs")
    with pytest.raises(HarnessError) as e:
        execute(config(workload), ["submission.division=closed", f"output_dir={out}"]
                + data_sets(files[workload]))
    message = str(e.value)
    assert message.startswith("closed division on real data needs " + REFUSALS[workload]), message
    assert "\n" not in message and not os.path.exists(out)


def test_transformer_refusal_is_one_cli_line_and_open_or_synthetic_is_not_refused(files, tmp_path):
    out = str(tmp_path / "runs")
    flags = [a for s in ["submission.division=closed"] + data_sets(files["transformer"]) for a in ("--set", s)]
    proc = cli_in_process("run", config("transformer"), "--output_dir", out, *flags)
    assert proc.returncode == 2 and stderr_error_lines(proc) == [
        "error: closed division on real data needs the reference Transformer-big: model.num_layers=2 (reference 6), "
        "model.hidden_size=128 (reference 1024), model.num_heads=4 (reference 16), model.filter_size=256 (reference "
        "4096), vocabulary size (data.vocab_file)=320 (reference 33708); use submission.division=open"], proc.stderr
    assert "Traceback" not in proc.stderr and not os.path.exists(out)
    # The same model open, or closed on synthetic data (the smoke configs), passes the check.
    runtime = make_runtime(RuntimeConfig())
    from benchmarks import registry
    for sets in (["submission.division=open"] + data_sets(files["transformer"]), ["submission.division=closed"]):
        cfg = config_lib.load_config(config("transformer"), sets)
        reference.check_closed_model(registry.get("transformer")(cfg, runtime))


def test_reference_configs_pass_and_a_single_difference_is_named(files):
    from benchmarks import registry
    runtime = make_runtime(RuntimeConfig())
    for name in ("resnet", "bert", "ssd"):
        one_device = ["runtime.kind=default"] + (["model.bn_span=0"] if name == "ssd" else [])
        cfg = config_lib.load_config(config(name, "reference.yaml"), one_device)
        workload = registry.get(name)(cfg, runtime)
        reference.check_closed_model(workload)  # the reference configs are the reference model
        model = reference.disclosure(workload)
        assert model["settings"] == model["reference"] and model["reference_model"] == workload.reference_model().name
    cfg = config_lib.load_config(config("bert", "reference.yaml"), ["runtime.kind=default", "model.num_layers=12"])
    with pytest.raises(HarnessError, match=r"^closed division on real data needs the reference BERT-large: "
                                           r"model.num_layers=12 \(reference 24\); use submission.division=open$"):
        reference.check_closed_model(registry.get("bert")(cfg, runtime))


# ------------------------------------------------------------------------------ check and package

def with_lines(tmp_path, name: str, source: str, extra: list[dict]) -> str:
    """A copy of Google's v0.7 SSD log (passes the official checker) with harness lines after its first line."""
    path = str(tmp_path / name)
    with open(GOOGLE_SSD) as src:
        lines = src.readlines()
    first = json.loads(lines[0].split(":::MLLOG ", 1)[1])
    added = [":::MLLOG " + json.dumps({"namespace": "", "time_ms": first["time_ms"], "event_type": "POINT_IN_TIME",
                                       "metadata": {}, **event}) + "\n"
             for event in [{"key": "harness_data_source", "value": source}] + extra]
    with open(path, "w") as dst:
        dst.writelines(lines[:1] + added + lines[1:])
    return path


def small_model(settings_change: dict) -> dict:
    ref = {"model.image_size": 300, "model.width": 64}
    return {"key": "harness_model", "value": {"reference_model": "SSD300 on ResNet-34",
                                              "settings": {**ref, **settings_change}, "reference": ref}}


def test_integrity_judges_the_logged_model_of_closed_real_data_logs_only():
    def findings(lines: list[dict], division: str = "closed", benchmark: str = "ssd") -> list[tuple[str, str]]:
        base = [{"key": "submission_division", "value": division}, {"key": "submission_benchmark", "value": benchmark}]
        text = [":::MLLOG " + json.dumps({"time_ms": 1, "event_type": "POINT_IN_TIME", "metadata": {}, **e})
                for e in base + lines]
        return [(f.code, f.message) for f in integrity.check_closed_model(logparse.parse_lines(text))]

    real = {"key": "harness_data_source", "value": "tfrecord"}
    assert findings([real, small_model({})]) == []
    [(code, message)] = findings([real, small_model({"model.width": 16})])
    assert code == "model_not_reference" and message.endswith("model.width=16 (reference 64)")
    assert [c for c, _ in findings([real])] == ["model_undisclosed"]
    assert findings([{"key": "harness_data_source", "value": "synthetic"}, small_model({"model.width": 16})]) == []
    assert findings([real, small_model({"model.width": 16})], division="open") == []
    assert findings([]) == []  # another tool's log: no disclosure to judge
    [(code, message)] = findings([{"key": "max_sequence_length", "value": 128}], benchmark="bert")
    assert code == "closed_fixed_key" and "max_sequence_length=128" in message and "fixes it at 512" in message


def test_check_and_package_flag_a_closed_log_from_another_model(tmp_path, capsys):
    bad = with_lines(tmp_path, "small.txt", "tfrecord", [small_model({"model.width": 16})])
    good = with_lines(tmp_path, "reference.txt", "tfrecord", [small_model({})])
    assert checklog.main([good], ["0.7.0"], None) == 0
    assert checklog.main([bad], ["0.7.0"], None) == 1
    printed = capsys.readouterr().out
    assert "official compliance checker, ruleset 0.7.0: PASS" in printed  # the checker cannot see the model
    assert "error: [model_not_reference] closed log on tfrecord data from a model that is not the reference " \
           "SSD300 on ResNet-34" in printed and "model.width=16 (reference 64)" in printed
    with pytest.raises(HarnessError, match=r"^refusing to package: .*small.txt fails the harness integrity checks: "
                                           r"closed log on tfrecord data from a model that is not the reference"):
        package.check_compliance([runs.load_run(bad)], "0.7.0")
    package.check_compliance([runs.load_run(good)], "0.7.0")


# ---------------------------------------------------------------------------------- sample counts

@pytest.mark.parametrize("workload,key,want", [("resnet", "train_samples", 12), ("resnet", "eval_samples", 5),
                                               ("bert", "train_samples", 10), ("bert", "eval_samples", 4),
                                               ("ssd", "train_samples", None), ("ssd", "eval_samples", 6),
                                               ("transformer", "train_samples", None)])
def test_a_wrong_sample_count_is_one_line_with_the_right_number(workload, key, want, files, tmp_path):
    data = files[workload]
    want = want if want is not None else data[key]
    out = str(tmp_path / "runs")
    with pytest.raises(HarnessError) as e:
        execute(config(workload), ["submission.division=open", f"output_dir={out}"]
                + data_sets(data, **{key: want + 3}))
    message = str(e.value)
    assert message.startswith(f"data.{key}={want + 3} but ") and message.endswith(f"; set data.{key}={want}")
    assert "\n" not in message and not os.path.exists(out)


def test_data_count_command_prints_the_counts_and_caches_the_packed_rows(files, monkeypatch):
    wmt = files["transformer"]
    sets = data_sets(wmt, train_samples=0)
    assert reference.count_data(config("transformer"), sets) == {"train_samples": wmt["train_samples"],
                                                                  "eval_samples": 8}
    cache = os.path.join(wmt["data_dir"], datafiles.COUNT_CACHE)
    entries = json.load(open(cache)).values()
    assert {"what": "packed rows", "count": wmt["train_samples"]}.items() <= next(
        e for e in entries if e["what"] == "packed rows").items()
    from benchmarks.transformer import packing

    def never(*a, **k):
        raise AssertionError("counted again")
    monkeypatch.setattr(packing, "count_rows", never)
    assert reference.count_data(config("transformer"), sets)["train_samples"] == wmt["train_samples"]  # cached
    with pytest.raises(AssertionError, match="counted again"):  # other packing settings: another count
        reference.count_data(config("transformer"), data_sets(wmt, train_samples=0, row_length=48))
    monkeypatch.undo()
    assert reference.count_data(config("ssd"), data_sets(files["ssd"])) == {
        "train_samples": files["ssd"]["train_samples"], "eval_samples": 6}


def test_the_cli_data_count_line(files):
    flags = [a for s in data_sets(files["bert"]) for a in ("--set", s)]
    proc = cli_in_process("data", "count", config("bert"), *flags)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["data.train_samples=10", "data.eval_samples=4",
                                        "use: --set data.train_samples=10 --set data.eval_samples=4"]


def test_row_count_matches_the_packing_pipeline():
    from benchmarks.transformer import packing

    rng = np.random.default_rng(0)
    lengths = [(int(a), int(b)) for a, b in rng.integers(1, 14, size=(150, 2))]
    pairs = tf.data.Dataset.from_generator(lambda: ({"inputs": np.ones(a, np.int32), "targets": np.ones(b, np.int32)}
                                                    for a, b in lengths),
                                           output_signature={"inputs": tf.TensorSpec([None], tf.int32),
                                                             "targets": tf.TensorSpec([None], tf.int32)})
    for pack in (True, False):
        rows = pairs.filter(packing.within_length(12))
        built = sum(1 for _ in packing.to_rows(rows, 16, pack, flush_at_end=True))
        assert packing.count_rows(lengths, 16, 12, pack) == built


def test_record_count_reads_headers_and_names_a_truncated_file(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(7):
            w.write(b"r" * (i * 100))
    assert datafiles.count_records([path, path]) == 14
    with open(path, "rb") as f:
        raw = f.read()
    with open(path, "wb") as f:
        f.write(raw[:-10])
    with pytest.raises(HarnessError, match=r"x.tfrecord is corrupt or truncated"):
        datafiles.count_records([path])


# ---------------------------------------------------------------------------------- COCO naming

def test_coco_source_finds_the_object_detection_api_names_or_names_the_pattern_keys(files, tmp_path):
    from benchmarks.ssd.config import DataConfig, ModelConfig
    from benchmarks.ssd.data import make_source

    folder = str(tmp_path / "od_api")
    shutil.copytree(files["ssd"]["data_dir"], folder)
    for path in glob.glob(os.path.join(folder, "*.tfrecord")):
        split, rest = os.path.basename(path).split("-", 1)  # train-00000-of-00002.tfrecord
        os.rename(path, os.path.join(folder, f"coco_{split}.record-{rest[:-len('.tfrecord')]}"))
    data = {**files["ssd"], "data_dir": folder, "annotation_file": os.path.join(folder, "instances_val.json")}
    source = make_source(DataConfig(**data), ModelConfig())
    source.validate()
    assert source.counts() == {"train_samples": data["train_samples"], "eval_samples": 6}
    for path in glob.glob(os.path.join(folder, "coco_train.record-*")):
        os.remove(path)
    with pytest.raises(HarnessError, match=r"^no COCO shards under .* match train-\* \(tensorflow/tpu naming\) or "
                                           r"coco_train.record-\* \(Object Detection API naming\); set "
                                           r"data.train_pattern to their glob$"):
        make_source(DataConfig(**data), ModelConfig()).validate()


def test_gpt_oss_reference_config_is_the_reference_and_its_smoke_model_on_indexed_data_is_refused():
    """No files needed: the model is compared at load, before the sources are validated."""
    from benchmarks import registry
    runtime = make_runtime(RuntimeConfig())
    cfg = config_lib.load_config(config("gpt_oss_20b", "reference.yaml"), ["runtime.kind=default"])
    reference.check_closed_model(registry.get("gpt_oss_20b")(cfg, runtime))
    cfg = config_lib.load_config(config("gpt_oss_20b"), ["submission.division=closed", "data.source=indexed"])
    with pytest.raises(HarnessError) as e:
        reference.check_closed_model(registry.get("gpt_oss_20b")(cfg, runtime))
    message = str(e.value)
    assert message.startswith("closed division on real data needs the reference GPT-OSS 20B: "
                              "model.vocab_size="), message
    assert "model.num_experts=" in message and message.endswith("use submission.division=open") and "\n" not in message
