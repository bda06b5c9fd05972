"""`mlperf-harness data verify` (harness/data/verify.py): data files in the references' layouts (ResNet,
SSD with the Object Detection API's names, the Transformer, BERT, LoRA, C4), written by the repo's own
writers, pass against a small manifest in the shipped format; a truncated, a renamed and an altered file each
give one line naming the file and what differs (a large altered file with --hashes, a small one always, a
copied one even with its cache copied along); a malformed manifest is one line naming its field; an advisory
value gives a warning, not a refusal; the shipped manifests load with a source on every value and name keys
the configs have; and a closed run on data that differs is refused in one line before its log opens.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import numpy as np
import pytest
import yaml

from harness import config as config_lib
from harness.errors import HarnessError
from harness.data import verify as data_verify
from harness.train import datafiles
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
    # SSD: the TF Object Detection API converter's names (coco_train.record-*), which the source reads when the
    # config's train-* / val-* match nothing, and the val2017 annotations by their reference name
    from benchmarks.ssd import tfrecord_writer as ssd_writer

    folder = str(root / "coco")
    written = ssd_writer.write_synthetic(folder, 6, 4, image_size=32, num_shards=2)
    for split, api in (("train", "coco_train.record"), ("val", "coco_val.record")):
        for i, path in enumerate(written[split]):
            os.rename(path, os.path.join(folder, f"{api}-{i:05d}-of-00002"))
    annotations = os.path.join(folder, "instances_val2017.json")
    os.rename(written["val_json"], annotations)
    out["ssd"] = {"folder": folder, "sets": ["--set", "data.data_dir=" + folder,
                                             "--set", "data.annotation_file=" + annotations],
                  "manifest": write_manifest(str(root / "ssd.yaml"), "ssd", {
                      "train": {"data_source": ["tfrecord"], "dir": "data.data_dir", "glob": "data.train_pattern",
                                "instead": {"train-*": "coco_train.record-*"},
                                "records": {"value": 6, "counter": "tfrecords", "source": SOURCE}},
                      "eval": {"data_source": ["tfrecord"], "dir": "data.data_dir", "glob": "data.eval_pattern",
                               "instead": {"val-*": "coco_val.record-*"},
                               "records": {"value": 4, "counter": "tfrecords", "source": SOURCE}},
                      "annotations": {"data_source": ["tfrecord"], "file": "data.annotation_file",
                                      "any_name": {"list": ["instances_val2017.json"], "source": SOURCE}}})}

    # the Transformer: wmt32k-encoded-train-* shards numbered from 1, the vocabulary, newstest2014.en / .de
    from benchmarks.transformer import tfrecord_writer as wmt_writer

    folder = str(root / "wmt")
    data = wmt_writer.write_synthetic(folder, 12, 5, shards=2)
    for i in (1, 2):
        os.rename(os.path.join(folder, f"synthetic-encoded-train-{i:05d}-of-00002"),
                  os.path.join(folder, f"wmt32k-encoded-train-{i:05d}-of-00002"))
    files = {"vocab": data["vocab_file"], "eval_source": data["eval_source_file"],
             "eval_reference": data["eval_reference_file"]}

    def lines(path: str) -> int:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    out["transformer"] = {"folder": folder, "sets": [a for k in ("data_dir", "vocab_file", "eval_source_file",
                                                                 "eval_reference_file")
                                                     for a in ("--set", f"data.{k}={data[k]}")],
                          "manifest": write_manifest(str(root / "wmt.yaml"), "transformer", {
                              "train": {"data_source": ["tfrecord"], "dir": "data.data_dir",
                                        "glob": "data.train_pattern",
                                        "names": {"template": "wmt32k-encoded-train-{index:05d}-of-00002",
                                                  "start": 1, "count": 2, "source": SOURCE}},
                              **{name: {"data_source": ["tfrecord"], "file": f"data.{name}_file",
                                        "any_name": {"list": [os.path.basename(path)], "source": SOURCE},
                                        "records": {"value": lines(path), "counter": "lines", "source": SOURCE},
                                        "files": {os.path.basename(path): {
                                            "size": {"value": os.path.getsize(path), "source": SOURCE},
                                            "md5": {"value": md5(path), "source": SOURCE}}}}
                                 for name, path in files.items()}})}

    # BERT: part-NNNNN-of-NNNNN training shards and eval_10k, in the reference's TFRecord format
    from benchmarks.bert import tfrecord_writer as bert_writer

    folder = str(root / "bert")
    os.makedirs(folder)

    def examples(n: int):
        for i in range(n):
            yield {"input_ids": np.arange(i, i + 8), "input_mask": np.ones(8), "segment_ids": np.zeros(8),
                   "masked_lm_positions": np.array([1, 2]), "masked_lm_ids": np.array([5, 6]),
                   "masked_lm_weights": np.ones(2), "next_sentence_labels": np.array([i % 2])}
    parts = [os.path.join(folder, f"part-{i:05d}-of-00002") for i in range(2)]
    for i, path in enumerate(parts):
        bert_writer.write(path, examples(3 + i))
    bert_writer.write(os.path.join(folder, "eval_10k"), examples(4))
    out["bert"] = {"folder": folder, "sets": ["--set", "data.data_dir=" + folder], "manifest": write_manifest(
        str(root / "bert.yaml"), "bert", {
            "train": {"data_source": ["tfrecord"], "dir": "data.data_dir", "glob": "data.train_pattern",
                      "names": {"template": "part-{index:05d}-of-00002", "count": 2, "source": SOURCE},
                      "files": {"part-00000-of-00002": {"size": {"value": os.path.getsize(parts[0]),
                                                                 "source": SOURCE}}},
                      "total_size": {"value": sum(os.path.getsize(p) for p in parts), "source": SOURCE}},
            "eval": {"data_source": ["tfrecord"], "dir": "data.data_dir", "glob": "data.eval_pattern",
                     "names": {"list": ["eval_10k"], "source": SOURCE},
                     "records": {"value": 4, "counter": "tfrecords", "source": SOURCE}}})}
    return out


def flip_byte(path: str, at: int, to: bytes | None = None) -> None:
    """One byte of the file changed in place (to `to`, else inverted), its size and mtime restored as
    `touch -r` would: only the contents differ."""
    stat = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(to if to is not None else bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.path.getsize(path) == stat.st_size and os.stat(path).st_mtime_ns == stat.st_mtime_ns


def copy_of(good: dict, workload: str, tmp_path) -> tuple[str, list[str]]:
    """A copy of the good set to break, and the --set overrides that read it."""
    folder = str(tmp_path / workload)
    shutil.copytree(good[workload]["folder"], folder)
    return folder, ["--set", "data.data_dir=" + folder]


def verify(workload: str, sets: list[str], manifest: str | None, hashes: bool = False) -> data_verify.Report:
    overrides = [s for s in sets if s != "--set"]
    return data_verify.verify_config(config(workload), overrides, hashes, manifest)[1]


# ------------------------------------------------------------------------------------------ good sets

@pytest.mark.parametrize("workload", ["resnet", "llama2_70b_lora", "llama31_8b", "ssd", "transformer", "bert"])
def test_the_references_layouts_pass(good, workload):
    g = good[workload]
    report = verify(workload, g["sets"], g["manifest"], hashes=True)
    assert report.errors == [] and report.warnings == [], (report.errors, report.warnings)
    assert report.checked, "a pass says what it checked"
    summary = " | ".join(report.checked)
    expected = {"resnet": ["12 records", "5 records", "1 hash", "1 published size", "the published total size"],
                "llama2_70b_lora": ["6 rows", "3 rows"], "llama31_8b": ["3 sequences", "2 published sizes"],
                "ssd": [f"train ({g['folder']}/coco_train.record-*): 2 files; 6 records",
                        f"eval ({g['folder']}/coco_val.record-*): 2 files; 4 records",
                        "annotations (", "instances_val2017.json): 1 file named as published"],
                "transformer": ["train (", "2 files named as published", "vocab (", "eval_source (",
                                "eval_reference (", "320 lines; 1 hash", "5 lines; 1 hash"],
                "bert": ["train (", "2 files named as published; 1 published size; the published total size",
                         "eval (", "4 records"]}
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


def test_altered_large_file_passes_the_cheap_checks_and_is_caught_by_hashes(good, tmp_path, monkeypatch):
    monkeypatch.setattr(data_verify, "SMALL_FILE_BYTES", 0)  # the test's file stands in for one over the limit
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
    assert report.errors == [] and "1 published hash of files over 0 MB not checked (--hashes)" in \
        " ".join(report.checked)
    # the cached hash is of the file before the change (another mtime): it is hashed again
    assert verify("resnet", sets, manifest, hashes=True).errors == [
        f"{path}: md5 {md5(path)}, the reference's is {published} (source: {SOURCE})"]


def test_a_copy_with_its_caches_is_read_again_not_vouched_for(good, tmp_path):
    """`cp -a` (as `rsync -a`) copies the cache files along and keeps every file's size and mtime; a byte
    changed in the copy with its mtime restored must still be found, in a hash and in a line count."""
    src, _ = copy_of(good, "resnet", tmp_path / "a")
    manifest = good["resnet"]["manifest"]
    assert verify("resnet", ["data.data_dir=" + src], manifest, hashes=True).errors == []
    assert os.path.isfile(os.path.join(src, data_verify.HASH_CACHE))
    dst = str(tmp_path / "copy")
    subprocess.run(["cp", "-a", src, dst], check=True)
    assert os.path.isfile(os.path.join(dst, data_verify.HASH_CACHE))
    path = os.path.join(dst, "train-00003-of-00004")  # its md5 is published
    flip_byte(path, os.path.getsize(path) // 2)
    assert verify("resnet", ["data.data_dir=" + dst], manifest, hashes=True).errors == [
        f"{path}: md5 {md5(path)}, the reference's is {md5(os.path.join(src, 'train-00003-of-00004'))} "
        f"(source: {SOURCE})"]

    g = good["transformer"]
    src = str(tmp_path / "wmt")
    shutil.copytree(g["folder"], src)
    sets = [s.replace(g["folder"], src) for s in g["sets"] if s != "--set"]
    assert verify("transformer", sets, g["manifest"]).errors == []  # line counts cached beside the data
    assert os.path.isfile(os.path.join(src, datafiles.COUNT_CACHE))
    dst = str(tmp_path / "wmt-copy")
    subprocess.run(["cp", "-a", src, dst], check=True)
    path = os.path.join(dst, "newstest2014.de")
    with open(path, "rb") as f:
        first = f.read().index(b" ")
    flip_byte(path, first, b"\n")  # a space made a line break: one line more, same size
    assert verify("transformer", [s.replace(src, dst) for s in sets], g["manifest"]).errors == [
        f"{path}: 6 lines, the reference's eval_reference set has 5 (source: {SOURCE})"]


def test_small_file_with_a_published_hash_is_hashed_without_being_asked(good, tmp_path):
    """An altered eval reference of the same size and line count changes the score: caught by every check."""
    g = good["transformer"]
    folder = str(tmp_path / "wmt")
    shutil.copytree(g["folder"], folder)
    sets = [s.replace(g["folder"], folder) for s in g["sets"]]
    path = os.path.join(folder, "newstest2014.de")
    published = md5(path)
    flip_byte(path, 0, b"#")
    proc = cli_in_process("data", "verify", config("transformer"), *sets, "--manifest", g["manifest"])
    assert proc.returncode == 2 and stderr_error_lines(proc) == [
        f"error: {path}: md5 {md5(path)}, the reference's is {published} (source: {SOURCE})"], proc.stderr


def test_closed_run_on_an_altered_eval_reference_is_refused_before_its_log(good, tmp_path, monkeypatch):
    g = good["transformer"]
    folder = str(tmp_path / "wmt")
    shutil.copytree(g["folder"], folder)
    path = os.path.join(folder, "newstest2014.de")
    published = md5(path)
    flip_byte(path, 0, b"#")
    monkeypatch.setattr(data_verify, "manifest_path", lambda workload: g["manifest"])  # the test's stand-in
    # the test's vocabulary (320 subwords) is not the reference model's 33,708, which that check (tested in
    # tests/test_closed_reference.py) would refuse first
    from harness.train import reference

    monkeypatch.setattr(reference, "check_closed_model", lambda workload: None)
    out = str(tmp_path / "runs")
    overrides = ["runtime.kind=default", "runtime.allow_platform_mismatch=true", f"output_dir={out}"] + [
        s.replace(g["folder"], folder) for s in g["sets"] if s != "--set"]
    with pytest.raises(HarnessError) as e:
        execute(config("transformer"), overrides)
    assert str(e.value) == (f"closed division needs the reference's data: {path}: md5 {md5(path)}, the "
                            f"reference's is {published} (source: {SOURCE}); use submission.division=open for "
                            f"other data")
    assert not os.path.exists(out)


def test_advisory_values_give_warnings_not_refusals(good, tmp_path):
    g = good["bert"]
    with open(g["manifest"]) as f:
        sets = yaml.safe_load(f)["sets"]
    size = sets["train"]["files"]["part-00000-of-00002"]["size"]
    size.update(value=size["value"] + 1, advisory="the table may be of another generation")
    path = write_manifest(str(tmp_path / "bert.yaml"), "bert", sets)
    proc = cli_in_process("data", "verify", config("bert"), *g["sets"], "--manifest", path)
    part = os.path.join(g["folder"], "part-00000-of-00002")
    assert proc.returncode == 0 and stderr_error_lines(proc) == [], proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("warning:")] == [
        f"warning: {part}: {size['value'] - 1} bytes, the reference's is {size['value']} bytes (source: {SOURCE}; "
        f"advisory, so a warning only: the table may be of another generation)"]
    # the shipped manifest: BERT's TFRecord sizes are advisory, its eval record count is not
    eval_dir = str(tmp_path / "eval")
    os.makedirs(eval_dir)
    shutil.copy(os.path.join(g["folder"], "eval_10k"), eval_dir)
    report = verify("bert", ["data.data_dir=" + eval_dir, "data.train_pattern=none-*"], None)
    eval_file = os.path.join(eval_dir, "eval_10k")
    assert len(report.warnings) == 1 and report.warnings[0].startswith(
        f"{eval_file}: {os.path.getsize(eval_file)} bytes, the reference's is 25382591 bytes"), report.warnings
    assert report.errors[-1].startswith(f"{eval_file}*: 4 records, the reference's eval set has 10000"), \
        report.errors


@pytest.mark.parametrize("edit,field", [
    (lambda t: t.update(files=["a", "b"]), "sets.train.files must map each file name"),
    (lambda t: t["names"].update(template="train-{idx}-of-00004"), "sets.train.names.template 'train-{idx}-of-00004'"),
    (lambda t: t["names"].update(template="train-of-00004"), "sets.train.names.template 'train-of-00004' must hold"),
    (lambda t: t["files"]["train-00000-of-00004"]["size"].update(value="abc"),
     "sets.train.files.train-00000-of-00004.size.value must be an integer >= 0, not 'abc'"),
    (lambda t: t["records"].update(value=12.5), "sets.train.records.value must be an integer >= 0, not 12.5"),
    (lambda t: t["files"]["train-00003-of-00004"]["md5"].update(value="xyz"),
     "sets.train.files.train-00003-of-00004.md5.value must be 32 hex digits"),
])
def test_a_malformed_manifest_is_one_line_naming_the_field(good, tmp_path, edit, field):
    with open(good["resnet"]["manifest"]) as f:
        sets = yaml.safe_load(f)["sets"]
    edit(sets["train"])
    path = write_manifest(str(tmp_path / "bad.yaml"), "resnet", sets)
    proc = cli_in_process("data", "verify", config("resnet"), *good["resnet"]["sets"], "--manifest", path)
    errors = stderr_error_lines(proc)
    assert proc.returncode == 2 and len(errors) == 1 and errors[0].startswith(f"error: {path}: {field}"), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args", [("check", "result_0.txt", "--hashes"), ("plan", "x.yaml", "--manifest", "m.yaml"),
                                  ("data", "count", "x.yaml", "--hashes")])
def test_hashes_and_manifest_are_refused_where_nothing_reads_them(args):
    proc = cli_in_process(*args)
    assert proc.returncode == 2 and stderr_error_lines(proc) == [
        "error: --hashes and --manifest go with `data verify`"], proc.stderr


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
