"""Faults and bad inputs that once ended in a traceback, a hang, a wrong success or an unclear line: each now
one `error:` line with its exit code, or the documented behaviour. Cheap on purpose: in process where the
case allows, one small subprocess where it needs a process of its own.

Where each case of the last fault run is tested:
- here: YAML nested deep, alias bombs (312 MB line, MemoryError), a 100 MB config; a log with a 50 MB line;
  config.json numbers as strings; two exports into one folder; a campaign killed by SIGKILL; SIGINT inside
  the TensorFlow import; LoRA train/eval splits that score no token; `data count` on indexed files; a
  non-UTF-8 manifest; a full disk under the log; a bad label or image in a ResNet eval shard met mid-run.
- tests/test_hf_offpath.py: safetensors cut short, offsets past the end, a lying dtype (import), damaged final
  weights (export). tests/test_cli_help.py: a flag the command does not read, a closed stdout.
  tests/test_rcp_public.py: copies of one pilot. tests/test_data_service.py: Ctrl-C to a dispatcher and its
  workers (the fleet fixture's teardown). tests/test_campaign_package.py: SIGTERM to `package`.
Not made clean, and why: a TFRecord failing its checksum mid-run ("corrupted record at N") still names no
shard: the error is raised inside tf.data's C++ reader, which does not say which file it was reading, and
finding it means re-reading the shards (all of ImageNet's, for an eval error) after the failure; the line
says the data are corrupt (`data verify --hashes` names a file whose published hash it no longer matches,
for the sets whose references publish hashes).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from harness.errors import HarnessError

from conftest import REPO, cli_in_process, stderr_error_lines

pytestmark = pytest.mark.quick


def one_error(proc, words: str) -> str:
    lines = stderr_error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


# ------------------------------------------------------------------------------------------ configs

def config_refusal(path) -> str:
    """The HarnessError the config reader raises (the CLI prints it as its one `error:` line)."""
    from harness import config as config_lib

    with pytest.raises(HarnessError) as e:
        config_lib.load_config(str(path), [])
    assert "\n" not in str(e.value)
    return str(e.value)


def test_deeply_nested_yaml_is_one_line(tmp_path):
    flow = tmp_path / "flow.yaml"
    flow.write_text("model: " + "[" * 20000 + "]" * 20000 + "\n")
    assert "flow.yaml" in config_refusal(flow)
    block = tmp_path / "block.yaml"
    block.write_text("model:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(60)) + "  " * 61 + "v: 1\n")
    assert "nested more than 50 levels deep" in config_refusal(block)


@pytest.mark.parametrize("levels", [9, 10])
def test_yaml_alias_bombs_are_one_short_line(tmp_path, levels):
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines + [f"check_rulesets: *a{levels - 1}"]) + "\n")
    line = config_refusal(path)
    assert "once its YAML aliases are expanded" in line and len(line) < 300


def test_a_huge_config_is_refused_by_size(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("model: {note: '" + "a" * 1_100_000 + "'}\n")
    assert "a config is a few KB" in config_refusal(path)


# ------------------------------------------------------------------------------------------ logs

def test_a_log_with_one_huge_line_is_named_not_checked_forever(tmp_path):
    from harness.review import logparse

    path = tmp_path / "huge_line.txt"
    head = ':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "submission_benchmark", ' \
           '"value": "resnet", "metadata": {}}\n'
    path.write_text(head + ":::MLLOG " + "x" * (logparse.MAX_LINE_CHARS + 10) + "\n")
    one_error(cli_in_process("check", str(path)), "line 2 is longer than 1,000,000 characters")


# ------------------------------------------------------------------------------------------ checkpoints

def test_a_string_number_in_config_json_names_its_type():
    from harness.nn.hf_checkpoint import Checker

    c = Checker({"hidden_size": "64", "rms_norm_eps": 1e-5, "num_layers": 2})
    c.same("hidden_size", 64, "model.hidden_size")
    c.same("rms_norm_eps", 1e-5, "model.norm_epsilon", close=True)
    c.same("num_layers", 2, "model.num_layers")
    assert c.problems == ["config.json hidden_size='64' is str, not int (the model has model.hidden_size=64)"]


def test_two_exports_into_one_new_folder_never_mix(tmp_path, monkeypatch):
    """Fault case: two exports 0.3 s apart both succeeded into one folder. The second to finish now finds the
    folder filled and says so; the first's files are whole."""
    from harness.export import weights as export

    out = tmp_path / "same"

    def fake_export(run_dir, staging, max_shard, dtype, merged=False):
        if not out.exists():   # the other export finishes first, while this one is writing
            out.mkdir()
            (out / "config.json").write_text("{}")
        with open(os.path.join(staging, "model.safetensors"), "w") as f:
            f.write("mine")
        return ["model.safetensors"]

    monkeypatch.setattr(export, "export", fake_export)
    with pytest.raises(HarnessError, match="filled by another writer while this export ran"):
        export.main([str(tmp_path / "run")], str(out), "5GB", "float32")
    assert sorted(os.listdir(out)) == ["config.json"]
    assert [p for p in os.listdir(tmp_path) if "partial" in p] == []   # its staging folder is gone


