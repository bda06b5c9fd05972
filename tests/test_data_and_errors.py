"""ResNet input pipelines (TFRecord files the test writes, TFDS under mock_data) and bad-input handling."""
from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.resnet.config import DataConfig
from benchmarks.resnet.data import TFRecordSource, train_image
from benchmarks.resnet.tfrecord_writer import write_imagenet_tfrecords
from harness.runtime.base import InputContext

from conftest import REPO, SMOKE, TINY_RESNET, cli_in_process, read_summary, run_cli, run_dir, sets, stderr_error_lines

N_TRAIN, N_EVAL = 512, 130


@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("imagenet"))
    write_imagenet_tfrecords(out, N_TRAIN, N_EVAL, image_size=36, num_classes=10, train_shards=2, eval_shards=2)
    return out


def tfrecord_sets(data_dir: str) -> list[str]:
    # Open division: the smoke's tiny ResNet is not the reference ResNet-50 a closed real-data run needs.
    # The files' path through the run is tested, not the model (conftest's TINY_RESNET).
    return sets(*TINY_RESNET, submission__division="open", data__source="tfrecord", data__data_dir=data_dir,
                data__train_samples=N_TRAIN, data__eval_samples=N_EVAL, schedule__max_epochs=1,
                schedule__eval_every_epochs=1, data__shuffle_buffer=256)


def test_tfrecord_pipeline_shapes_labels_and_eval_order(imagenet_dir):
    cfg = DataConfig(source="tfrecord", data_dir=imagenet_dir, image_size=32, num_classes=10,
                     train_samples=N_TRAIN, eval_samples=N_EVAL)
    source = TFRecordSource(cfg)
    source.validate()
    batch = next(iter(source.train(InputContext(1, 0, 8, seed=3)).batch(8)))
    assert batch["image"].shape == (8, 32, 32, 3) and batch["image"].dtype == tf.float32
    labels = batch["label"].numpy()
    assert labels.min() >= 0 and labels.max() < 10
    # The model's input (normalized in the train step by default, data.normalize_in_step) is mean-subtracted
    # (the reference), not 0-255.
    assert source.normalizes_in_step and abs(float(tf.reduce_mean(batch["image"]))) > 40.0
    assert abs(float(tf.reduce_mean(train_image(batch, source)))) < 40.0
    # Two hosts read disjoint shards.
    host0 = source.train(InputContext(2, 0, 8, seed=3))
    assert host0.element_spec["image"].shape == (32, 32, 3)
    records = list(source.eval_records())
    assert len(records) == N_EVAL
    first = source.eval_parse(records[0])
    assert first["image"].shape == (32, 32, 3)
    again = source.eval_parse(list(source.eval_records())[0])
    np.testing.assert_array_equal(first["image"].numpy(), again["image"].numpy())  # fixed order


def test_tfrecord_run_end_to_end(imagenet_dir, tmp_out):
    """The CLI's dispatch in this process (one device, as a subprocess's run would have; no TensorFlow start)."""
    proc = cli_in_process("run", SMOKE, "--output_dir", tmp_out, *tfrecord_sets(imagenet_dir))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    summary = read_summary(tmp_out)
    assert summary["data_source"] == "tfrecord" and summary["synthetic_data"] is False
    assert [e["counted"] for e in summary["evals"]] == [N_EVAL]
    assert "SYNTHETIC" not in proc.stdout
    assert summary["compliance"]["4.0.0"]["verdict"].startswith(("PASS", "FAIL (quality target"))


def test_tfds_run_under_mock_data(tmp_out):
    """The whole run in-process on tfds.testing.mock_data (random images, random labels: aborts)."""
    import tensorflow_datasets as tfds

    from harness.train import run

    with tfds.testing.mock_data(num_examples=48):
        code = run.execute(SMOKE, ["submission.division=open", "data.source=tfds", "data.data_dir=",
                                   "data.train_samples=64", "data.eval_samples=48", "schedule.max_epochs=4",
                                   "schedule.global_batch_size=32", "data.shuffle_buffer=64"], tmp_out)
    summary = read_summary(tmp_out)
    assert code in (0, 1) and summary["status"] in ("success", "aborted")
    assert summary["data_source"] == "tfds"
    assert [e["counted"] for e in summary["evals"]] == [48]


# ------------------------------------------------------------------------------------ bad input

