"""`mlperf-harness data verify` (harness/train/data_verify.py): data files in the references' layouts, written by
the repo's own writers, pass against a small manifest in the shipped format; a truncated, a renamed and an
altered file (the last caught by --hashes) each give one line naming the file and what differs; the shipped
manifests load with a source on every value and name keys the configs have; and a closed run on data that
differs is refused in one line before its log opens.
"""
from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np
import pytest
import yaml

from harness import config as config_lib
from harness.errors import HarnessError
from harness.train import data_verify
from harness.train.reference import lookup
from harness.train.run import execute

from conftest import REPO, cli_in_process, stderr_error_lines

pytestmark = pytest.mark.quick

WORKLOADS = ("resnet", "bert", "transformer", "ssd", "llama31_8b", "gpt_oss_20b", "llama2_70b_lora")
SOURCE = "written by tests/test_data_verify.py"


def config(workload: str, name: str = "reference.yaml") -> str:
    return os.path.join(REPO, "configs", workload, name)


def md5(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def write_manifest(path: str, workload: str, sets: dict) -> str:
    with open(path, "w") as f:
        yaml.safe_dump({"workload": workload, "sets": sets}, f)
    return path


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, dict]:
    """Tiny data in each reference layout and a manifest of its facts, per workload: {folder, manifest, sets}."""
    from benchmarks.llama2_70b_lora.data import write_parquet
    from benchmarks.lm import indexed_dataset
    from benchmarks.resnet.tfrecord_writer import write_imagenet_tfrecords

    root = tmp_path_factory.mktemp("verify")
    out = {}

    folder = str(root / "imagenet")
    train, val = write_imagenet_tfrecords(folder, 12, 5, image_size=16, num_classes=4, train_shards=4,
                                          eval_shards=2)
    sized = os.path.basename(train[0])
    out["resnet"] = {"folder": folder, "sets": ["--set", "data.data_dir=" + folder], "manifest": write_manifest(
        str(root / "resnet.yaml"), "resnet", {
            "train": {"data_source": ["tfrecord"], "dir": "data.data_dir", "glob": "data.train_pattern",
                      "names": {"template": "train-{index:05d}-of-00004", "count": 4, "source": SOURCE},
                      "records": {"value": 12, "counter": "tfrecords", "source": SOURCE},
                      "files": {sized: {"size": {"value": os.path.getsize(train[0]), "source": SOURCE}},
                                os.path.basename(train[3]): {"md5": {"value": md5(train[3]), "source": SOURCE}}}},
            "eval": {"data_source": ["tfrecord"], "dir": "data.data_dir", "glob": "data.eval_pattern",
                     "names": {"template": "validation-{index:05d}-of-00002", "count": 2, "source": SOURCE},
                     "records": {"value": 5, "counter": "tfrecords", "source": SOURCE},
                     "total_size": {"value": sum(os.path.getsize(p) for p in val), "source": SOURCE}}})}

    folder = str(root / "lora")
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    for name, n in (("train-00000-of-00001.parquet", 6), ("validation-00000-of-00001.parquet", 3)):
        ids = rng.integers(4, 100, size=(n, 16))
        write_parquet(os.path.join(folder, name), ids, ids)
    out["llama2_70b_lora"] = {"folder": folder, "sets": ["--set", "data.data_dir=" + folder], "manifest":
                              write_manifest(str(root / "lora.yaml"), "llama2_70b_lora", {
                                  split: {"data_source": ["parquet"], "dir": "data.data_dir", "file": key,
                                          "any_name": {"list": [name], "source": SOURCE},
                                          "records": {"value": n, "counter": "parquet_rows", "source": SOURCE}}
                                  for split, key, name, n in (
                                      ("train", "data.train_file", "train-00000-of-00001.parquet", 6),
                                      ("eval", "data.eval_file", "validation-00000-of-00001.parquet", 3))})}

    folder = str(root / "c4")
    os.makedirs(folder)
    docs = [rng.integers(1, 500, size=int(k)) for k in rng.integers(20, 60, size=9)]
    indexed_dataset.write(os.path.join(folder, "c4-train.en_6_text_document"), docs[:6])
    indexed_dataset.write(os.path.join(folder, "c4-validation-91205-samples.en_text_document"), docs[6:])
    out["llama31_8b"] = {"folder": folder, "sets": ["--set", "data.data_dir=" + folder], "manifest":
                         write_manifest(str(root / "c4.yaml"), "llama31_8b", {
                             "eval": {"data_source": ["indexed"], "dir": "data.data_dir", "prefix": "data.eval_prefix",
                                      "records": {"value": 3, "counter": "indexed_sequences", "source": SOURCE},
                                      "files": {f"c4-validation-91205-samples.en_text_document{ext}": {"size": {
                                          "value": os.path.getsize(os.path.join(
                                              folder, f"c4-validation-91205-samples.en_text_document{ext}")),
                                          "source": SOURCE}} for ext in (".bin", ".idx")}}})}
    return out


