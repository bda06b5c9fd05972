"""deepseekv3_671b: its parts against small numpy references (the group-limited router, the gate weights, the
sequence-level balance loss, the expert-bias update, the MTP block and loss), the numbers the reference's shapes give
(YaRN's ramp and softmax scale, parameter counts, FLOPs per row), the Hugging Face names both ways, the
config checks, that the transformers golden (tests/test_hf_golden.py, case deepseek_v3) depends on the
expert bias and on the rotary row order, and the CPU smoke run (configs/deepseekv3_671b/smoke.yaml).

No CPU run can pass the deepseekv3_671b checker, open division included (its checker files in mlperf-logging
bind the global batch >= 15360, rows of 4096 tokens and 1024 eval rows). So the smoke is held to a relaxed, harness-only
check, never reported as a compliance pass: it reaches its target, the official checker (6.0.0 and 6.1.0)
fails it on a size-bound rule only, and the same log with those three values set to the reference's passes."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from tests.helpers import decoder_golden

GOLDEN = os.path.join(decoder_golden.REPO, "tests", "data", "hf_golden", "deepseek_v3")
SMOKE = os.path.join(decoder_golden.REPO, "configs", "deepseekv3_671b", "smoke.yaml")


def load(overrides: list[str] = ()):
    from harness import config as C
    return C.load_config(SMOKE, decoder_golden.ONE_DEVICE + list(overrides))


@pytest.fixture(scope="module")
def golden_model():
    """The smoke config's model (scripts/make_hf_goldens.py's tiny configuration) from the transformers golden."""
    from tests.test_hf_golden import DEEPSEEK, build
    return build("deepseekv3_671b", DEEPSEEK + [f"model.init_checkpoint={GOLDEN}"])


# ------------------------------------------------------------------------------------------ router

def np_group_limited_topk(choice: np.ndarray, k: int, groups: int, groups_per_token: int) -> np.ndarray:
    """Token by token as NVIDIA/Megatron-LM@b0cc270:megatron/core/transformer/moe/moe_utils.py
    `group_limited_topk` computes it."""
    t, e = choice.shape
    per = e // groups
    out = np.zeros_like(choice)
    for i in range(t):
        c = choice[i]
        score = [np.sort(c[g * per:(g + 1) * per])[::-1][:k // groups_per_token].sum() for g in range(groups)]
        kept = np.argsort(score)[::-1][:groups_per_token]
        masked = np.full(e, -np.inf)
        for g in kept:
            masked[g * per:(g + 1) * per] = c[g * per:(g + 1) * per]
        out[i, np.argsort(masked)[::-1][:k]] = 1.0
    return out


@pytest.mark.parametrize("experts,k,groups,groups_per_token", [(8, 2, 2, 1), (16, 4, 4, 2), (32, 8, 8, 4)])
def test_group_limited_topk_equals_the_numpy_reference(experts, k, groups, groups_per_token):
    import tensorflow as tf

    from benchmarks.deepseekv3_671b.moe import group_limited_topk

    rng = np.random.default_rng(experts)
    choice = (1 / (1 + np.exp(-rng.normal(size=(3, 5, experts)))) + rng.uniform(0, 0.1, experts)).astype(np.float32)
    got = group_limited_topk(tf.constant(choice), k, groups, groups_per_token).numpy()
    want = np_group_limited_topk(choice.reshape(-1, experts), k, groups, groups_per_token).reshape(choice.shape)
    np.testing.assert_array_equal(got, want)
    assert np.all(got.sum(-1) == k)
    # every chosen expert lies in one of the token's groups_per_token groups
    assert np.all((got.reshape(3, 5, groups, -1).sum(-1) > 0).sum(-1) <= groups_per_token)


def test_gate_weights_normalize_the_unbiased_scores_of_the_chosen_and_scale():
    import tensorflow as tf

    from benchmarks.deepseekv3_671b.moe import gate_weights

    rng = np.random.default_rng(1)
    scores = rng.uniform(0.01, 1, (4, 8)).astype(np.float32)
    chosen = np.zeros_like(scores)
    for i in range(4):
        chosen[i, rng.choice(8, 2, replace=False)] = 1
    got = gate_weights(tf.constant(scores), tf.constant(chosen), 2.5).numpy()
    want = scores * chosen / (scores * chosen).sum(-1, keepdims=True) * 2.5
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got.sum(-1), 2.5, rtol=1e-6)


def test_seq_aux_loss_equals_the_numpy_reference_and_is_one_at_perfect_balance():
    import tensorflow as tf

    from benchmarks.deepseekv3_671b.moe import seq_aux_loss

    rng = np.random.default_rng(2)
    b, t, e, k = 2, 6, 8, 2
    s = (1 / (1 + np.exp(-rng.normal(size=(b, t, e))))).astype(np.float32)
    want = []
    for r in range(b):
        p = s[r] / s[r].sum(-1, keepdims=True)
        m = np.zeros_like(p)
        for i in range(t):
            m[i, np.argsort(s[r, i])[::-1][:k]] = 1
        f = e / (k * t) * m.sum(0)
        want.append((f * p.mean(0)).sum())
    np.testing.assert_allclose(seq_aux_loss(tf.constant(s), k).numpy(), want, rtol=1e-5)
    # perfect balance (every expert chosen equally often: f_e = 1) gives sum_e P_e = 1, whatever the scores
    flat = np.full((1, 4, 8), 0.5, np.float32)
    for i in range(4):
        flat[0, i, 2 * i:2 * i + 2] = 0.6 + 0.1 * i
    assert seq_aux_loss(tf.constant(flat), 2).numpy()[0] == pytest.approx(1.0, rel=1e-5)


# ------------------------------------------------------------------------------------- the numbers

def test_yarn_ramp_and_softmax_scale_are_the_specs():
    """As transformers' YaRN computes them (modeling_rope_utils.py): over rope dim 16 the ramp is [0, 0, 0, .25,
    .5, .75, 1, 1]; the softmax scale 0.33125 at the tiny configuration and 0.1352338 at the full one."""
    from benchmarks.deepseekv3_671b.config import ModelConfig
    from harness.nn.layers import rope_frequencies

    tiny = ModelConfig(qk_nope_head_dim=16, qk_rope_head_dim=16)
    inv = rope_frequencies(16, 10000.0, tiny.rope_scaling()).numpy()
    base = 10000.0 ** (-np.arange(8) * 2.0 / 16)
    ramp = (1 - inv / base) / (1 - 1 / 40)
    np.testing.assert_allclose(ramp, [0, 0, 0, .25, .5, .75, 1, 1], atol=1e-6)
    assert tiny.rope_scaling().attention_factor() == 1.0
    for cfg, want in ((tiny, 0.33125), (ModelConfig(), 0.1352338)):
        scale = cfg.rope_scaling().softmax_factor() / math.sqrt(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
        assert scale == pytest.approx(want, abs=1e-5)


def test_parameter_count_is_the_specs_and_the_models(golden_model):
    """284,416 at the tiny configuration without MTP and 78,704 more with it, counted by cost.py
    and by the built model's trainable variables; 671,026,404,352 + 11,610,067,968 at the full size (the
    checkpoint's config.json)."""
    from benchmarks.deepseekv3_671b import cost

    _, params = cost.forward_macs_and_params(golden_model.cfg)
    trainable = sum(v.variable.shape.num_elements() for v in golden_model.runtime.variables(trainable=True))
    assert golden_model.cfg.model.mtp_layers == 0
    assert params == trainable == 284_416
    assert cost.forward_macs_and_params(load())[1] == 284_416 + 78_704
    full = load(["model.mtp_layers=0", "data.seq_length=4096", "model.vocab_size=129280", "model.hidden_size=7168",
                 "model.num_layers=61",
                 "model.num_heads=128", "model.num_kv_heads=128", "model.q_lora_rank=1536",
                 "model.kv_lora_rank=512", "model.qk_nope_head_dim=128", "model.qk_rope_head_dim=64",
                 "model.v_head_dim=128", "model.ffn_hidden=18432", "model.first_dense_layers=3",
                 "model.num_experts=256", "model.experts_per_token=8", "model.expert_hidden=2048",
                 "model.expert_groups=8", "model.groups_per_token=4"])
    assert cost.forward_macs_and_params(full)[1] == 671_026_404_352
    full.model.mtp_layers = 1
    macs, params = cost.forward_macs_and_params(full)
    assert params == 671_026_404_352 + 11_610_067_968
    # NVIDIA's MODEL_TFLOP_PER_SAMPLE=1068 (docs/workloads/deepseekv3_671b.md#sources) per training row of 4096
    # tokens (MTP included)
    assert 3 * 2 * macs / 1e12 == pytest.approx(1068, rel=0.01)


