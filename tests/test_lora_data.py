"""benchmarks/llama2_70b_lora/data.py: the parquet reader and writer, every bad file as one line, per-host
training shares, the padded eval set, the synthetic prompt -> answer source, scripts/make_lora_parquet.py."""
from __future__ import annotations

import importlib.util
import os
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import REPO
from harness.errors import HarnessError
from harness.runtime.base import InputContext
from harness.train import loop
from harness.train.workload import INDEX, MASK

from benchmarks.llama2_70b_lora.data import (BOS, EOS, FIRST_WORD, IGNORE, SEP, LoraData, LoraDataConfig,
                                             answer_map, read_parquet, synthetic_rows, write_parquet)

pytestmark = pytest.mark.quick

SEQ, VOCAB = 16, 32
TRAIN, EVAL = "train-00000-of-00001.parquet", "validation-00000-of-00001.parquet"


def rows(n: int, seed: int = 0, masked: bool = True) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=[n, SEQ]).astype(np.int32)
    labels = np.where(rng.random([n, SEQ]) < 0.5, IGNORE, ids).astype(np.int32) if masked else ids.copy()
    return ids, labels


def data_dir(tmp_path, train: int = 7, evals: int = 5) -> str:
    write_parquet(str(tmp_path / TRAIN), *rows(train, 1, masked=False))
    write_parquet(str(tmp_path / EVAL), *rows(evals, 2))
    return str(tmp_path)


def parquet_data(path: str, **kw) -> LoraData:
    """The parquet source of `path`; eval_samples by default as many as its eval file holds (173 when absent)."""
    evals = os.path.join(path, EVAL)
    count = pq.ParquetFile(evals).metadata.num_rows if os.path.isfile(evals) else 173
    return LoraData(LoraDataConfig(source="parquet", data_dir=path, train_samples=kw.pop("train_samples", 0),
                                   eval_samples=kw.pop("eval_samples", count), **kw), SEQ, VOCAB)


def one_line(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


# ------------------------------------------------------------------------------------- round trip

@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_writer_reader_round_trip(tmp_path, dtype):
    ids, labels = rows(6)
    path = str(tmp_path / "x.parquet")
    write_parquet(path, ids, labels, attention_mask=True, dtype=dtype)
    schema = pq.read_schema(path)
    assert schema.names == ["input_ids", "labels", "attention_mask"]
    assert schema.field("labels").type == pa.list_(pa.from_numpy_dtype(dtype))
    got_ids, got_labels = read_parquet(path, SEQ, VOCAB)
    assert got_ids.dtype == np.int32 and got_labels.dtype == np.int32
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got_labels, labels)


def test_parquet_source_counts_and_arrays(tmp_path):
    data = parquet_data(data_dir(tmp_path), train_samples=7, eval_samples=5)
    data.validate()
    assert data.counts() == {"train_samples": 7, "eval_samples": 5}
    assert (data.train_samples, data.eval_samples, data.data_source, data.is_synthetic) == (7, 5, "parquet", False)
    np.testing.assert_array_equal(data.arrays("eval")[1], rows(5, 2)[1])
    assert parquet_data(str(tmp_path), eval_samples=5).train_samples == 7  # 0 = as many rows as the file holds


def test_row_groups_and_fixed_size_lists_read_as_written(tmp_path):
    ids, labels = rows(9)
    table = pa.table({"input_ids": pa.FixedSizeListArray.from_arrays(pa.array(ids.reshape(-1)), SEQ),
                      "labels": pa.FixedSizeListArray.from_arrays(pa.array(labels.reshape(-1).astype(np.int16)),
                                                                  SEQ),
                      "extra": pa.array(range(9))})
    path = str(tmp_path / "groups.parquet")
    pq.write_table(table, path, row_group_size=4)
    assert pq.ParquetFile(path).num_row_groups == 3
    got_ids, got_labels = read_parquet(path, SEQ, VOCAB)
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got_labels, labels)


# ------------------------------------------------------------------------------------------ bad files

def _table(tmp_path, **columns) -> str:
    path = str(tmp_path / EVAL)
    pq.write_table(pa.table(columns), path)
    return path


def _lists(values: np.ndarray, kind: pa.DataType | None = None) -> pa.Array:
    return pa.array([list(r) for r in values], type=kind)