def copy_of(good: dict, workload: str, tmp_path) -> tuple[str, list[str]]:
    """A copy of the good set to break, and the --set overrides that read it."""
    folder = str(tmp_path / workload)
    shutil.copytree(good[workload]["folder"], folder)
    return folder, ["--set", "data.data_dir=" + folder]


def verify(workload: str, sets: list[str], manifest: str | None, hashes: bool = False) -> data_verify.Report:
    overrides = [s for s in sets if s != "--set"]
    return data_verify.verify_config(config(workload), overrides, hashes, manifest)[1]


# ------------------------------------------------------------------------------------------ good sets

@pytest.mark.parametrize("workload", ["resnet", "llama2_70b_lora", "llama31_8b"])
def test_the_references_layouts_pass(good, workload):
    g = good[workload]
    report = verify(workload, g["sets"], g["manifest"], hashes=True)
    assert report.errors == [], report.errors
    assert report.checked, "a pass says what it checked"
    summary = " | ".join(report.checked)
    expected = {"resnet": ["12 records", "5 records", "1 hash", "1 published size", "the published total size"],
                "llama2_70b_lora": ["6 rows", "3 rows"], "llama31_8b": ["3 sequences", "2 published sizes"]}
    for part in expected[workload]:
        assert part in summary, summary


def test_cli_prints_the_summary_and_one_error_line_per_difference(good, tmp_path):
    g = good["resnet"]
    proc = cli_in_process("data", "verify", config("resnet"), *g["sets"], "--manifest", g["manifest"])
    assert proc.returncode == 0 and stderr_error_lines(proc) == [], proc.stderr
    assert proc.stdout.startswith("resnet data matches ") and "train (" in proc.stdout and "12 records" in proc.stdout
    # the shipped manifest: the 4-shard test set is not the reference's 1024 + 128 shards
    proc = cli_in_process("data", "verify", config("resnet"), *g["sets"])
    errors = stderr_error_lines(proc)
    assert proc.returncode == 2 and len(errors) == 2, proc.stderr
    assert "none named as the reference's 1024 train files (train-00000-of-01024 ... train-01023-of-01024" in errors[0]
    assert "none named as the reference's 128 eval files" in errors[1]
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------ differences

def test_truncated_file_is_named_with_its_size_or_its_broken_record(good, tmp_path):
    folder, sets = copy_of(good, "resnet", tmp_path)
    path = os.path.join(folder, "train-00000-of-00004")  # its size is published
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    assert verify("resnet", sets, good["resnet"]["manifest"]).errors == [
        f"{path}: {size - 100} bytes, the reference's is {size} bytes (source: {SOURCE})"]
    shutil.copy(os.path.join(good["resnet"]["folder"], "train-00000-of-00004"), path)
    other = os.path.join(folder, "train-00002-of-00004")  # no published size: the record count finds it
    with open(other, "r+b") as f:
        f.truncate(os.path.getsize(other) - 100)
    errors = verify("resnet", sets, good["resnet"]["manifest"]).errors
    assert len(errors) == 1 and errors[0].startswith(f"{other} is corrupt or truncated"), errors


def test_renamed_file_is_named_with_what_was_found(good, tmp_path):
    folder, sets = copy_of(good, "resnet", tmp_path)
    os.rename(os.path.join(folder, "train-00001-of-00004"), os.path.join(folder, "train-00001-of-00004.bak"))
    assert verify("resnet", sets, good["resnet"]["manifest"]).errors == [
        f"{folder}/train-00001-of-00004: missing; found train-00001-of-00004.bak instead, which is not a file of "
        f"the reference's layout (4 train files; source: {SOURCE})"]
    os.rename(os.path.join(folder, "train-00001-of-00004.bak"), os.path.join(folder, "old-train-1"))
    assert verify("resnet", sets, good["resnet"]["manifest"]).errors == [
        f"{folder}/train-00001-of-00004: missing (the reference's layout has 4 train files; source: {SOURCE})"]


