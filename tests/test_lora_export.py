"""`export` of a llama2_70b_lora run: the adapters in PEFT's format and the merged model, which the harness's
own model reads back computing what the adapted model computed. (That transformers + PEFT load the export and
compute the same logits was checked once in the side virtualenv: scripts/check_peft_export.py.) In process, a
2-layer smoke model: a few seconds."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import REPO

SMOKE = "configs/llama2_70b_lora/smoke.yaml"


@pytest.fixture(scope="module")
def base_ckpt(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("lora_base"))
    import sys
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from make_lora_smoke_base import write_base
    write_base(os.path.join(REPO, SMOKE), out, ["model.frozen_dtype=float32"])
    return out


def build(overrides: list[str]):
    from tests.helpers.step_case import build as step_build
    return step_build(os.path.join(REPO, SMOKE), overrides + ["model.frozen_dtype=float32", "model.lora_dropout=0"])


def logits(wl, ids) -> np.ndarray:
    import tensorflow as tf

    hidden, _ = wl.model(tf.constant(ids, tf.int32))
    return wl.model.logits(hidden).numpy()


def test_lora_export_is_peft_adapters_and_a_merged_model_computing_the_same(base_ckpt, tmp_path, capsys):
    import tensorflow as tf
    from safetensors import safe_open

    from harness import config as config_lib
    from harness.nn import hf_checkpoint
    from harness.export import weights as export

    cfg, rt, wl = build([f"model.init_checkpoint={base_ckpt}"])
    for i, v in enumerate(rt.variables(trainable=True)):  # trained adapters: B is no longer zero
        v.variable.assign(tf.random.stateless_normal(v.variable.shape, [5, i], 0.0, 0.2, v.variable.dtype))
    ids = np.random.default_rng(0).integers(1, cfg.model.vocab_size, size=(2, 12))
    adapted = logits(wl, ids)
    run = tmp_path / "run"
    run.mkdir()
    config_lib.dump_config(cfg, str(run / "config.yaml"))
    model_vars = {v.path: v.variable for v in rt.variables() if not v.path.startswith(wl.optimizer.name + "/")}
    hf_checkpoint.write_safetensors(str(run / export.FILE),
                                    [(p, tuple(v.shape), v.dtype.as_numpy_dtype) for p, v in model_vars.items()],
                                    lambda p: model_vars[p].numpy(), {"format": "mlperf-harness"})

    out = tmp_path / "hf"
    assert export.main([str(run)], str(out), "5GB", "float32", merged=True) == 0
    printed = capsys.readouterr().out
    assert "adapter_config.json, adapter_model.safetensors, base/config.json" in printed
    assert "tokenizer (not written): none: this model's 64-id vocabulary" in printed
    assert "meta-llama/Llama-2-70b-hf" in (out / "TOKENIZER.md").read_text()

    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 16 and config["lora_alpha"] == 32.0
    assert config["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert config["base_model_name_or_path"] == "base"  # the smoke's own base, written beside the adapters
    with safe_open(str(out / "adapter_model.safetensors"), framework="np") as f:
        names = set(f.keys())
        prefix = "base_model.model.model.layers.0.self_attn"
        assert len(names) == 2 * 4 * 2 and f"{prefix}.q_proj.lora_A.weight" in names
        assert f.get_tensor(f"{prefix}.q_proj.lora_A.weight").shape == (16, 64)
        assert f.get_tensor(f"{prefix}.k_proj.lora_B.weight").shape == (32, 16)  # 2 kv heads of 16
        assert f.get_tensor(f"{prefix}.o_proj.lora_A.weight").shape == (16, 64)
        # the fused q/k/v adapter's one A, as PEFT's three
        np.testing.assert_array_equal(f.get_tensor(f"{prefix}.q_proj.lora_A.weight"),
                                      f.get_tensor(f"{prefix}.v_proj.lora_A.weight"))
    with safe_open(str(out / "base" / "model.safetensors"), framework="np") as f, \
            safe_open(os.path.join(base_ckpt, "model.safetensors"), framework="np") as g:
        name = "model.layers.1.self_attn.q_proj.weight"
        np.testing.assert_array_equal(f.get_tensor(name), g.get_tensor(name))  # the frozen base, unchanged

    # The merged model, read by the harness with fresh (zero-B) adapters, computes the adapted logits.
    _, _, merged = build([f"model.init_checkpoint={out / 'merged'}"])
    np.testing.assert_allclose(logits(merged, ids), adapted, atol=2e-4)
    assert np.abs(adapted - logits(build([f"model.init_checkpoint={base_ckpt}"])[2], ids)).max() > 0.1


def test_export_refuses_a_folder_that_is_no_run(tmp_path):
    from harness.errors import HarnessError
    from harness.export import weights as export

    with pytest.raises(HarnessError, match="no config.yaml"):
        export.export(str(tmp_path), str(tmp_path / "out"), merged=True)
