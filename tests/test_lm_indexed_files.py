"""scripts/make_lm_indexed.py: files in the reference's C4 layout that the decoder LMs' `indexed` source reads."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from benchmarks.lm import indexed_dataset
from benchmarks.lm.config import DataConfig
from benchmarks.lm.data import Source

from conftest import REPO

pytestmark = pytest.mark.quick


def make_script():
    path = os.path.join(REPO, "scripts", "make_lm_indexed.py")
    spec = importlib.util.spec_from_file_location("make_lm_indexed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_files_hold_the_rows_asked_for_on_ids_spread_over_the_vocabulary(tmp_path):
    script = make_script()
    seq, train_rows, eval_rows = 64, 40, 6
    written = script.write(str(tmp_path), train_rows, eval_rows, seq, words=32)
    cfg = DataConfig(source="indexed", data_dir=str(tmp_path), seq_length=seq, eod_id=128001,
                     eval_samples=eval_rows)
    source = Source(cfg, 128256)
    source.validate()  # the reader's own checks: header, offsets, ids inside the vocabulary, eval rows
    assert source.indexed_rows(cfg.train_prefix) >= train_rows and source.indexed_rows(cfg.eval_prefix) >= eval_rows
    # `data count` reads the train file's rows (it said "no files to count" for indexed data)
    assert source.counts() == {"train_samples": source.indexed_rows(cfg.train_prefix)}
    assert Source(DataConfig(source="synthetic"), 128256).counts() == {}
    assert set(written) == {cfg.train_prefix, cfg.eval_prefix}
    info = indexed_dataset.open_index(os.path.join(str(tmp_path), cfg.train_prefix))
    assert info.dtype == np.int32 and info.tokens == written[cfg.train_prefix]
    tokens = np.fromfile(os.path.join(str(tmp_path), cfg.train_prefix + ".bin"), np.int32)
    ids = np.unique(tokens)
    assert len(ids) == 32 and 128001 in ids and ids.max() < 128256 and ids[-2] > 64_000  # spread, not 0..31
    # one sequence per document, each ending in EOD, as Megatron's --append-eod writes them
    ends = np.cumsum(info.sizes) - 1
    assert np.all(tokens[ends] == 128001) and np.sum(tokens == 128001) == len(info.sizes)
    rows = np.stack([r.numpy() for r in source.eval_records()])
    assert rows.shape == (eval_rows, seq + 1) and np.isin(rows, ids).all()
    # the eval file is other text of the same language
    eval_tokens = np.fromfile(os.path.join(str(tmp_path), cfg.eval_prefix + ".bin"), np.int32)
    assert set(np.unique(eval_tokens)) <= set(ids) and not np.array_equal(eval_tokens[:seq], tokens[:seq])