# ------------------------------------------------------------------------------------ HF checkpoint

def test_every_tensor_exports_back_to_what_it_was_imported_from():
    """Each layout entry read from a random checkpoint tensor and written back by its Out is that tensor
    (the rotary row permutation, the per-expert stacking and the MTP block included); export adds only the
    MTP block's copies of the embedding and head."""
    from benchmarks.deepseekv3_671b import hf_names

    m = load().model
    assert m.mtp_layers == 1
    lay = hf_names.layout(m, set(), lambda p: True)
    outs = {o.name: o for o in lay.outs}
    copies = {"model.layers.4.embed_tokens.weight", "model.layers.4.shared_head.head.weight"}
    assert {"model.layers.4.eh_proj.weight", "model.layers.4.mlp.gate.e_score_correction_bias"} <= set(outs)
    assert copies <= set(outs) and all(lay.ignore(n) for n in copies)
    outs = {n: o for n, o in outs.items() if n not in copies}
    rng = np.random.default_rng(3)
    for e in lay.entries:
        parts = [rng.normal(size=p.shape).astype(np.float32) for p in e.parts]
        var = e.to_var(*parts)
        assert var.shape == e.shape, e.path
        for p, original in zip(e.parts, parts):
            np.testing.assert_array_equal(outs[p.name].to_hf(var), original, err_msg=p.name)
    assert {p.name for e in lay.entries for p in e.parts} == set(outs)