def test_altered_file_passes_the_cheap_checks_and_is_caught_by_hashes(good, tmp_path):
    folder, sets = copy_of(good, "resnet", tmp_path)
    path = os.path.join(folder, "train-00003-of-00004")  # its md5 is published
    manifest = good["resnet"]["manifest"]
    assert verify("resnet", sets, manifest, hashes=True).errors == []  # hashed and cached beside the data
    cache = os.path.join(folder, data_verify.HASH_CACHE)
    assert os.path.isfile(cache)
    published = md5(path)
    stat = os.stat(path)
    with open(path, "r+b") as f:  # one byte inside a record's payload: same size, same record count
        f.seek(stat.st_size // 2)
        byte = f.read(1)
        f.seek(stat.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert os.path.getsize(path) == stat.st_size
    report = verify("resnet", sets, manifest)
    assert report.errors == [] and "1 published hash not checked (--hashes)" in " ".join(report.checked)
    # the cached hash is of the file before the change (another mtime): it is hashed again
    assert verify("resnet", sets, manifest, hashes=True).errors == [
        f"{path}: md5 {md5(path)}, the reference's is {published} (source: {SOURCE})"]


def test_row_and_sequence_counts_against_the_shipped_manifests(good):
    errors = verify("llama2_70b_lora", good["llama2_70b_lora"]["sets"], None).errors
    folder = good["llama2_70b_lora"]["folder"]
    assert errors == [
        f"{folder}/train-00000-of-00001.parquet: 6 rows, the reference's train set has 3901 (source: "
        "https://huggingface.co/datasets/regisss/scrolls_gov_report_preprocessed_mlperf_2)",
        f"{folder}/validation-00000-of-00001.parquet: 3 rows, the reference's eval set has 173 (source: "
        "https://huggingface.co/datasets/regisss/scrolls_gov_report_preprocessed_mlperf_2)"]
    errors = verify("llama31_8b", good["llama31_8b"]["sets"], None).errors
    folder = good["llama31_8b"]["folder"]
    assert len(errors) == 4 and all(" bytes, the reference's is " in e for e in errors), errors
    assert errors[0].startswith(f"{folder}/c4-train.en_6_text_document.bin: ")
    assert "is 166568364 bytes (source: https://github.com/mlcommons/training_results_v5.1/" in errors[2]


# ------------------------------------------------------------------------------------------ shipped manifests

@pytest.mark.parametrize("workload", WORKLOADS)
def test_shipped_manifest_names_keys_its_configs_have(workload):
    manifest = data_verify.load_manifest(workload)
    cfg = config_lib.load_config(config(workload), [])
    sources = type(cfg.data).__dataclass_fields__["source"].metadata.get("choices") or ()
    assert manifest.sets
    for fs in manifest.sets:
        assert lookup(cfg, fs.key) is not None, (fs.name, fs.key)
        assert fs.dir_key is None or lookup(cfg, fs.dir_key) is not None, (fs.name, fs.dir_key)
        assert fs.data_sources and set(fs.data_sources) <= set(sources), (fs.data_sources, sources)
        facts = [fs.names, fs.any_name, fs.records, fs.total_size, *fs.sizes.values(),
                 *(f for h in fs.hashes.values() for f in h.values())]
        assert any(facts), f"{fs.name}: a set with nothing published to check"
        assert all(f.source.startswith(("https://", "mlcommons/")) for f in facts if f), fs.name
        if not (fs.records and fs.sizes and fs.hashes):
            assert fs.unsourced or manifest.note, f"{fs.name}: say which values are not published"


def test_a_value_without_its_source_is_refused(tmp_path):
    path = write_manifest(str(tmp_path / "m.yaml"), "resnet", {"train": {
        "data_source": ["tfrecord"], "dir": "data.data_dir", "glob": "data.train_pattern",
        "records": {"value": 3, "counter": "tfrecords"}}})
    with pytest.raises(HarnessError, match=r"sets.train.records: a published value needs `value` and `source`"):
        data_verify.load_manifest("resnet", path)


# ------------------------------------------------------------------------------------------ closed runs

def test_closed_run_on_other_data_is_refused_before_its_log(good, tmp_path):
    out = str(tmp_path / "runs")
    overrides = ["runtime.kind=default", "data.data_dir=" + good["resnet"]["folder"], f"output_dir={out}"]
    with pytest.raises(HarnessError) as e:
        execute(config("resnet"), overrides)
    message = str(e.value)
    assert message.startswith(f"closed division needs the reference's data: {good['resnet']['folder']}/train-*-of-*: "
                              "4 files (train-00000-of-00004 ... train-00003-of-00004), none named as the "
                              "reference's 1024 train files"), message
    assert "(and 1 more difference: mlperf-harness data verify CONFIG lists them)" in message
    assert "\n" not in message and not os.path.exists(out)


def test_open_runs_and_synthetic_data_skip_the_check(good):
    from benchmarks import registry
    from harness.config import RuntimeConfig
    from harness.runtime import make_runtime

    runtime = make_runtime(RuntimeConfig())
    for overrides, said in ((["submission.division=open", "data.data_dir=" + good["resnet"]["folder"]],
                             "skipped (open division)"),
                            (["data.source=synthetic"], "skipped (synthetic data)")):
        cfg = config_lib.load_config(config("resnet"), overrides)
        assert data_verify.check_closed_data(registry.get("resnet")(cfg, runtime)) == f"data verify: {said}"
    # a closed run on the data its manifest describes passes, saying what it checked
    cfg = config_lib.load_config(config("resnet"), ["data.data_dir=" + good["resnet"]["folder"]])
    said = data_verify.check_closed_data(registry.get("resnet")(cfg, runtime), good["resnet"]["manifest"])
    assert said.startswith("data verify: ") and "train (" in said and "12 records" in said, said
