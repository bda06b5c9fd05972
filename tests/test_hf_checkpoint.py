"""harness/nn/hf_checkpoint.py and harness/export/weights.py on the transformers-made checkpoints of
tests/data/hf_golden/: import -> a run's final weights -> export gives back every tensor transformers wrote,
bit for bit (sharded export, index json), and the export imports into a fresh model bit-exactly; a checkpoint
that does not fit the model is refused in one line naming each problem; MXFP4 expert weights decode to the
values they encode; the export command's refusals."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from harness import config as config_lib
from harness.errors import HarnessError
from harness.nn import hf_checkpoint
from harness.export import weights as export
from tests.conftest import REPO, cli_in_process
from tests.test_hf_golden import CASES, GOLDEN, build

pytestmark = pytest.mark.quick


def tensors_of(path: str) -> dict[str, np.ndarray]:
    ckpt = hf_checkpoint.Checkpoint(path)
    return {name: ckpt.read(name) for name in ckpt.meta}


def save_run(wl, run_dir: str) -> None:
    os.makedirs(run_dir)
    config_lib.dump_config(wl.cfg, os.path.join(run_dir, "config.yaml"))
    export.save(wl.runtime, wl, run_dir)


@pytest.mark.parametrize("case", ["llama", "llama_fused_qkv", "gpt_oss_plain", "gpt_oss_features", "bert"])
def test_import_export_round_trip_is_bit_exact(case, tmp_path):
    workload, overrides = CASES[case]
    wl = build(workload, overrides + [f"model.init_checkpoint={os.path.join(GOLDEN, case)}"])
    run_dir, out = str(tmp_path / "run"), str(tmp_path / "hf")
    save_run(wl, run_dir)
    written = export.export(run_dir, out, max_shard="100KB")
    assert hf_checkpoint.INDEX in written and len(written) > 3          # sharded, with its index
    got = tensors_of(out)
    # The fused case exports q/k/v separate, as transformers writes them: the llama case's tensors.
    want = tensors_of(os.path.join(GOLDEN, "llama" if case == "llama_fused_qkv" else case))
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name
    with open(os.path.join(out, "config.json")) as f:
        assert "model_type" in json.load(f)
    fresh = build(workload, overrides + ["seed=3", f"model.init_checkpoint={out}"])
    before = {v.path: hf_checkpoint.host_value(v.variable) for v in export.model_variables(wl.runtime, wl)}
    after = {v.path: hf_checkpoint.host_value(v.variable) for v in export.model_variables(fresh.runtime, fresh)}
    assert sorted(before) == sorted(after)
    for path, value in before.items():
        assert np.array_equal(after[path], value), path


def damaged_llama(tmp_path) -> str:
    """The llama case with one tensor missing, one unexpected, one mis-shaped and one config key off."""
    out = tmp_path / "damaged"
    out.mkdir()
    tensors = load_file(os.path.join(GOLDEN, "llama", "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.layers.0.mlp.extra.weight"] = np.zeros((4, 4), np.float32)
    tensors["model.norm.weight"] = np.ones((32,), np.float32)
    save_file(tensors, str(out / "model.safetensors"))
    with open(os.path.join(GOLDEN, "llama", "config.json")) as f:
        config = json.load(f)
    config["rms_norm_eps"] = 1e-6
    with open(out / "config.json", "w") as f:
        json.dump(config, f)
    return str(out)


def test_a_checkpoint_that_does_not_fit_is_refused_naming_each_problem(tmp_path):
    workload, overrides = CASES["llama"]
    with pytest.raises(HarnessError) as e:
        build(workload, overrides + [f"model.init_checkpoint={damaged_llama(tmp_path)}"])
    message = str(e.value)
    assert "\n" not in message and "4 problem(s)" in message
    for part in ("config.json rms_norm_eps=1e-06, the model has model.norm_epsilon=1e-05",
                 "tensor model.layers.1.mlp.up_proj.weight missing",
                 "tensor model.norm.weight has shape [32], the model needs [64]",
                 "tensor model.layers.0.mlp.extra.weight unexpected"):
        assert part in message


def test_gpt_oss_features_are_refused_by_the_base_model():
    """The published architecture's config (YaRN, the clamped SwiGLU) and its sinks and biases with values
    that change the output: the base model cannot compute them, so the import says so."""
    workload, overrides = CASES["gpt_oss_plain"]
    with pytest.raises(HarnessError) as e:
        build(workload, overrides + [f"model.init_checkpoint={os.path.join(GOLDEN, 'gpt_oss_features')}"])
    message = str(e.value)
    assert "RoPE rope_type=yarn" in message and "swiglu_alpha=1.702, swiglu_limit=7.0" in message
    assert "the model has no such weight, so it must be" in message and "more" in message


def test_bert_refuses_the_erf_gelu(tmp_path):
    shutil.copytree(os.path.join(GOLDEN, "bert"), tmp_path / "bert")
    with open(tmp_path / "bert" / "config.json") as f:
        config = json.load(f)
    config["hidden_act"] = "gelu"
    with open(tmp_path / "bert" / "config.json", "w") as f:
        json.dump(config, f)
    workload, overrides = CASES["bert"]
    with pytest.raises(HarnessError, match="hidden_act=gelu: the model's GELU is the tanh form"):
        build(workload, overrides + [f"model.init_checkpoint={tmp_path / 'bert'}"])


def mxfp4_pack(codes: np.ndarray, exponents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FP4 codes [..., n] (0-15) as bytes of two, low nibble first, [..., n/32, 16]; exponents [..., n/32] as
    the E8M0 scales (bias 127)."""
    codes = codes.astype(np.uint8)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(*exponents.shape, 16)
    return packed, (exponents + 127).astype(np.uint8)