def test_each_golden_feature_is_exercised(golden_model):
    """The golden model with its expert biases zeroed, or with the rotary rows left in the checkpoint's
    interleaved order, misses transformers' logits by far more than the tolerance."""
    import tensorflow as tf
    from safetensors.numpy import load_file

    from benchmarks.deepseekv3_671b.hf_names import rope_order

    golden = load_file(os.path.join(GOLDEN, "golden.safetensors"))
    tokens = tf.constant(golden["tokens"][:, :-1])

    def relative() -> float:
        hidden, _ = golden_model.model(tokens)
        logits = golden_model.model.logits(hidden).numpy()
        return float(np.abs(logits - golden["logits"]).max() / np.abs(golden["logits"]).max())

    assert relative() < 1e-4
    variables = {v.path: v.variable for v in golden_model.runtime.variables() if v.path.startswith("deepseek/")}
    biases = {p: v.numpy() for p, v in variables.items() if p.endswith("expert_bias")}
    assert len(biases) == 2 and all(np.all(b > 0) for b in biases.values())
    for p in biases:
        variables[p].assign(np.zeros_like(biases[p]))
    assert relative() > 0.1
    for p, b in biases.items():
        variables[p].assign(b)
    back = np.argsort(rope_order(16))   # rotate-half order -> the checkpoint's interleaved order
    kept = {}
    for p, v in variables.items():
        if p.endswith("q_up/kernel") or p.endswith("kv_down/kernel"):
            kept[p] = a = v.numpy()
            rope = a[..., -16:]
            v.assign(np.concatenate([a[..., :-16], rope[..., back]], -1))
    assert len(kept) == 8
    assert relative() > 0.1
    for p, a in kept.items():
        variables[p].assign(a)
    assert relative() < 1e-4