BAD_FILES = {
    # case: (what the eval file holds, words the message must carry)
    "no labels column": (lambda ids, labels: {"input_ids": _lists(ids)}, ["no column labels", "input_ids"]),
    "float labels": (lambda ids, labels: {"input_ids": _lists(ids), "labels": _lists(labels.astype(float))},
                     ["column labels", "double"]),
    "ids not lists": (lambda ids, labels: {"input_ids": pa.array(ids[:, 0]), "labels": _lists(labels)},
                      ["column input_ids", "int32", "list of integer"]),
    "short rows": (lambda ids, labels: {"input_ids": _lists(ids[:, :-1]), "labels": _lists(labels[:, :-1])},
                   ["input_ids", f"do not hold {SEQ} tokens", f"holds {SEQ - 1}"]),
    "one long label row": (lambda ids, labels: {"input_ids": _lists(ids),
                                                "labels": pa.array([[*labels[0], 1], *map(list, labels[1:])])},
                           ["1 of 5 rows of labels", "row 0 holds 17"]),
    "label neither -100 nor an id": (lambda ids, labels: {"input_ids": _lists(ids),
                                                          "labels": _lists(np.where(labels == IGNORE, -1, labels))},
                                     ["labels holds -1", "must be -100"]),
    "label past the vocabulary": (lambda ids, labels: {"input_ids": _lists(ids),
                                                       "labels": _lists(np.where(labels == IGNORE, VOCAB, labels))},
                                  [f"labels holds {VOCAB}"]),
    "labels shifted by one": (lambda ids, labels: {"input_ids": _lists(ids),
                                                   "labels": _lists(np.roll(labels, -1, 1))},
                              ["labels differ from input_ids at", "not shifted"]),
    "id past the vocabulary": (lambda ids, labels: {"input_ids": _lists(ids + VOCAB), "labels": _lists(labels)},
                               ["input_ids holds token id", f"vocabulary of {VOCAB}"]),
    "negative id": (lambda ids, labels: {"input_ids": _lists(ids - VOCAB), "labels": _lists(labels)},
                    ["input_ids holds token id -"]),
    "null row": (lambda ids, labels: {"input_ids": _lists(ids),
                                      "labels": pa.array([None] + [list(r) for r in labels[1:]])},
                 ["labels has 1 null rows"]),
    "null token": (lambda ids, labels: {"input_ids": pa.array([[None] + list(ids[0, 1:])] + [list(r) for r in ids[1:]]),
                                        "labels": _lists(labels)},
                   ["input_ids holds 1 null values"]),
    "padding in attention_mask": (lambda ids, labels: {"input_ids": _lists(ids), "labels": _lists(labels),
                                                       "attention_mask": _lists(np.eye(5, SEQ, dtype=np.int8))},
                                  ["attention_mask has", "zeros"]),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_is_one_line_naming_it(tmp_path, case):
    make, words = BAD_FILES[case]
    write_parquet(str(tmp_path / TRAIN), *rows(7))
    path = _table(tmp_path, **make(*rows(5, 2)))
    with pytest.raises(HarnessError) as e:
        parquet_data(str(tmp_path)).validate()
    message = one_line(e)
    assert message.startswith(path), message
    for word in words:
        assert word in message, message


def test_not_parquet_and_missing_files_are_one_line(tmp_path):
    with pytest.raises(HarnessError) as e:
        parquet_data(str(tmp_path / "absent")).validate()
    assert one_line(e) == f"data.data_dir {tmp_path / 'absent'} does not exist"
    with pytest.raises(HarnessError) as e:
        LoraData(LoraDataConfig(source="parquet"), SEQ, VOCAB).validate()
    assert "needs data.data_dir" in one_line(e)
    with pytest.raises(HarnessError) as e:
        parquet_data(str(tmp_path)).validate()
    assert one_line(e).startswith(f"{tmp_path / TRAIN} does not exist")
    (tmp_path / TRAIN).write_bytes(b"not a parquet file at all")
    with pytest.raises(HarnessError) as e:
        parquet_data(str(tmp_path)).validate()
    assert one_line(e).startswith(f"{tmp_path / TRAIN} is not a readable parquet file (")


def test_counts_that_do_not_match_are_one_line(tmp_path):
    path = data_dir(tmp_path)
    with pytest.raises(HarnessError) as e:
        parquet_data(path, train_samples=8).validate()
    assert one_line(e) == f"data.train_samples=8 but {tmp_path / TRAIN} holds 7 rows; set data.train_samples=7"
    with pytest.raises(HarnessError) as e:
        parquet_data(path, train_samples=7, eval_samples=6).validate()
    assert one_line(e) == f"data.eval_samples=6 but {tmp_path / EVAL} holds 5 rows; set data.eval_samples=5"
    parquet_data(path, train_samples=7, eval_samples=5).validate(closed=False)
    with pytest.raises(HarnessError) as e:
        parquet_data(path, train_samples=7, eval_samples=5).validate(closed=True)
    assert one_line(e).startswith(f"{tmp_path / TRAIN} holds 7 rows; the closed division needs the reference's 3901")


def test_closed_division_takes_the_reference_counts(tmp_path):
    write_parquet(str(tmp_path / TRAIN), *rows(3901, 1, masked=False))
    write_parquet(str(tmp_path / EVAL), *rows(172, 2))
    with pytest.raises(HarnessError) as e:
        parquet_data(str(tmp_path)).validate(closed=True)
    assert one_line(e).startswith(f"{tmp_path / EVAL} holds 172 rows; the closed division needs the reference's 173")
    write_parquet(str(tmp_path / EVAL), *rows(173, 2))
    data = parquet_data(str(tmp_path), train_samples=3901, eval_samples=173)
    data.validate(closed=True)
    assert data.arrays("train")[0].shape == (3901, SEQ)


# ------------------------------------------------------------------------------------------ training

def epoch_rows(data: LoraData, ctx: InputContext, epochs: int) -> list[list[int]]:
    """Row numbers of `epochs` consecutive epochs of this host's endless stream (row i's first token is i)."""
    share = int(data.host_rows(ctx).cardinality())
    stream = [int(b["input_ids"][0]) for b in data.train_examples(ctx).take(share * epochs)]
    return [stream[k * share:(k + 1) * share] for k in range(epochs)]


@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_hosts_cover_every_row_once_per_epoch(tmp_path, hosts):
    n = 11
    ids = np.repeat(np.arange(n, dtype=np.int32)[:, None], SEQ, axis=1)
    write_parquet(str(tmp_path / TRAIN), ids, ids)
    write_parquet(str(tmp_path / EVAL), *rows(3))
    data = parquet_data(str(tmp_path))
    seen = []
    for host in range(hosts):
        ctx = InputContext(num_hosts=hosts, host_id=host, batch_size=1, seed=5)
        first, second = epoch_rows(data, ctx, 2)
        assert sorted(first) == sorted(second) == list(range(host, n, hosts))
        if len(first) > 2:
            assert first != second, "each epoch is shuffled afresh"
        one_pass = [int(b["input_ids"][0]) for b in data.train_examples(ctx, repeat=False)]
        assert sorted(one_pass) == sorted(first)
        seen += first
    assert sorted(seen) == list(range(n))


def test_order_follows_the_run_seed_and_batches_are_int32(tmp_path):
    data = parquet_data(data_dir(tmp_path, train=9))
    ctx = InputContext(num_hosts=1, host_id=0, batch_size=1, seed=1)
    assert epoch_rows(data, ctx, 2) == epoch_rows(parquet_data(str(tmp_path)), ctx, 2)
    other = InputContext(num_hosts=1, host_id=0, batch_size=1, seed=2)
    assert epoch_rows(data, ctx, 2) != epoch_rows(data, other, 2)
    ids, labels = data.arrays("train")
    batch = next(iter(data.train_dataset(InputContext(1, 0, 4, 1))))
    assert set(batch) == {"input_ids", "labels"}
    for key, whole in (("input_ids", ids), ("labels", labels)):
        assert batch[key].dtype.name == "int32" and batch[key].shape == (4, SEQ)
    for row_ids, row_labels in zip(batch["input_ids"].numpy(), batch["labels"].numpy()):
        row = int(np.flatnonzero((ids == row_ids).all(axis=1))[0])
        np.testing.assert_array_equal(row_labels, labels[row])
    assert data.train_dataset(InputContext(1, 0, 4, 1)).element_spec["labels"].shape.as_list() == [4, SEQ]


def test_train_examples_through_the_loop_equal_train_dataset(tmp_path):
    """The loop's own training input over a workload wired to train_examples gives train_dataset's batches."""
    data = parquet_data(data_dir(tmp_path, train=9))
    workload = types.SimpleNamespace(cfg=types.SimpleNamespace(data=data.cfg), is_synthetic=False,
                                     train_samples=data.train_samples, train_dataset=data.train_examples)
    ctx = InputContext(num_hosts=2, host_id=1, batch_size=2, seed=4)
    runtime = types.SimpleNamespace(distribute_dataset=lambda fn, global_batch, seed: fn(ctx))
    theirs = list(loop.train_input(runtime, workload, global_batch=4, seed=4).take(5))
    ours = list(data.train_dataset(ctx).take(5))
    for a, b in zip(ours, theirs, strict=True):
        assert set(a) == set(b) == {"input_ids", "labels"}
        for k in a:
            np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())