def assert_clean_error(proc, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = stderr_error_lines(proc)
    assert len(errors) == 1, proc.stderr
    for f in fragments:
        assert f in errors[0], errors[0]
    assert "Traceback" not in proc.stderr


def test_cli_unknown_key_and_workload(tmp_out, tmp_path):
    proc = cli_in_process("run", SMOKE, "--output_dir", tmp_out, "--set", "schedule.max_epoch=3")
    assert_clean_error(proc, "schedule.max_epoch", "max_epochs")
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: resnet50\n")
    proc = cli_in_process("run", str(bad), "--output_dir", tmp_out)
    assert_clean_error(proc, "unknown workload 'resnet50'", "resnet")
    assert not os.path.exists(tmp_out)


def test_missing_data_path_and_no_matching_files(tmp_out, tmp_path):
    proc = cli_in_process("run", SMOKE, "--output_dir", tmp_out,
                          *sets(submission__division="open", data__source="tfrecord",
                                data__data_dir=str(tmp_path / "nope")))
    assert_clean_error(proc, "does not exist")
    proc = cli_in_process("run", SMOKE, "--output_dir", tmp_out,
                          *sets(submission__division="open", data__source="tfrecord", data__data_dir=str(tmp_path)))
    assert_clean_error(proc, "no files match", "train-*-of-*")
    assert not glob.glob(os.path.join(tmp_out, "**", "result_*.txt"), recursive=True)


def test_corrupt_record_gives_clear_error_and_no_valid_looking_log(imagenet_dir, tmp_path, tmp_out):
    data = str(tmp_path / "corrupt")
    os.makedirs(data)
    for f in glob.glob(os.path.join(imagenet_dir, "*")):
        with open(f, "rb") as src:
            raw = bytearray(src.read())
        if os.path.basename(f).startswith("train"):
            # Inside the payload of a record near the middle: its header stays intact, so the record count at
            # load holds and the reader meets the bad CRC mid-run.
            start = 0
            while start < len(raw) // 2:
                length = int.from_bytes(raw[start:start + 8], "little")
                payload, start = start + 12, start + 12 + length + 4
            assert length > 64
            raw[payload:payload + 64] = b"\xff" * 64  # breaks that record's CRC
        with open(os.path.join(data, os.path.basename(f)), "wb") as dst:
            dst.write(raw)
    proc = cli_in_process("run", SMOKE, "--output_dir", tmp_out, *tfrecord_sets(data))  # in this process, as above
    # The reader's own words, past TensorFlow's "Graph execution error:" (it knows the offset, not the file).
    assert_clean_error(proc, "error: corrupt or unreadable input data: corrupted record at ",
                       "(a TFRecord's bytes do not match their checksum)")
    folder = run_dir(tmp_out)
    assert not glob.glob(os.path.join(folder, "result_*.txt"))
    assert glob.glob(os.path.join(folder, "incomplete_result_*.log"))  # kept, under a name no tool reads


def test_batch_not_divisible_over_replicas(tmp_out):
    proc = run_cli("run", SMOKE, "--output_dir", tmp_out,
                   *sets(runtime__kind="mirrored", runtime__cpu_devices=2, schedule__global_batch_size=127))
    assert_clean_error(proc, "global_batch_size=127", "2 replicas")


def test_unreachable_tpu_times_out(tmp_out):
    proc = run_cli("run", SMOKE, "--output_dir", tmp_out,
                   *sets(runtime__kind="tpu", runtime__tpu="grpc://127.0.0.1:9", runtime__tpu_timeout_s=5),
                   timeout=120)
    assert_clean_error(proc, "TPU grpc://127.0.0.1:9")


def test_closed_division_target_below_closed_target_is_refused(tmp_out):
    proc = cli_in_process("run", SMOKE, "--output_dir", tmp_out, *sets(schedule__target=0.5))
    assert_clean_error(proc, "schedule.target=0.5", "closed-division target 0.759", "division=open")


@pytest.mark.parametrize("overrides, fragments", [
    (["schedule.eval_every_epochs=1"], ["closed ResNet evaluates every 4 epochs", "eval_every_epochs=1"]),
    (["schedule.eval_offset_epochs=5"], ["eval_offset_epochs=5", "one of 0, 1, 2, 3"]),
    (["schedule.max_epochs=41", "schedule.eval_offset_epochs=3"], ["max_epochs=41 is off the eval cadence",
                                                                    "use 39 or 43"]),
    (["schedule.eval_epochs=[4, 8]"], ["not schedule.eval_epochs"]),
])
def test_closed_resnet_eval_schedule_breaking_the_rules_is_refused(tmp_out, overrides, fragments):
    proc = cli_in_process("run", SMOKE, "--output_dir", tmp_out, *[a for o in overrides for a in ("--set", o)])
    assert_clean_error(proc, *fragments, "division=open")
    assert not os.path.exists(tmp_out) or not any(f.startswith("result_") for _, _, fs in os.walk(tmp_out)
                                                   for f in fs)


def test_closed_bert_eval_schedule_breaking_the_rules_is_refused(tmp_out):
    bert = os.path.join(REPO, "configs", "bert", "smoke.yaml")
    proc = cli_in_process("run", bert, "--output_dir", tmp_out, "--set", "submission.division=closed")
    assert_clean_error(proc, "closed BERT evaluates at the rules' cadence", "eval_every_samples=0")
    proc = cli_in_process("run", bert, "--output_dir", tmp_out, "--set", "submission.division=closed",
                          "--set", "data.eval_every_samples=0", "--set", "data.train_samples=200000",
                          "--set", "schedule.max_epochs=1")
    assert_clean_error(proc, "budget of 200000 samples", "off the eval cadence", "end it at 150016 or 300032 samples")


# ------------------------------------------------------------- records that are wrong inside: named with the reason

BAD_RECORD = 100  # of train-00001-of-00002


def with_one_record(imagenet_dir: str, out: str, change) -> str:
    """A copy of the test data whose training record BAD_RECORD of the second shard is `change(record)`."""
    os.makedirs(out)
    for f in glob.glob(os.path.join(imagenet_dir, "*")):
        records = [r.numpy() for r in tf.data.TFRecordDataset(f)]
        if os.path.basename(f) == "train-00001-of-00002":
            records[BAD_RECORD] = change(records[BAD_RECORD])
        with tf.io.TFRecordWriter(os.path.join(out, os.path.basename(f))) as w:
            for r in records:
                w.write(r)
    return os.path.join(out, "train-00001-of-00002")


def changed(feature: str, value):
    def change(record: bytes) -> bytes:
        ex = tf.train.Example.FromString(record)
        field = ex.features.feature[feature]
        (field.int64_list if isinstance(value, int) else field.bytes_list).value[0] = value
        return ex.SerializeToString()
    return change


def run_error(data_dir: str) -> str:
    """The `error:` line a run prints when its training input meets the bad record (the run's own mapping of
    the op error, on this pipeline's batches in this process)."""
    from types import SimpleNamespace

    from harness.train import run

    cfg = DataConfig(source="tfrecord", data_dir=data_dir, image_size=32, num_classes=10, train_samples=N_TRAIN,
                     eval_samples=N_EVAL)
    source = TFRecordSource(cfg)
    source.validate()
    with pytest.raises(tf.errors.OpError) as raised:
        for _ in source.train(InputContext(1, 0, 64, seed=3), repeat=False).batch(64):
            pass
    error = run._as_harness_error(raised.value, None, SimpleNamespace(kind="local"))
    assert error is not None, raised.value
    return f"error: {error}"


def test_label_out_of_range_names_the_file_record_and_label(imagenet_dir, tmp_path):
    bad = with_one_record(imagenet_dir, str(tmp_path / "d"), changed("image/class/label", 4000))
    assert run_error(str(tmp_path / "d")) == (
        f"error: corrupt input data: record {BAD_RECORD} of {bad} has image/class/label minus data.label_offset = "
        f"3999 outside [0, 10) (data.num_classes; a wrong data.label_offset?)")


def test_image_that_is_not_a_jpeg_names_the_file_and_record(imagenet_dir, tmp_path):
    png = tf.io.encode_png(tf.zeros([8, 8, 3], tf.uint8)).numpy()
    bad = with_one_record(imagenet_dir, str(tmp_path / "d"), changed("image/encoded", png))
    assert run_error(str(tmp_path / "d")) == (
        f"error: corrupt input data: record {BAD_RECORD} of {bad} has an image/encoded that is not a JPEG")


def test_damaged_jpeg_gives_the_decoders_reason(imagenet_dir, tmp_path):
    # A JPEG header followed by garbage: only the decoder finds it, and its error cannot name the record.
    with_one_record(imagenet_dir, str(tmp_path / "d"), changed("image/encoded", b"\xff\xd8\xff\xe0" + b"x" * 300))
    line = run_error(str(tmp_path / "d"))
    assert line.startswith("error: corrupt or unreadable input data: ") and "Invalid JPEG data" in line, line
    assert "Graph execution error" not in line


def test_files_of_records_that_are_not_examples_are_named_before_the_run(imagenet_dir, tmp_path):
    from harness.errors import HarnessError

    bad = with_one_record(imagenet_dir, str(tmp_path / "d"), lambda r: r)
    with tf.io.TFRecordWriter(bad) as w:
        for _ in range(256):
            w.write(b"\x07\x00 not a protocol buffer")
    cfg = DataConfig(source="tfrecord", data_dir=str(tmp_path / "d"), image_size=32, num_classes=10,
                     train_samples=N_TRAIN, eval_samples=N_EVAL)
    with pytest.raises(HarnessError) as raised:
        TFRecordSource(cfg).validate()
    assert str(raised.value) == (f"{bad}: its records are not tf.train.Example protos (record 0 does not parse as "
                                 f"one); expected ImageNet images (image/encoded JPEG, image/class/label)")


def test_check_examples_and_file_error_name_the_file(tmp_path):
    from benchmarks.ssd.data import count_images_with_boxes
    from harness.errors import HarnessError
    from harness.train.datafiles import check_examples

    def write(name: str, records: list[bytes]) -> str:
        path = str(tmp_path / name)
        with tf.io.TFRecordWriter(path) as w:
            for r in records:
                w.write(r)
        return path

    def example(**floats) -> bytes:
        feature = {k: tf.train.Feature(float_list=tf.train.FloatList(value=v)) for k, v in floats.items()}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    good = write("good", [example(**{"image/object/bbox/xmin": [0.1]})] * 3)
    empty = write("empty", [])
    other = write("other", [example(score=[1.0])])
    check_examples([good, empty], ["image/object/bbox/xmin"], "boxes")
    with pytest.raises(HarnessError, match=f"^{other}: its records lack feature\\(s\\) image/object/bbox/xmin "
                                           f"\\(checked on record 0; expected boxes\\)$"):
        check_examples([good, other], ["image/object/bbox/xmin"], "boxes")
    # A fixed-length feature of another length or kind (data for another sequence length, another converter).
    spec = {"image/object/bbox/xmin": tf.io.FixedLenFeature([2], tf.float32)}
    with pytest.raises(HarnessError, match=f"^{good}: record 0's image/object/bbox/xmin holds 1 values of "
                                           f"float_list, the config parses 2 of float_list \\(expected boxes\\)$"):
        check_examples([good], spec, "boxes")
    spec = {"image/object/bbox/xmin": tf.io.FixedLenFeature([1], tf.int64)}
    with pytest.raises(HarnessError, match="holds 1 values of float_list, the config parses 1 of int64_list"):
        check_examples([good], spec, "boxes")
    check_examples([good], {"image/object/bbox/xmin": tf.io.FixedLenFeature([1], tf.float32)}, "boxes")
    # Record 0 sound, a later one not an Example: the count that meets it names its file.
    mixed = write("mixed", [example(**{"image/object/bbox/xmin": [0.1]}), b"\x07\x00 garbage"])
    assert count_images_with_boxes([good]) == 3
    with pytest.raises(HarnessError) as raised:
        count_images_with_boxes([good, mixed])
    assert str(raised.value) == f"{mixed}: a record is not a tf.train.Example (Could not parse example input)"


@pytest.mark.parametrize("message, line", [
    ("Graph execution error:\n\nDetected at node ExtractJpegShape defined at (most recent call last):\n"
     "<stack traces unavailable>\nError in user-defined function passed to ParallelMapDatasetV2:10 transformation "
     "with iterator: Iterator::Root::Map::Zip[1]::Prefetch::BatchV2::ParallelMapV2: Invalid JPEG data, size 354\n"
     "\t [[{{node ExtractJpegShape}}]]\n\t [[while/body/_1/while/IteratorGetNext]] [Op:__inference__train_loop_4323]",
     "Invalid JPEG data, size 354"),
    ("Graph execution error:\n\nDetected at node Assert/Assert defined at (most recent call last):\n"
     '  File "/x/y.py", line 3, in <module>\n\n    check()\n\nassertion failed: [label outside [0, 10):] [3999]\n'
     "\t [[{{node Assert/Assert}}]]", "assertion failed: [label outside [0, 10):] [3999]"),
    ("{{function_node __wrapped__IteratorGetNext_output_types_3_device_/job:localhost/replica:0/task:0/device:CPU:0}}"
     " corrupted record at 4105 [Op:IteratorGetNext] name: ",
     "corrupted record at 4105 (a TFRecord's bytes do not match their checksum)"),
    ("Graph execution error:\n\nError in user-defined function passed to ParallelMapDatasetV2:10 transformation "
     "with iterator: Iterator::Root::ParallelMapV2: Could not parse example input, value: '\x07\x00ga\nrbage'",
     "a record is not a tf.train.Example (Could not parse example input)"),
    ("Graph execution error:\n\n", ""),
])
def test_op_error_line_is_the_line_that_says_what_went_wrong(message, line):
    from harness.errors import op_error_line

    assert op_error_line(message) == line