def test_config_mismatches_are_named(tmp_path):
    import json
    import shutil

    from benchmarks.deepseekv3_671b import hf_names

    with open(os.path.join(GOLDEN, "config.json")) as f:
        hf = json.load(f)
    m = load().model
    assert hf_names.config_problems(hf, m) == []
    hf.update(n_group=4, rope_interleave=False)
    hf["rope_parameters"]["mscale_all_dim"] = 0.0
    problems = hf_names.config_problems(hf, m)
    assert any("n_group=4" in p for p in problems) and any("rope_interleave" in p for p in problems)
    assert any("mscale_all_dim=0.0" in p for p in problems)
    # and the import refuses such a checkpoint in one line
    from harness.errors import HarnessError
    from harness.nn import hf_checkpoint
    from benchmarks.deepseekv3_671b.workload import DeepseekV3Workload

    shutil.copy(os.path.join(GOLDEN, "model.safetensors"), tmp_path)
    with open(tmp_path / "config.json", "w") as f:
        json.dump(hf, f)
    with pytest.raises(HarnessError, match="3 problem"):
        hf_checkpoint.check_config(str(tmp_path), DeepseekV3Workload.HF_FORMAT, m)


@pytest.mark.parametrize("overrides,message", [
    (["model.expert_groups=3"], "not a multiple of model.expert_groups"),
    (["model.groups_per_token=3"], "exceeds model.expert_groups"),
    (["model.experts_per_token=5"], "exceeds the experts of"),
    (["model.num_kv_heads=2"], "must equal model.num_heads"),
    (["submission.division=closed"], r"closed deepseekv3_671b needs schedule.global_batch_size >= 15360"),
])
def test_bad_configs_are_refused_in_one_line(overrides, message):
    from benchmarks import registry
    from harness.errors import HarnessError
    from harness.runtime import make_runtime

    cfg = load(overrides)
    wl = registry.get("deepseekv3_671b")(cfg, make_runtime(cfg.runtime))
    with pytest.raises(HarnessError, match=message) as e:
        wl.validate_config()
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------ expert bias

def test_bias_update_counts_every_training_micro_batch_once_and_no_eval(golden_model):
    """Two training micro-batches, an eval batch between them, then process_gradients with the step statistics
    summed over both (as the loop sums them), traced as one step: each MoE layer's bias moves by
    1e-3 * sign(mean - count) over both micro-batches' routing (counted from the model's own routing before
    the step, numpy sign), and the eval adds nothing. Then a second trace of the step, with process_gradients
    in a conditional branch of it (as float16's loss scaling applies gradients), moves it once more, by the
    routing under the moved biases."""
    import tensorflow as tf
    from safetensors.numpy import load_file

    wl = golden_model
    rows = tf.constant(load_file(os.path.join(GOLDEN, "golden.safetensors"))["tokens"])
    rng = np.random.default_rng(4)
    other = tf.constant(rng.integers(1, 512, rows.shape).astype(np.int32))
    biases = wl.expert_biases()
    before = [b.numpy() for b in biases]
    params = [v.variable for v in wl.runtime.variables(trainable=True)]

    def wanted() -> list[np.ndarray]:
        counts = 0
        for batch in (rows, other):
            _, routings = wl.model(batch[:, :-1])
            counts = counts + np.stack([r.counts.numpy() for r in routings if r is not None])
        return [b.numpy() + 1e-3 * np.sign(n.mean() - n) for b, n in zip(biases, counts)]

    def step(in_branch: bool) -> None:
        grads, stats = None, {}
        for i, batch in enumerate((rows, other)):
            with tf.GradientTape() as tape:
                terms, batch_stats = wl.loss({"tokens": batch}, tf.constant([0, i]))
                loss = tf.add_n([t.total / t.count for t in terms.values()])
            g = [tf.convert_to_tensor(x) for x in tape.gradient(loss, params)]   # embedding: IndexedSlices
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
            stats = {k: stats[k] + v if k in stats else v for k, v in batch_stats.items()}
            if i == 0:
                wl.eval_step({"tokens": other}, tf.ones([rows.shape[0]]))
        if in_branch:
            tf.cond(tf.constant(True),
                    lambda: tf.add_n([tf.reduce_sum(g) for g in wl.process_gradients(grads, stats)]),
                    lambda: tf.constant(0.0))
        else:
            wl.process_gradients(grads, stats)

    try:
        want = wanted()
        tf.function(lambda: step(False))()
        for b, w in zip(biases, want):
            np.testing.assert_allclose(b.numpy(), w, rtol=0, atol=1e-7)
        assert any(np.any(b.numpy() != b0) for b, b0 in zip(biases, before))
        moved = [b.numpy() for b in biases]
        want = wanted()
        tf.function(lambda: step(True))()                   # traced anew, the update in a branch
        for b, w in zip(biases, want):
            np.testing.assert_allclose(b.numpy(), w, rtol=0, atol=1e-7)
        assert any(np.any(b.numpy() != m) for b, m in zip(biases, moved))
    finally:
        for b, b0 in zip(biases, before):
            b.assign(b0)