def test_mxfp4_experts_load_as_the_values_they_encode(tmp_path):
    """Expert weights drawn from e2m1 values x 2^(scale - 127), stored once as float and once as MXFP4
    blocks and scales (out x in, as openai/gpt-oss-20b stores them): both imports give the same variables."""
    rng = np.random.default_rng(0)
    tensors = load_file(os.path.join(GOLDEN, "gpt_oss_plain", "model.safetensors"))
    plain, quantized = dict(tensors), dict(tensors)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, n_in, n_out = tensors[name].shape
        codes = rng.integers(0, 16, size=(e, n_out, n_in))
        exps = rng.integers(-3, 2, size=(e, n_out, n_in // 32))
        e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])  # the OCP MX table
        stored = (e2m1[codes].reshape(e, n_out, -1, 32) * 2.0 ** exps[..., None]).reshape(e, n_out, n_in)
        plain[name] = np.ascontiguousarray(stored.transpose(0, 2, 1)).astype(np.float32)
        blocks, scales = mxfp4_pack(codes, exps)
        del quantized[name]
        quantized[f"{name}_blocks"], quantized[f"{name}_scales"] = blocks, scales
    for label, data in (("plain", plain), ("mxfp4", quantized)):
        os.makedirs(tmp_path / label)
        save_file(data, str(tmp_path / label / "model.safetensors"))
        shutil.copy(os.path.join(GOLDEN, "gpt_oss_plain", "config.json"), tmp_path / label)
    workload, overrides = CASES["gpt_oss_plain"]
    values = {}
    for label in ("plain", "mxfp4"):
        wl = build(workload, overrides + [f"model.init_checkpoint={tmp_path / label}"])
        values[label] = {v.path: hf_checkpoint.host_value(v.variable) for v in export.model_variables(wl.runtime, wl)}
    expert = "gpt_oss/layer_1/moe/experts/gate/kernel"
    assert np.abs(values["plain"][expert]).max() > 0
    for path, value in values["plain"].items():
        assert np.array_equal(values["mxfp4"][path], value), path


