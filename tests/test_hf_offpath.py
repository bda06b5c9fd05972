"""Checkpoints off the golden path: transformers' own tiny checkpoints at configurations the golden cases do
not take (tests/data/hf_offpath/, made by scripts/make_hf_offpath.py) import with transformers' logits or are
refused in one line before a log opens; damaged safetensors files are refused likewise, never a
SafetensorError traceback after the log has opened."""
from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from harness import config as config_lib
from harness.errors import HarnessError
from harness.nn import hf_checkpoint
from tests.conftest import REPO, cli_in_process
from tests.helpers import decoder_golden
from tests.test_hf_golden import CASES, GOLDEN, build, relative

pytestmark = pytest.mark.quick

OFFPATH = os.path.join(REPO, "tests", "data", "hf_offpath")
LLAMA = ["model.vocab_size=128", "model.hidden_size=32", "model.ffn_hidden=48", "model.num_layers=2",
         "model.num_heads=4", "model.num_kv_heads=2", "model.head_dim=8", "model.rope_base=10000",
         "model.rope_scaling_factor=0", "model.norm_epsilon=1e-5", "data.seq_length=32"]
# 12 experts in 4 groups, top-3 from 2 groups; rms_norm_eps 1e-5 (the MLA latent norms keep 1e-6)
DEEPSEEK = ["data.seq_length=32", "model.seq_aux_loss_coef=0", "model.mtp_layers=0", "model.vocab_size=128",
            "model.num_layers=3", "model.first_dense_layers=1", "model.num_experts=12", "model.expert_groups=4",
            "model.groups_per_token=2", "model.experts_per_token=3", "model.expert_hidden=16",
            "model.norm_epsilon=1e-5"]
WORKLOADS = {"llama": ("llama31_8b", LLAMA), "deepseek": ("deepseekv3_671b", DEEPSEEK)}