# ---------------------------------------------------------------------------- multi-token prediction

def test_a_checkpoint_without_the_mtp_block_leaves_it_be():
    """transformers writes no MTP block: the layout then reads none (and ignores a partial one's copies);
    with the block's tensors present it reads them all."""
    from benchmarks.deepseekv3_671b import hf_names
    from harness.nn.hf_checkpoint import Checkpoint

    m = load().model
    names = set(Checkpoint(GOLDEN).meta)
    lay = hf_names.layout(m, names, lambda p: True)
    assert not any("mtp_0" in e.path for e in lay.entries)
    assert set(lay.expected()) == names - {n for n in names if lay.ignore(n)}
    assert lay.ignore("model.layers.4.eh_proj.weight")
    full = hf_names.layout(m, names | {"model.layers.4.eh_proj.weight"}, lambda p: True)
    assert {e.path for e in full.entries if "mtp_0" in e.path} >= {"deepseek/mtp_0/eh_proj/kernel",
                                                                   "deepseek/mtp_0/layer/mlp/router/expert_bias"}


def test_mtp_block_and_loss_equal_the_numpy_composition():
    """u = [enorm(Emb(x_i+1)) ; hnorm(H_i)] W_eh (the embedding half first), the MTP layer, its norm, the
    shared head on positions 0..s-2 against x_i+2, weighted 0.1: numpy around the harness's own layer."""
    import tensorflow as tf

    from benchmarks import registry
    from harness.runtime import make_runtime

    cfg = load(["data.seq_length=16"])
    rt = make_runtime(cfg.runtime)
    wl = registry.get("deepseekv3_671b")(cfg, rt)
    with rt.scope():
        wl.build()
    rng = np.random.default_rng(5)
    tokens = rng.integers(1, 512, (2, 17)).astype(np.int32)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    hidden, _ = wl.model(tf.constant(inputs))
    mtp = wl.model.mtp

    def rms(x, gamma):
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * gamma

    emb = wl.model.embeddings.numpy()[targets]
    u = np.concatenate([rms(emb, mtp.enorm.gamma.numpy()), rms(hidden.numpy(), mtp.hnorm.gamma.numpy())], -1)
    u = u @ mtp.eh_proj.numpy()
    y, _ = mtp.layer(tf.constant(u, tf.float32), None)
    want_hidden = rms(y.numpy(), mtp.final_norm.gamma.numpy())
    got_hidden, routing = mtp(hidden, tf.constant(targets))
    np.testing.assert_allclose(got_hidden.numpy(), want_hidden, rtol=1e-4, atol=1e-5)
    assert routing is not None and float(routing.counts.numpy().sum()) == 2 * 16 * 2
    logits = want_hidden[:, :-1] @ wl.model.head().numpy()
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    xent = -np.take_along_axis(logp, targets[:, 1:, None], -1)[..., 0]
    terms, _ = wl.loss({"tokens": tf.constant(tokens)}, tf.constant([0, 0]))
    assert float(terms["mtp"].count) == 2 * 15
    assert float(terms["mtp"].total) == pytest.approx(0.1 * xent.sum(), rel=1e-4)
    assert len(wl.expert_biases()) == 3            # 2 MoE layers and the MTP layer's
    # the eval metric is the main head's alone
    out = wl.eval_step({"tokens": tf.constant(tokens)}, tf.ones([2]))
    assert float(out["nll"]) == pytest.approx(float(terms["cross_entropy"].total), rel=1e-6)