# ------------------------------------------------------------------------------------------ processes

def test_a_campaigns_run_ends_when_the_campaign_is_killed(tmp_path):
    """Fault case: SIGKILL to a campaign left its run training. The run is started with a death signal."""
    parent = (
        "import subprocess, sys, time\n"
        "from harness.submission.campaign import end_with_parent\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], preexec_fn=end_with_parent)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        child = int(proc.stdout.readline())
        proc.kill()
        proc.wait(timeout=30)
        for _ in range(300):   # up to 30 s for the kernel's signal and the child's exit
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{child}/stat") as f:
                if f.read().split()[2] == "Z":   # ended, not yet reaped by init
                    break
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("the campaign's run outlived the campaign")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_an_interrupt_during_the_tensorflow_import_replays_nothing(capfd):
    """Fault case: SIGINT inside `import tensorflow` printed TensorFlow's captured start-up lines before the
    error line. The captured lines are replayed for a failed import only, not for an interrupt."""
    from harness import cli

    class Loader:
        def create_module(self, spec):
            return None

        def exec_module(self, module, error=KeyboardInterrupt):
            os.write(2, b"I0000 start-up line\n")
            raise error()

    with pytest.raises(KeyboardInterrupt):
        cli._QuietLoader(Loader()).exec_module(None)
    assert capfd.readouterr().err == ""

    class Failing(Loader):
        def exec_module(self, module):
            super().exec_module(module, ImportError)

    with pytest.raises(ImportError):
        cli._QuietLoader(Failing()).exec_module(None)
    assert "I0000 start-up line" in capfd.readouterr().err


# ------------------------------------------------------------------------------------------ data

@pytest.mark.parametrize("split", ["train", "eval"])
def test_a_lora_split_that_scores_nothing_is_one_line_before_the_log(tmp_path, split):
    """Fault cases: eval rows with every label -100 gave "eval loss 0.0000" and a successful, checker-passing
    run; train rows so gave a non-finite loss at step 8. Refused when the source is checked, before the log."""
    import numpy as np

    from benchmarks.llama2_70b_lora.data import IGNORE, LoraData, LoraDataConfig, write_parquet

    rng = np.random.default_rng(0)
    for name, rows in (("train", 7), ("eval", 5)):
        ids = rng.integers(0, 32, size=[rows, 16]).astype(np.int32)
        labels = ids.copy()
        if name == split:
            labels[:, 1:] = IGNORE   # the first position's label never counts (the model shifts labels)
        file = "train-00000-of-00001.parquet" if name == "train" else "validation-00000-of-00001.parquet"
        write_parquet(str(tmp_path / file), ids, labels)
    data = LoraData(LoraDataConfig(source="parquet", data_dir=str(tmp_path), eval_samples=5), 16, 32)
    with pytest.raises(HarnessError, match="every label past each row's first position is -100") as e:
        data.validate()
    assert ("nothing to learn from" if split == "train" else "eval would score nothing") in str(e.value)


def test_data_count_reads_indexed_files(tmp_path):
    """Fault case: `data count` on indexed files said "has no files to count"."""
    import numpy as np

    from benchmarks.lm import indexed_dataset
    from benchmarks.lm.config import DataConfig
    from benchmarks.lm.data import Source

    rng = np.random.default_rng(0)
    indexed_dataset.write(str(tmp_path / "train"), [rng.integers(1, 60, 200) for _ in range(5)])
    indexed_dataset.write(str(tmp_path / "eval"), [rng.integers(1, 60, 100)])
    cfg = DataConfig(source="indexed", data_dir=str(tmp_path), train_prefix="train", eval_prefix="eval",
                     seq_length=32, eval_samples=1)
    # the train file's rows; not the eval file's, whose first eval_samples rows the rules fix
    assert Source(cfg, 64).counts() == {"train_samples": (1000 - 1) // 32}
    assert Source(DataConfig(source="synthetic"), 64).counts() == {}


def test_a_non_utf8_manifest_is_named(tmp_path):
    """Fault case: `data verify --manifest` on a non-UTF-8 file said "input is not UTF-8 text" naming no file."""
    from harness.data import verify as data_verify

    path = tmp_path / "manifest.yaml"
    path.write_bytes(b"workload: resnet\nnote: \xff\xfe\n")
    with pytest.raises(HarnessError) as e:
        data_verify.load_manifest("resnet", str(path))
    assert str(e.value).startswith(f"{path}: not UTF-8 text (byte b'\\xff'")


def test_a_failed_log_write_stops_with_one_line_naming_the_log(tmp_path):
    """Fault case: a full disk during a run gave a `--- Logging error ---` traceback per line while the run
    trained on. The first failed write raises an OSError naming the log (the CLI's one `error:` line, exit 2);
    later writes and the close add nothing."""
    from harness.errors import describe_os_error
    from harness.mlperf import MLPerfLog

    path = str(tmp_path / "result_1.txt")
    log = MLPerfLog(path)
    log.event("submission_benchmark", "resnet")
    log._handler.stream = open("/dev/full", "w")   # writes fail as on a full disk (ENOSPC)
    with pytest.raises(OSError) as e:
        log.event("eval_accuracy", 0.5)
    assert describe_os_error(e.value) == f"No space left on device (writing the MLPerf log; the run stops): {path}"
    log.end("run_stop", metadata={"status": "aborted"})   # the run's clean-up: nothing more, no second error
    log.close()
    assert os.path.exists(path)


@pytest.mark.parametrize("damage, says", [("not_jpeg", "has an image/encoded that is not a JPEG"),
                                          ("label", "has image/class/label minus data.label_offset")])
def test_a_bad_resnet_eval_record_met_mid_run_names_its_file_and_record(tmp_path, damage, says):
    """Fault case: a bad JPEG or label in an eval shard named no file ("Unknown image file format", or only
    the validation-*-of-* pattern). The eval records now carry their file and number into the checks."""
    import tensorflow as tf

    from benchmarks.resnet.config import DataConfig
    from benchmarks.resnet.data import TFRecordSource
    from harness.errors import BAD_DATA_MARK

    good = tf.io.encode_jpeg(tf.zeros([8, 8, 3], tf.uint8)).numpy()

    def example(encoded: bytes, label: int) -> bytes:
        feature = {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
                   "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    files = [str(tmp_path / f"validation-0000{i}-of-00002") for i in range(2)]
    for i, path in enumerate(files):
        with tf.io.TFRecordWriter(path) as w:
            for j in range(3):
                bad = (i, j) == (1, 2)
                w.write(example(b"GIF89a..." if bad and damage == "not_jpeg" else good,
                                5000 if bad and damage == "label" else 1))
    source = TFRecordSource(DataConfig(source="tfrecord", data_dir=str(tmp_path), image_size=8, num_classes=10))
    ds = source.eval_records().map(source.eval_parse)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        for _ in ds:
            pass
    assert BAD_DATA_MARK in e.value.message
    from types import SimpleNamespace

    from harness.train import run

    line = str(run._as_harness_error(e.value, None, SimpleNamespace(kind="local")))
    assert line.startswith(f"corrupt input data: eval record 2 of {files[1]} {says}"), line