# ---------------------------------------------------------------------------------------------- eval

@pytest.mark.parametrize("hosts,batch", [(1, 2), (2, 2), (2, 3), (1, 5)])
def test_eval_is_padded_to_whole_batches_with_the_mask(tmp_path, hosts, batch):
    data = parquet_data(data_dir(tmp_path, evals=5))
    ids, labels = data.arrays("eval")
    padded = -(-5 // (batch * hosts)) * batch * hosts
    got = {MASK: [], INDEX: [], "input_ids": [], "labels": []}
    for host in range(hosts):
        for b in data.eval_dataset(InputContext(hosts, host, batch, 0)):
            assert b["input_ids"].shape == (batch, SEQ)
            for k in got:
                got[k] += list(b[k].numpy())
    assert len(got[MASK]) == padded
    assert got[MASK] == [1.0] * 5 + [0.0] * (padded - 5)
    assert got[INDEX] == list(range(5)) + [-1] * (padded - 5)
    order = [i if i >= 0 else 0 for i in got[INDEX]]  # padding copies row 0
    np.testing.assert_array_equal(np.stack(got["input_ids"]), ids[order])
    np.testing.assert_array_equal(np.stack(got["labels"]), labels[order])


def test_eval_records_through_the_loop_equal_eval_dataset(tmp_path):
    """The loop's own eval input over a workload wired to eval_records / eval_parse gives eval_dataset's batches."""
    data = parquet_data(data_dir(tmp_path, evals=5))
    workload = types.SimpleNamespace(cfg=types.SimpleNamespace(data=data.cfg), eval_samples=data.eval_samples,
                                     eval_records=lambda ctx: data.eval_records(), eval_parse=data.eval_parse)
    for host in range(2):
        ctx = InputContext(num_hosts=2, host_id=host, batch_size=2, seed=0)
        runtime = types.SimpleNamespace(distribute_dataset=lambda fn, global_batch, seed: fn(ctx))
        ours = list(data.eval_dataset(ctx))
        theirs = list(loop.eval_input(runtime, workload, global_batch=4, seed=0).take(len(ours)))
        assert len(ours) == 2
        for a, b in zip(ours, theirs):
            assert set(a) == set(b)
            for k in a:
                np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())


