"""The mesh does only the work it claims: read the program each device runs for one train step.

Losses cannot tell split work from repeated work (a model whose attention output projection gathers its
operands first gives bitwise the same losses), so this reads DTensor's SPMD-expanded train step of every
workload with a model axis (the smoke-mesh configs, 2x2 {data, model}, at the smallest sizes they take)
and asserts, with local (per-device) shapes:
- each model-split contraction (attention output, expert / feed-forward down projection, vocab-split
  output layer and input embedding) contracts 1/2 of its split dimension and is summed by an all-reduce
  over `model`;
- the exact set of all-gathers (only gpt_oss's expert weights, stored split over `data` and gathered whole
  over it where its sorted dispatch uses them, `ff` still split over `model`; the tokens stay home);
- the vocab-split input embedding: each device gathers from its own rows, and the table's gradient is a
  shard all-reduced over `data` (no full-size table, no segment sum of vocab rows);
- the decoder's blockwise cross-entropy: no buffer holds the whole vocabulary on a device, the LM head's
  input gradient is summed over `model` and its kernel gradient is a shard.
One subprocess traces the three workloads and then a mutant (gpt_oss whose attention output projection
and LM head gather their operands first: the same losses, repeated work), which must fail the same checks
(about 35 s of CPU in all).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

HELPER = os.path.join(REPO, "tests", "helpers", "mesh_split.py")
CASES = {
    "gpt_oss_20b": ["configs/gpt_oss_20b/smoke-mesh.yaml",
                    ["model.num_layers=1", "data.seq_length=128", "data.synthetic_train_rows=8",
                     "data.eval_samples=2", "model.vocab_size=80"]],  # a size no other dimension has
    "bert": ["configs/bert/smoke-mesh.yaml", ["model.num_layers=1", "schedule.global_batch_size=4",
                                              "data.train_samples=64", "data.eval_samples=8"]],
    "transformer": ["configs/transformer/smoke-mesh.yaml", ["model.num_layers=1", "schedule.global_batch_size=4",
                                                            "data.synthetic_train_pairs=200"]],
}
SUM_OVER_MODEL = "DTensorAllReduce Add model"
SUM_OVER_DATA = "DTensorAllReduce Add data"

# Contractions that must see 1/2 of a model-split dimension on every device, each summed by an all-reduce
# over `model`: equation -> (local operand shapes, how many such summed instances the step has).
# gpt_oss (local batch 1, seq 128): kv heads 2 -> 1, expert ff 32 -> 16 (experts 8 -> 4 over data, gathered
# to 8: the sorted dispatch's 9 blocks of 128 rows hold this device's 128 x top-2 assignments), vocab 80 -> 40.
# BERT (local batch 2, seq 32): heads 4 -> 2, ff 512 -> 256, vocab 32 -> 16.
# Transformer (local rows 2 x 64 tokens): heads 4 -> 2 (encoder, decoder self and cross attention),
# filter 256 -> 128 (the 4: both layers' down projections and their up projections' input gradients, which
# have the same local shapes), shared vocab 320 -> 160 (encoder and decoder lookups).
SUMMED_OVER_MODEL = {
    "gpt_oss_20b": {"bshgd,hgdm->bsm": (["1x128x1x2x8", "1x2x8x32"], 1),
                    "bjch,bjhm->bjcm": (["1x9x128x16", "1x9x16x32"], 1),
                    "kbsm,bsk->bsm": (["1x1x128x32", "1x128x1"], 1)},
    "bert": {"bsnd,ndh->bsh": (["2x32x2x32", "2x32x128"], 1),
             "BatchMatMulV2": (["2x32x256", "256x128"], 1),
             "kbsm,bsk->bsm": (["1x2x32x128", "2x32x1"], 1)},
    "transformer": {"bsnd,ndh->bsh": (["2x64x2x32", "2x32x128"], 3),
                    "BatchMatMulV2": (["2x64x128", "128x128"], 4),
                    "kbsm,bsk->bsm": (["1x2x64x128", "2x64x1"], 2)},
}
# Vocab-split output layers (forward: local logits; the vocab-parallel softmax reduces over model later).
OUTPUT_LAYER = {"gpt_oss_20b": ("bcm,mkr->bckr", ["1x128x32", "32x1x40"]),
                "bert": ("bph,vh->bpv", ["2x5x128", "16x128"]),
                "transformer": ("bsh,vh->bsv", ["2x64x128", "160x128"])}
ALL_GATHERS = {"gpt_oss_20b": ["4x16x32->8x16x32", "4x32x16->8x32x16", "4x32x16->8x32x16"], "bert": [],
               "transformer": []}


def trace(cases: dict, dump: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CPP_VMODULE="dtensor_mlir_passes=1",
               TF_DUMP_GRAPH_PREFIX=dump, MLIR_BRIDGE_LOG_PASS_FILTER="DTensorSPMDExpansion")
    p = subprocess.run([sys.executable, HELPER, dump, json.dumps(cases)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(line[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    # The mutant last: its patch of gpt_oss's Attention stays in the process.
    extra = {"gpt_oss_20b:blocks": CASES["gpt_oss_20b"], "gpt_oss_20b:mutant": CASES["gpt_oss_20b"]}
    return trace(dict(CASES, **extra),
                 str(tmp_path_factory.mktemp("spmd")))


def check_split(program: dict, workload: str) -> None:
    ops = program["contractions"]
    for equation, (operands, count) in SUMMED_OVER_MODEL[workload].items():
        found = [c for c in ops if c["equation"] == equation and c["operands"] == operands]
        summed = [c for c in found if SUM_OVER_MODEL in c["collectives"]]
        seen = [(c["operands"], c["collectives"]) for c in ops if c["equation"] == equation]
        assert len(summed) == count, (f"{workload}: {equation} on local operands {operands} summed over model "
                                      f"{len(summed)} times, expected {count}; all {equation}: {seen}")
    equation, operands = OUTPUT_LAYER[workload]
    assert any(c["equation"] == equation and c["operands"] == operands for c in ops), (workload, equation)


@pytest.mark.parametrize("workload", list(CASES))
def test_split_contractions_are_partial_sums_over_model(programs, workload):
    check_split(programs[workload], workload)


@pytest.mark.parametrize("workload", list(CASES))
def test_all_gathers_are_exactly_the_known_ones(programs, workload):
    assert programs[workload]["all_gathers"] == ALL_GATHERS[workload]


@pytest.mark.parametrize("workload", list(CASES))
def test_input_embedding_stays_a_vocab_shard(programs, workload):
    p = programs[workload]
    vocab, hidden = p["vocab"], p["hidden"]
    shard = f"1x{vocab // 2}x{hidden}"
    # Each device gathers from its own rows only; nothing gathers from the whole table.
    assert any(x["params"] == shard for x in p["lookups"]), p["lookups"]
    assert not [x for x in p["lookups"] if x["params"] in (f"{vocab}x{hidden}", f"1x{vocab}x{hidden}")]
    # The gradient: a shard summed over `data` (the usual gradient all-reduce), never vocab rows at once.
    grads = [c for c in p["contractions"] if c["equation"].endswith("->krm")]
    assert grads and all(c["result"] == shard and SUM_OVER_DATA in c["collectives"] for c in grads), grads
    assert not [s for s in p["segment_sums"] if s.split("x")[0] == str(vocab)], p["segment_sums"]


def whole_vocab(shape: str) -> bool:
    """A local shape holding all 80 ids: a dimension of 80, or the two 40-id shards side by side."""
    dims = shape.split("x")
    return "80" in dims or any(dims[i:i + 2] == ["2", "40"] for i in range(len(dims) - 1))


@pytest.mark.parametrize("case, blocks", [("gpt_oss_20b", 1), ("gpt_oss_20b:blocks", 4)])
def test_decoder_loss_holds_no_full_vocabulary_buffer(programs, case, blocks):
    """gpt_oss's cross-entropy on a vocab-split mesh, kept whole (the smoke's size) and in 4 recomputed blocks
    (`:blocks`, tests/helpers/mesh_split.py): every buffer of the step is a vocabulary shard (no dimension of
    the full 80 ids, nor [2 shards x 40] whole on one device), each block's head input gradient is summed over
    `model` and its kernel gradient is a shard summed over `data`."""
    p = programs[case]
    assert p["vocab"] == 80
    full = [r for r in p["results"] if whole_vocab(r)]
    assert not full, full
    ops = p["contractions"]
    dx = [c for c in ops if c["equation"] == "bckr,mkr->bcm"]
    dw = [c for c in ops if c["equation"] == "bcm,bckr->mkr"]
    assert len(dx) == len(dw) == blocks, (dx, dw)
    assert all(c["operands"][1] == "32x1x40" and SUM_OVER_MODEL in c["collectives"] for c in dx), dx
    assert all(c["result"] == "32x1x40" and SUM_OVER_DATA in c["collectives"] for c in dw), dw
    if blocks > 1:  # the recomputed blocks: 128 / blocks positions each
        assert sorted({c["operands"][0] for c in dx}) == [f"1x{128 // blocks}x1x40"], dx


def test_mutant_with_a_gathered_lm_head_shows_the_whole_vocabulary(programs):
    mutant = [r for r in programs["gpt_oss_20b:mutant"]["results"] if whole_vocab(r)]
    assert mutant, "the mutant's gathered LM head should show a full-vocabulary buffer"


def test_mutant_with_a_replicated_attention_output_fails(programs):
    """The mutant (attention output projection on gathered operands: the same losses) fails."""
    mutant = programs["gpt_oss_20b:mutant"]
    with pytest.raises(AssertionError, match="bshgd,hgdm->bsm"):
        check_split(mutant, "gpt_oss_20b")
    # Its two operands are gathered to full heads, and its LM head to the whole vocabulary: three all-gathers
    # more than the real model's.
    assert sorted(set(mutant["all_gathers"]) - set(ALL_GATHERS["gpt_oss_20b"])) == \
        ["1x128x1x2x8->1x128x2x2x8", "1x2x8x32->2x2x8x32", "32x1x40->32x2x40"]