# ----------------------------------------------------------------------------------------- the smoke

SIZE_BOUND = {"global_batch_size": 15360, "max_sequence_length": 4096, "eval_samples": 1024}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """`run` of the shipped smoke configs, as shipped, in one process (4 logical CPUs, the mesh's; the
    one-device smoke takes the first): name -> (process, summary)."""
    from conftest import REPO, read_summary, runs_in_one_process

    path = str(tmp_path_factory.mktemp("deepseek_smoke"))
    names = ("smoke.yaml", "smoke-mesh.yaml")
    procs = runs_in_one_process(4, [[os.path.join(REPO, "configs", "deepseekv3_671b", "smoke.yaml")],
                                    [os.path.join(REPO, "configs", "deepseekv3_671b", "smoke-mesh.yaml")]],
                                path, env={"TF_ENABLE_ONEDNN_OPTS": "1"})
    return {name: (proc, read_summary(os.path.join(path, str(n)), "deepseekv3_671b"))
            for n, (name, proc) in enumerate(zip(names, procs))}


def test_smoke_mesh_scores_as_one_device_with_experts_split(smoke):
    one, mesh = smoke["smoke.yaml"][1], smoke["smoke-mesh.yaml"][1]
    np.testing.assert_allclose([e["score"] for e in mesh["evals"]], [e["score"] for e in one["evals"]], rtol=1e-4)
    assert mesh["num_replicas"] >= 1 and "data=2" in mesh["runtime"] and "model=2" in mesh["runtime"]


@pytest.mark.parametrize("name", ["smoke.yaml", "smoke-mesh.yaml"])
def test_smoke_reaches_its_target_and_fails_the_checker_on_size_bound_rules_only(smoke, name, tmp_path):
    import json
    import re

    from harness.mlperf import run_compliance_checker

    proc, summary = smoke[name]
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]   # EXIT_NONCOMPLIANT, never a pass
    assert summary["status"] == "success" and summary["evals"][-1]["score"] <= 3.0
    assert not summary["compliant"]
    for ruleset, verdict in summary["compliance"].items():
        assert not verdict["passed"] and verdict["errors"], ruleset
        assert all(any(f"'{key}'" in e for key in SIZE_BOUND) for e in verdict["errors"]), verdict["errors"]
    # the harness's own diagnosis (harness/train/size_bound.py), printed and in summary.json
    assert summary["size_bound"] == {"keys": SIZE_BOUND, "rest_pass": {"6.0.0": True, "6.1.0": True}}
    assert "size-bound checker rules" in proc.stdout and "the rest of the log passes" in proc.stdout
    # and independently of it: the log with the reference's sizes passes both rulesets
    sized = []
    with open(summary["log"]) as f:
        for line in f:
            m = re.match(r"(:::MLLOG )(.*)", line)
            if m:
                event = json.loads(m.group(2))
                event["value"] = SIZE_BOUND.get(event["key"], event["value"])
                line = m.group(1) + json.dumps(event) + "\n"
            sized.append(line)
    path = str(tmp_path / "sized.txt")
    with open(path, "w") as f:
        f.writelines(sized)
    for ruleset in ("6.0.0", "6.1.0"):
        verdict = run_compliance_checker(path, ruleset)
        assert verdict.passed, (ruleset, verdict.errors)