# ----------------------------------------------------------------------------------------- synthetic

def synthetic(seed: int = 0, **kw) -> LoraData:
    return LoraData(LoraDataConfig(synthetic_seed=seed, train_samples=kw.pop("train", 6),
                                   eval_samples=kw.pop("evals", 3), **kw), SEQ, VOCAB)


def test_synthetic_rows_are_fixed_by_the_seed():
    a, b, c = synthetic(0), synthetic(0), synthetic(1)
    a.validate()
    assert (a.data_source, a.is_synthetic, a.train_samples, a.eval_samples) == ("synthetic", True, 6, 3)
    for split in ("train", "eval"):
        for x, y in zip(a.arrays(split), b.arrays(split)):
            np.testing.assert_array_equal(x, y)
        assert not np.array_equal(a.arrays(split)[0], c.arrays(split)[0])
    assert not np.array_equal(a.arrays("train")[0], a.arrays("eval")[0][:3])
    ctx = InputContext(1, 0, 2, 7)
    first = [b["input_ids"].numpy() for b in a.train_dataset(ctx).take(4)]
    again = [b["input_ids"].numpy() for b in b.train_dataset(ctx).take(4)]
    np.testing.assert_array_equal(np.stack(first), np.stack(again))
    defaults = LoraData(LoraDataConfig(), SEQ, VOCAB)
    assert (defaults.train_samples, defaults.eval_samples) == (512, 173)  # synthetic_train_rows, the reference's


