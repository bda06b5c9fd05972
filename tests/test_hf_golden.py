"""The harness's models equal the reference implementations: tiny checkpoints written by Hugging Face
transformers (tests/data/hf_golden/, made by scripts/make_hf_goldens.py with torch and transformers, which the
harness never imports) load through `model.init_checkpoint` and give transformers' logits (within 1e-4 of
max |logit|) and loss (1e-6 relative), float32 on one device.

Cases: Llama 3.1 with its RoPE scaling exercised (head_dim 128, rows 4x the scaling's original context),
the same weights with q/k/v fused and sharded under 0-based file names (the index's weight_map decides),
gpt-oss with the features the base model lacks neutralized (sinks, biases, YaRN, clamp; the `+ 1` patched
in the script), gpt-oss as transformers defines it (the model's options for sinks, biases, clamped GLU and
YaRN on), DeepSeek-V3 at a tiny configuration (MLA, YaRN, interleaved rotary rows, the biased
group-limited router, the shared expert) and BERT pre-training heads with the tanh GELU. Each would fail
with its feature off: the script records how far the logits move (rope_scaling_moves_logits 1.15 of max
|logit| for Llama)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.helpers import decoder_golden

pytestmark = pytest.mark.quick

GOLDEN = os.path.join(decoder_golden.REPO, "tests", "data", "hf_golden")
LLAMA = ["model.vocab_size=256", "model.hidden_size=64", "model.ffn_hidden=128", "model.num_layers=2",
         "model.num_heads=2", "model.num_kv_heads=1", "model.head_dim=128", "model.rope_base=500000",
         "model.rope_scaling_factor=8", "model.rope_low_freq_factor=1", "model.rope_high_freq_factor=4",
         "model.rope_original_context=16", "model.norm_epsilon=1e-5", "data.seq_length=64"]
GPT_OSS = ["model.vocab_size=256", "model.hidden_size=64", "model.expert_hidden=32", "model.num_layers=2",
           "model.num_heads=4", "model.num_kv_heads=2", "model.head_dim=64", "model.rope_base=150000",
           "model.num_experts=4", "model.experts_per_token=2", "model.sliding_window=8", "model.attention_block=8",
           "model.full_attention_span=0", "model.document_attention=false", "model.moe_group_size=32",
           "model.moe_block_size=8", "model.norm_epsilon=1e-5", "data.seq_length=32", "data.eod_id=0",
           "model.qk_norm=false"]   # transformers' gpt-oss has no q/k norm (the MLPerf reference's model does)
# The published architecture (model options of benchmarks/gpt_oss_20b/config.py): sinks, biases, the clamped
# GLU with its + 1, YaRN at the golden's original context.
GPT_OSS_FEATURES = GPT_OSS + ["model.attention_sinks=true", "model.attention_bias=true", "model.router_bias=true",
                              "model.expert_bias=true", "model.swiglu_alpha=1.702", "model.swiglu_limit=7",
                              "model.swiglu_up_offset=1", "model.rope_type=yarn", "model.rope_original_context=16"]
BERT = ["model.vocab_size=128", "model.hidden_size=64", "model.num_layers=2", "model.num_heads=4",
        "model.ff_size=128", "model.max_position=32", "model.type_vocab_size=2", "model.layer_norm_epsilon=1e-12",
        "data.seq_length=32", "data.max_predictions=32"]
# The deepseekv3_671b tiny configuration (its smoke config's model) at the golden's rows; the sequence
# balance loss and multi-token prediction off, as transformers has neither.
DEEPSEEK = ["data.seq_length=32", "model.seq_aux_loss_coef=0", "model.mtp_layers=0"]
CASES = {"llama": ("llama31_8b", LLAMA), "llama_fused_qkv": ("llama31_8b", LLAMA),
         "gpt_oss_plain": ("gpt_oss_20b", GPT_OSS), "gpt_oss_features": ("gpt_oss_20b", GPT_OSS_FEATURES),
         "deepseek_v3": ("deepseekv3_671b", DEEPSEEK), "bert": ("bert", BERT)}


def build(workload: str, overrides: list[str]):
    """The workload built on one CPU device, float32, its weights from `model.init_checkpoint`."""
    return decoder_golden.build_workload(os.path.join(decoder_golden.REPO, "configs", workload, "smoke.yaml"),
                                         decoder_golden.ONE_DEVICE + overrides)


def harness_outputs(case: str, golden: dict[str, np.ndarray], checkpoint: str,
                    extra: list[str] = ()) -> tuple[np.ndarray, float]:
    """(logits, loss) of the harness model loaded from `checkpoint` on the case's inputs."""
    import tensorflow as tf

    from harness.train.workload import split_loss

    workload, overrides = CASES[case]
    wl = build(workload, overrides + [f"model.init_checkpoint={checkpoint}", *extra])
    if workload == "bert":
        ids = tf.constant(golden["input_ids"])
        rows, seq = ids.shape
        batch = {"input_ids": ids, "input_mask": tf.ones_like(ids), "segment_ids": tf.constant(golden["segment_ids"]),
                 "masked_lm_positions": tf.tile(tf.range(seq)[None], [rows, 1]),
                 "masked_lm_ids": tf.constant(golden["masked_lm_ids"]),
                 "masked_lm_weights": tf.ones([rows, seq]),
                 "next_sentence_labels": tf.constant(golden["next_sentence_labels"])}
        mlm_sum, weights, nsp, mlm = wl.losses(batch, False)
        loss = float(mlm_sum / (weights + 1e-5) + tf.reduce_mean(nsp))
        return mlm.numpy(), loss
    tokens = tf.constant(golden["tokens"])
    hidden, _ = wl.model(tokens[:, :-1])
    terms = split_loss(wl.loss({"tokens": tokens}, tf.constant([0, 0])))[0]
    loss = float(tf.add_n([t.total / (t.count + t.epsilon) for t in terms.values()]))
    return wl.model.logits(hidden).numpy(), loss


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_and_loss_equal_transformers(case):
    golden = load_file(os.path.join(GOLDEN, case, "golden.safetensors"))
    logits, loss = harness_outputs(case, golden, os.path.join(GOLDEN, case))
    assert logits.shape == golden["logits"].shape
    assert relative(logits, golden["logits"]) < 1e-4, relative(logits, golden["logits"])
    np.testing.assert_allclose(loss, float(golden["loss"].reshape(-1)[0]), rtol=1e-6)