def test_attention_kernel_takes_mla_shapes_in_both_formulations():
    """The shared kernel with values narrower than queries and keys and an explicit scale: both formulations
    (TensorFlow's, XLA's) equal a dense numpy softmax attention."""
    import tensorflow as tf

    from benchmarks.lm.attention import causal_attention

    rng = np.random.default_rng(6)
    b, s, h, dqk, dv, scale = 2, 8, 3, 12, 5, 0.37
    q = rng.normal(size=(b, s, h, 1, dqk)).astype(np.float32)
    k = rng.normal(size=(b, s, h, dqk)).astype(np.float32)
    v = rng.normal(size=(b, s, h, dv)).astype(np.float32)
    scores = np.einsum("bqhd,bkhd->bhqk", q[:, :, :, 0], k) * scale + np.triu(np.full((s, s), -1e9), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)[:, :, :, None]
    for xla in (False, True):
        got = causal_attention(tf.constant(q), tf.constant(k), tf.constant(v), xla=xla, scale=scale).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_recomputed_layers_give_the_same_losses_and_routing_counts():
    """model.remat: each layer (the MTP layer too) recomputed in the backward pass returns its routing's
    counts and balance loss once, the same as without, and the same gradients."""
    import tensorflow as tf

    from benchmarks import registry
    from harness.runtime import make_runtime

    tokens = tf.constant(np.random.default_rng(7).integers(1, 512, (2, 17)).astype(np.int32))
    out = {}
    for remat in (False, True):
        cfg = load(["data.seq_length=16", f"model.remat={str(remat).lower()}"])
        rt = make_runtime(cfg.runtime)
        wl = registry.get("deepseekv3_671b")(cfg, rt)
        with rt.scope():
            wl.build()
        params = [v.variable for v in rt.variables(trainable=True)]
        with tf.GradientTape() as tape:
            terms, stats = wl.loss({"tokens": tokens}, tf.constant([0, 0]))
            loss = tf.add_n([t.total / t.count for t in terms.values()])
        grads = tape.gradient(loss, params)
        counts = stats["expert_counts"]
        out[remat] = ({k: float(t.total) for k, t in terms.items()}, counts.numpy(),
                      [tf.convert_to_tensor(g).numpy() for g in grads])
    assert set(out[False][0]) == {"cross_entropy", "mtp", "seq_aux"}
    for k, v in out[False][0].items():
        assert out[True][0][k] == pytest.approx(v, rel=1e-6), k
    np.testing.assert_array_equal(out[True][1], out[False][1])
    assert out[False][1].shape == (3, 8) and np.all(out[False][1].sum(-1) == 2 * 16 * 2)
    for a, b in zip(out[True][2], out[False][2]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_size_bound_diagnosis_names_other_failures(tmp_path):
    """A log that fails on more than its size (here: one line, missing every other required event) is not
    called size-bound only; the rewrite touches the named keys' events alone."""
    from harness.train import size_bound

    src = tmp_path / "log.txt"
    src.write_text(':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", '
                   '"key": "global_batch_size", "value": 8, "metadata": {}}\nnot an event\n')
    out = tmp_path / "out.txt"
    assert size_bound.resized_log(str(src), {"global_batch_size": 15360, "eval_samples": 1024}, str(out)) == 1
    lines = out.read_text().splitlines()
    assert '"value": 15360' in lines[0] and lines[1] == "not an event"
    result = size_bound.diagnose(str(src), ["6.0.0"], {"global_batch_size": 15360})
    assert result["rest_pass"] == {"6.0.0": False}
    assert "fails other rules too under ruleset(s) 6.0.0" in size_bound.describe(result)


def test_size_bound_diagnosis_rewrites_only_the_bounds_a_log_misses(tmp_path):
    """A full-size log (global batch 16384 >= 15360) that fails for another reason gets no size diagnosis;
    one at batch 8 has its batch alone rewritten, to the bound."""
    from harness.train import size_bound

    def log(gbs: int) -> str:
        path = tmp_path / f"log{gbs}.txt"
        path.write_text(f':::MLLOG {{"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", '
                        f'"key": "global_batch_size", "value": {gbs}, "metadata": {{}}}}\n'
                        ':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", '
                        '"key": "eval_samples", "value": 1024, "metadata": {}}\n')
        return str(path)

    bounds = {"global_batch_size": 15360, "eval_samples": 1024}
    assert size_bound.diagnose(log(16384), ["6.0.0"], bounds) is None
    result = size_bound.diagnose(log(8), ["6.0.0"], bounds)
    assert result["keys"] == {"global_batch_size": 15360}