def test_export_refusals(tmp_path):
    with pytest.raises(HarnessError, match="no config.yaml"):
        export.export(str(tmp_path), str(tmp_path / "out"))
    workload, overrides = CASES["llama"]
    wl = build(workload, overrides)
    os.makedirs(tmp_path / "run")
    config_lib.dump_config(wl.cfg, str(tmp_path / "run" / "config.yaml"))
    with pytest.raises(HarnessError, match="save_final_weights: true"):
        export.export(str(tmp_path / "run"), str(tmp_path / "out"))
    with pytest.raises(HarnessError, match="max shard size 'lots'"):
        hf_checkpoint.parse_size("lots")
    proc = cli_in_process("export", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: export needs --out DIR for the Hugging Face checkpoint"


@pytest.mark.parametrize("workload", ["llama31_8b", "gpt_oss_20b"])
def test_closed_pretraining_refuses_a_checkpoint(workload):
    from benchmarks import registry
    from harness.runtime import make_runtime
    from tests.helpers import decoder_golden

    cfg = config_lib.load_config(os.path.join(decoder_golden.REPO, "configs", workload, "reference.yaml"),
                                 ["runtime.kind=default", "runtime.cpu_devices=0", "runtime.mesh={data: 1, model: 1}",
                                  "runtime.layout={}", "runtime.fsdp=false",
                                  f"model.init_checkpoint={os.path.join(GOLDEN, 'llama')}"])
    wl = registry.get(workload)(cfg, make_runtime(cfg.runtime))
    with pytest.raises(HarnessError, match="pretrains from the reference's random initialization"):
        wl.validate_config()


def test_the_reference_gpt_oss_q_k_norm_neither_imports_nor_exports(tmp_path):
    """The MLPerf reference's gpt_oss_20b normalizes q and k (model.qk_norm, its default), which transformers'
    GptOssForCausalLM cannot express: a checkpoint import into it and an export of it are refused in one line."""
    workload, overrides = CASES["gpt_oss_plain"]
    with pytest.raises(HarnessError, match=r"model.qk_norm") as e:
        build(workload, overrides + ["model.qk_norm=true",
                                     f"model.init_checkpoint={os.path.join(GOLDEN, 'gpt_oss_plain')}"])
    assert "\n" not in str(e.value)
    wl = build(workload, overrides + ["model.qk_norm=true"])
    save_run(wl, str(tmp_path / "run"))
    with pytest.raises(HarnessError, match=r"model.qk_norm: .* cannot express"):
        export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
    assert not os.path.exists(tmp_path / "hf")


def test_a_checkpoint_that_does_not_fit_is_refused_before_the_log_opens(tmp_path):
    """Names and shapes come from the file headers, so a run refuses them before its run directory exists."""
    workload, overrides = CASES["llama"]
    runs = tmp_path / "runs"
    from tests.helpers import decoder_golden

    path = _llama_copy(tmp_path)   # config.json as the model has it; one tensor mis-shaped
    tensors = load_file(os.path.join(path, "model.safetensors"))
    tensors["model.norm.weight"] = np.ones((32,), np.float32)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    items = decoder_golden.ONE_DEVICE + overrides + [f"model.init_checkpoint={path}"]
    proc = cli_in_process("run", os.path.join(REPO, "configs", workload, "smoke.yaml"), "--output_dir", str(runs),
                          *[o for item in items for o in ("--set", item)])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "1 problem(s)" in lines[0], proc.stderr[-2000:]
    assert "tensor model.norm.weight has shape [32], the model needs [64]" in lines[0]
    assert not runs.exists() or not any(runs.rglob("*")), sorted(runs.rglob("*"))


def _llama_copy(tmp_path) -> str:
    out = tmp_path / "copy"
    shutil.copytree(os.path.join(GOLDEN, "llama"), out)
    return str(out)


def _write_header(path: str, header: object) -> None:
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)


@pytest.mark.parametrize("damage, says", [
    ("header_list", "its header is a JSON list, not an object"),
    ("header_entry", "its header entry 'x' is not {dtype, shape, data_offsets}"),
    ("weight_map", "weight_map must give each tensor a file name in the directory"),
    ("config_value", "config.json rms_norm_eps='abc' is not a number"),
])
def test_malformed_checkpoint_files_are_one_line(damage, says, tmp_path):
    workload, overrides = CASES["llama"]
    path = _llama_copy(tmp_path)
    if damage == "header_list":
        _write_header(os.path.join(path, "model.safetensors"), [1, 2, 3])
    elif damage == "header_entry":
        _write_header(os.path.join(path, "model.safetensors"), {"x": 5})
    elif damage == "weight_map":
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {"model.norm.weight": 5}}, f)
    else:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        config["rms_norm_eps"] = "abc"
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
    cfg = config_lib.load_config(os.path.join(REPO, "configs", workload, "smoke.yaml"), overrides)
    from benchmarks import registry

    with pytest.raises(HarnessError) as e:
        hf_checkpoint.check_config(path, registry.get(workload).HF_FORMAT, cfg.model)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_gpt_oss_clamp_keys_that_are_not_numbers_are_one_line():
    from benchmarks.gpt_oss_20b import hf_names

    workload, overrides = CASES["gpt_oss_plain"]
    cfg = config_lib.load_config(os.path.join(REPO, "configs", workload, "smoke.yaml"), overrides)
    with open(os.path.join(GOLDEN, "gpt_oss_plain", "config.json")) as f:
        config = dict(json.load(f), swiglu_limit=None)
    assert hf_names.config_problems(config, cfg.model) == ["config.json swiglu_limit=None is not a number"]


def test_export_refuses_a_directory_holding_files_and_a_zero_shard(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"old")
    proc = cli_in_process("export", str(tmp_path / "run"), "--out", str(out))
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: --out {out}: not empty; export writes a whole checkpoint into an empty or new directory")
    assert (out / "model.safetensors").read_bytes() == b"old"
    with pytest.raises(HarnessError, match="give a positive number of bytes"):
        hf_checkpoint.parse_size("0")
    with pytest.raises(HarnessError, match="give a positive number of bytes"):
        hf_checkpoint.parse_size("0GB")