def test_synthetic_answers_are_the_map_of_the_prompt_and_alone_scored():
    prompt_len, alphabet, length = 3, 6, 9  # BOS x x x SEP y y y EOS
    ids, labels = synthetic_rows(4, 1, rows=4, seq_length=2 * length, alphabet=alphabet, prompt_len=prompt_len,
                                 score_prompts=False)
    examples, scored = ids.reshape(-1, length), labels.reshape(-1, length)
    perm = answer_map(4, alphabet)
    assert sorted(perm) == list(range(FIRST_WORD, FIRST_WORD + alphabet))
    assert (examples[:, 0] == BOS).all() and (examples[:, 4] == SEP).all() and (examples[:, -1] == EOS).all()
    np.testing.assert_array_equal(examples[:, 5:8], perm[examples[:, 1:4] - FIRST_WORD])
    assert (scored[:, :5] == IGNORE).all() and (scored[:, -1] == IGNORE).all()
    np.testing.assert_array_equal(scored[:, 5:8], examples[:, 5:8])
    all_ids, all_labels = synthetic_rows(4, 0, 4, 2 * length, alphabet, prompt_len, score_prompts=True)
    np.testing.assert_array_equal(all_ids, all_labels)


def test_ideal_eval_loss_counts_the_answers_cut_from_their_prompt():
    aligned = LoraData(LoraDataConfig(eval_samples=4, synthetic_prompt_len=2, synthetic_alphabet=4), 14, VOCAB)
    assert aligned.ideal_eval_loss() == 0.0  # rows of two whole examples: every prompt in its row
    # P = 1, rows of 7: [BOS x SEP y EOS BOS x] then [SEP y EOS BOS x SEP y]: row 1's first answer lost its prompt
    cut = LoraData(LoraDataConfig(eval_samples=2, synthetic_prompt_len=1, synthetic_alphabet=4), 7, VOCAB)
    ids, labels = cut.arrays("eval")
    assert list(ids[1, [0, 2, 3, 5]]) == [SEP, EOS, BOS, SEP] and list(labels[1] != IGNORE) == [
        False, True, False, False, False, False, True]
    assert cut.ideal_eval_loss() == pytest.approx(0.25 * np.log(4))
    assert cut.chance_loss() == pytest.approx(np.log(4))


def test_map_seed_changes_the_answers_alone():
    base, same, other = (synthetic(3, synthetic_alphabet=16, synthetic_map_seed=m) for m in (-1, 3, 4))
    ids, labels = base.arrays("eval")
    np.testing.assert_array_equal(same.arrays("eval")[0], ids)
    other_ids, other_labels = other.arrays("eval")
    scored = labels != IGNORE
    np.testing.assert_array_equal(other_labels != IGNORE, scored)
    np.testing.assert_array_equal(other_ids[~scored], ids[~scored])  # prompts, BOS, SEP and EOS unchanged
    assert (other_ids[scored] != ids[scored]).any()
    perm, moved = answer_map(3, 16), answer_map(4, 16)
    np.testing.assert_array_equal(other_ids[scored], moved[perm.argsort()[ids[scored] - FIRST_WORD]])


def test_synthetic_train_labels_and_vocabulary_checks():
    train = synthetic(synthetic_train_labels="answer")
    ids, labels = train.arrays("train")
    assert (labels == IGNORE).any() and ((labels == IGNORE) | (labels == ids)).all()
    ids, labels = synthetic().arrays("train")
    np.testing.assert_array_equal(ids, labels)
    with pytest.raises(HarnessError) as e:
        synthetic(synthetic_alphabet=VOCAB).validate()
    assert one_line(e) == (f"data.synthetic_alphabet={VOCAB} needs a vocabulary of at least {VOCAB + 4} (ids 0-3 "
                           f"are special), the model has {VOCAB}")


def test_script_writes_what_the_synthetic_source_gives(tmp_path):
    spec = importlib.util.spec_from_file_location("make_lora_parquet", os.path.join(REPO, "scripts",
                                                                                    "make_lora_parquet.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.write(str(tmp_path), train_rows=6, eval_rows=3, seq=SEQ, seed=2, alphabet=5, prompt_len=2,
                 dtype=np.int64, map_seed=7)
    files = parquet_data(str(tmp_path), train_samples=6, eval_samples=3)
    files.validate()
    generated = synthetic(2, synthetic_alphabet=5, synthetic_prompt_len=2, synthetic_map_seed=7)
    for split in ("train", "eval"):
        for x, y in zip(files.arrays(split), generated.arrays(split)):
            np.testing.assert_array_equal(x, y)