def test_llama_scaling_is_exercised():
    """With Llama 3.1's RoPE scaling switched off (and the checkpoint's config.json saying so, else the import
    refuses it), the same weights miss the golden logits by far more than the tolerance."""
    import shutil
    import tempfile

    golden = load_file(os.path.join(GOLDEN, "llama", "golden.safetensors"))
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(GOLDEN, "llama", "model.safetensors"), tmp)
        with open(os.path.join(GOLDEN, "llama", "config.json")) as f:
            config = json.load(f)
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f)
        logits, _ = harness_outputs("llama", golden, tmp, ["model.rope_scaling_factor=0"])
    assert relative(logits, golden["logits"]) > 0.1


@pytest.mark.parametrize("option", ["model.attention_sinks=false", "model.swiglu_limit=0",
                                    "model.swiglu_up_offset=0", "model.rope_type=default"])
def test_each_gpt_oss_feature_is_exercised(option, tmp_path):
    """The published gpt-oss case with one option off (the checkpoint's config.json and tensors made to say so
    where the import checks them: sinks at -1e9, no clamp, plain RoPE; the + 1 is no key) misses transformers'
    logits by far more than the tolerance."""
    import shutil

    golden = load_file(os.path.join(GOLDEN, "gpt_oss_features", "golden.safetensors"))
    checkpoint = str(tmp_path / "ckpt")
    shutil.copytree(os.path.join(GOLDEN, "gpt_oss_features"), checkpoint)
    with open(os.path.join(checkpoint, "config.json")) as f:
        config = json.load(f)
    if option == "model.swiglu_limit=0":
        config["swiglu_limit"] = 1e9
    if option == "model.rope_type=default":
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": 150000.0}
    with open(os.path.join(checkpoint, "config.json"), "w") as f:
        json.dump(config, f)
    extra = [option]
    if option == "model.attention_sinks=false":
        from safetensors.numpy import save_file
        with open(os.path.join(checkpoint, "model.safetensors.index.json")) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        for shard in shards:
            tensors = load_file(os.path.join(checkpoint, shard))
            tensors = {k: np.full_like(v, -1e9) if k.endswith("sinks") else v for k, v in tensors.items()}
            save_file(tensors, os.path.join(checkpoint, shard))
    case_logits, _ = harness_outputs("gpt_oss_features", golden, checkpoint, extra)
    assert relative(case_logits, golden["logits"]) > 0.01