def logits_of(kind: str, checkpoint: str, extra: list[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(harness logits, transformers' logits) on the golden tokens."""
    import tensorflow as tf

    golden = load_file(os.path.join(checkpoint, "golden.safetensors"))
    workload, overrides = WORKLOADS[kind]
    wl = build(workload, overrides + [f"model.init_checkpoint={checkpoint}", *extra])
    hidden, _ = wl.model(tf.constant(golden["tokens"])[:, :-1])
    return wl.model.logits(hidden).numpy(), golden["logits"]


def refusal(kind: str, checkpoint: str, extra: list[str] = ()) -> str:
    """The one-line refusal of the pre-log checkpoint check (no model built)."""
    from benchmarks import registry

    workload, overrides = WORKLOADS.get(kind) or CASES[kind]
    cfg = config_lib.load_config(os.path.join(REPO, "configs", workload, "smoke.yaml"),
                                 overrides + [f"model.init_checkpoint={checkpoint}", *extra])
    with pytest.raises(HarnessError) as e:
        hf_checkpoint.check_config(checkpoint, registry.get(workload).HF_FORMAT, cfg.model)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_tied_llama_equals_transformers():
    got, want = logits_of("llama", os.path.join(OFFPATH, "llama_tied"))
    assert relative(got, want) < 1e-4


def test_untied_llama_without_its_head_is_refused():
    """transformers reports lm_head.weight missing (and draws a random head); the harness used to tie it."""
    path = os.path.join(OFFPATH, "llama_untied_no_head")
    with open(os.path.join(path, "golden.json")) as f:
        assert json.load(f)["transformers_missing_keys"] == ["lm_head.weight"]
    assert "tensor lm_head.weight missing (config.json tie_word_embeddings=False" in refusal("llama", path)


def test_gpt_oss_without_its_head_is_refused(tmp_path):
    path = str(tmp_path / "gpt_oss")
    shutil.copytree(os.path.join(GOLDEN, "gpt_oss_plain"), path)
    file = os.path.join(path, "model.safetensors")   # transformers wrote this case as one file
    tensors = load_file(file)
    del tensors["lm_head.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    assert "tensor lm_head.weight missing (config.json tie_word_embeddings=False" in refusal("gpt_oss_plain", path)


def test_a_tied_config_with_a_head_of_its_own_is_refused(tmp_path):
    """transformers would use the embedding and ignore the file's head; the layout would read the head."""
    path = str(tmp_path / "tied_with_head")
    shutil.copytree(os.path.join(OFFPATH, "llama_untied_no_head"), path)
    tensors = load_file(os.path.join(path, "model.safetensors"))
    tensors["lm_head.weight"] = np.ones_like(tensors["model.embed_tokens.weight"])
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as f:
        config = dict(json.load(f), tie_word_embeddings=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    assert "tensor lm_head.weight present but config.json tie_word_embeddings=true" in refusal("llama", path)


def test_deepseek_at_three_of_twelve_experts_equals_transformers():
    """Group scores by transformers' top 2 (the import's default), latent norms at 1e-6 whatever
    rms_norm_eps: equal logits. Megatron's rule (top k // topk_group = 1) is refused for this checkpoint."""
    path = os.path.join(OFFPATH, "deepseek_v3_k3")
    with open(os.path.join(path, "golden.json")) as f:
        notes = json.load(f)
    # Both features move transformers' own logits far past the tolerance: the case exercises them.
    assert notes["megatron_group_rule_moves_logits"] > 0.1 and notes["latent_norm_eps_1e-5_moves_logits"] > 0.1
    got, want = logits_of("deepseek", path)
    assert relative(got, want) < 1e-4, relative(got, want)
    line = refusal("deepseek", path, ["model.group_score_experts=1"])
    assert "scores an expert group by its top 1 experts" in line and "transformers by its top 2" in line


def test_deepseek_group_score_follows_megatron_without_a_checkpoint():
    """Without a checkpoint the MLPerf reference's rule (k // topk_group) holds; at DeepSeek-V3's 8 / 4 both
    rules sum the top 2, so the closed run computes the same either way."""
    from benchmarks.deepseekv3_671b.config import ModelConfig

    assert ModelConfig(experts_per_token=3, groups_per_token=2).group_score_top() == 1
    assert ModelConfig(experts_per_token=3, groups_per_token=2, init_checkpoint="x").group_score_top() == 2
    assert ModelConfig(experts_per_token=8, groups_per_token=4).group_score_top() == 2 == \
        ModelConfig(experts_per_token=8, groups_per_token=4, init_checkpoint="x").group_score_top()


# --------------------------------------------------------------------------------- damaged safetensors

def _damaged(tmp_path, how: str) -> str:
    path = str(tmp_path / how)
    shutil.copytree(os.path.join(OFFPATH, "llama_tied"), path)
    file = os.path.join(path, "model.safetensors")
    data = open(file, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    if how.startswith("short"):
        data = data[:-int(how[5:])]
    else:
        name = next(k for k in sorted(header) if k != "__metadata__")
        if how == "offsets_past_end":
            header[name]["data_offsets"][1] += 10 ** 6
        else:  # dtype_lies: F32 over data of half the size (BF16's)
            header[name]["dtype"] = "BF16"
        text = json.dumps(header).encode()
        data = struct.pack("<Q", len(text)) + text + data[8 + n:]
    with open(file, "wb") as f:
        f.write(data)
    return path


@pytest.mark.parametrize("how, says", [("short1", "cut short"), ("short1000", "cut short"),
                                       ("offsets_past_end", "needs"), ("dtype_lies", "needs")])
def test_safetensors_whose_data_do_not_match_the_header_are_refused(tmp_path, how, says):
    line = refusal("llama", _damaged(tmp_path, how))
    assert "model.safetensors: not a readable safetensors file" in line and says in line, line


def test_a_cut_checkpoint_is_one_line_before_the_run_directory(tmp_path):
    """Fault case: a file cut short passed the header check and ended in a SafetensorError traceback
    after the log had opened."""
    runs = tmp_path / "runs"
    items = decoder_golden.ONE_DEVICE + LLAMA + [f"model.init_checkpoint={_damaged(tmp_path, 'short1000')}"]
    proc = cli_in_process("run", os.path.join(REPO, "configs", "llama31_8b", "smoke.yaml"), "--output_dir",
                          str(runs), *[o for item in items for o in ("--set", item)])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "cut short" in lines[0], proc.stderr[-2000:]
    assert not runs.exists() or not any(runs.rglob("*"))


def test_damaged_final_weights_are_one_line_from_export(tmp_path):
    """Fault case: `export` of a final_weights.safetensors short by 1,000 bytes ended in a traceback."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = config_lib.load_config(os.path.join(REPO, "configs", "llama31_8b", "smoke.yaml"), [])
    config_lib.dump_config(cfg, str(run / "config.yaml"))
    weights = run / "final_weights.safetensors"
    save_file({"a": np.ones((600,), np.float32)}, str(weights))
    weights.write_bytes(weights.read_bytes()[:-1000])
    proc = cli_in_process("export", str(run), "--out", str(tmp_path / "out"))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "final_weights.safetensors: not a readable" in lines[0], \
        proc.stderr
    assert not (tmp_path / "out").exists()
