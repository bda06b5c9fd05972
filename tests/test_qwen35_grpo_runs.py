"""qwen35_397b_grpo's GRPO loop: configs/qwen35_397b_grpo/smoke.yaml and smoke-mesh.yaml (a 2x2 DTensor mesh) run
as shipped (one process) and raise pass@4 on the held-out toy tasks from its start value to the target, the mesh
step for step as one device without XLA, with a log labelled a smoke that fails the
6.1.0 checker on its size-bound rule only (max_sequence_length 65536), and passes it with that value; the loop's
pieces in-process on the smoke's tiny model against NumPy: the toy environment, the rollout batch (rewards,
leave-one-out advantages, the generator's log-probs equal to the trainer's), the loss term the harness step
reads, pass@k / pass^k / pass@1, and a refit (weights changed in place) read by the next rollouts without a
retrace."""
from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import REPO, read_summary, run_cli, runs_in_one_process
from tests.helpers import decoder_golden

CONFIG = os.path.join(REPO, "configs", "qwen35_397b_grpo", "smoke.yaml")
MESH = os.path.join(REPO, "configs", "qwen35_397b_grpo", "smoke-mesh.yaml")


# ------------------------------------------------------------------------------------ the smoke, as shipped

@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """smoke.yaml and smoke-mesh.yaml as shipped, in one process (4 logical CPUs, the mesh's; the one-device
    run takes the first)."""
    path = str(tmp_path_factory.mktemp("qwen35_grpo_smoke"))
    procs = runs_in_one_process(4, [[CONFIG], [MESH]], path, timeout=900)
    return {name: (proc, read_summary(os.path.join(path, str(n)), "qwen35_397b_grpo")
                   if proc.returncode in (0, 1, 3) else None)
            for n, (name, proc) in enumerate(zip(("smoke", "mesh"), procs))}


@pytest.fixture(scope="module")
def no_xla(tmp_path_factory):
    """smoke.yaml for 6 steps with XLA off: what the CPU mesh computes (a CPU mesh builds no XLA program, and
    XLA's stateless draws are other numbers than the TensorFlow kernels')."""
    path = str(tmp_path_factory.mktemp("qwen35_grpo_no_xla"))
    proc = run_cli("run", CONFIG, "--output_dir", path, "--set", "runtime.jit_compile=false",
                   "--set", "grpo.max_steps=6", timeout=600)
    assert proc.returncode in (1, 3), proc.stdout[-2000:] + proc.stderr[-2000:]
    return read_summary(path, "qwen35_397b_grpo")


@pytest.mark.parametrize("name", ["smoke", "mesh"])
def test_smoke_raises_pass_at_4_to_the_target_with_a_smoke_log(smoke, name, tmp_path):
    from harness import benchmark_rules as rules
    from harness.mlperf import run_compliance_checker
    from harness.review import logparse
    from harness.train.size_bound import resized_log

    proc, summary = smoke[name]
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]   # EXIT_NONCOMPLIANT, never a pass
    scores = [e["score"] for e in summary["evals"]]
    assert summary["status"] == "success" and scores[-1] > 0.69 and summary["target"] == 0.69
    assert scores[0] < 0.3 and len(scores) >= 3, scores      # the start value (after one step), then a real rise
    assert [set(e["metrics"]) for e in summary["evals"]] == [{"pass@k", "pass^k", "pass@1"}] * len(scores)
    assert summary["traces"] == {"train": 1, "eval": 1}     # every rollout batch and refit reused the compiles
    assert summary["train_totals"]["rollouts"] == summary["samples_trained"]
    # one generator and trainer, same kernels: nothing masked (pitfall: different kernels silently mask)
    assert summary["train_totals"]["tis_dropped"] == summary["train_totals"]["logprob_error_masked"] == 0
    # the official checker: the size-bound rule alone fails, the log with the reference's value passes
    bound = dict(rules.record("qwen35_397b_grpo").size_bound)
    assert bound == {"max_sequence_length": 65536}
    verdict = summary["compliance"]["6.1.0"]
    assert not verdict["passed"] and all("max_sequence_length" in e for e in verdict["errors"]), verdict
    assert summary["size_bound"] == {"keys": bound, "rest_pass": {"6.1.0": True}}
    sized = str(tmp_path / "sized.txt")
    assert resized_log(summary["log"], bound, sized) == 1
    assert run_compliance_checker(sized, "6.1.0").passed
    # labelled a smoke on synthetic data: in the log, the summary and the printed lines
    keys = {e.key: e.value for e in logparse.parse_log(summary["log"])}
    assert keys["harness_smoke"] == "qwen35_397b_grpo-smoke (toy verifiable task; not an MLPerf result)"
    assert keys["harness_data_source"] == "synthetic" and summary["synthetic_data"]
    assert keys["submission_division"] == "open" and keys["submission_platform"] == "cpu-smoke"
    assert (keys["eval_samples"], keys["num_prompts_per_step"], keys["num_generations_per_prompt"]) == (251, 4, 16)
    assert "SYNTHETIC" in proc.stdout
    # the mesh splits heads, SwiGLU units, vocabulary and experts over `model`
    assert (keys["tensor_parallelism"], keys["expert_parallelism"]) == ((2, 2) if name == "mesh" else (1, 1))


def test_mesh_smoke_trains_and_evaluates_as_one_device_without_xla(smoke, no_xla):
    """The 2x2 mesh (FSDP, experts split) against one device, both without XLA: the same rollouts (a draw is
    an argmax of logits plus noise, so logits equal to float rounding give the same tokens but for a near-tie),
    so the same losses and pass@4 after steps 1 and 6. Measured here: equal to every digit printed, through
    all 14 evals of the two runs to the target (0.0637 after step 1, 0.8725 after step 66)."""
    mesh, one = smoke["mesh"][1], no_xla
    assert mesh, smoke["mesh"][0].stdout[-2000:] + smoke["mesh"][0].stderr[-2000:]
    assert [e["step"] for e in one["evals"]] == [1, 6] == [e["step"] for e in mesh["evals"][:2]]
    for a, b in zip(mesh["evals"][:2], one["evals"]):
        assert a["counted"] == b["counted"] == 251
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-4, atol=1e-6)
        # a near-tie broken the other way moves pass@4 by at most one task of 251
        assert abs(a["score"] - b["score"]) <= 1 / 251 + 1e-9, (a, b)
    assert mesh["train_totals"]["rollouts"] == mesh["samples_trained"]
    # the same kernels on both sides of the trainer and generator: no sample masked for a log-prob mismatch
    assert mesh["train_totals"]["logprob_error_masked"] == mesh["train_totals"]["tis_dropped"] == 0


# ------------------------------------------------------------------------------------ the environment

def test_toy_task_split_prompts_and_rewards():
    from benchmarks.qwen35_397b_grpo.environment import BOS, FIRST_ANSWER, SEP, KeyedAnswerTask

    env = KeyedAnswerTask(vocab_size=32, num_keys=8, eval_tasks=251, seed=0)
    assert env.num_distractors == 13 and env.num_tasks == 8 * 13 * 13
    train, held = set(env.train_ids.tolist()), set(env.eval_ids.tolist())
    assert len(held) == 251 and not train & held and train | held == set(range(env.num_tasks))
    assert sorted(env.answers.tolist()) == list(range(FIRST_ANSWER, FIRST_ANSWER + 8))   # a permutation
    prompts = {tuple(env.reset(t)) for t in range(env.num_tasks)}
    assert len(prompts) == env.num_tasks                                        # every task its own prompt
    for t in (0, 77, env.num_tasks - 1):
        p = env.reset(t)
        key = p[2] - FIRST_ANSWER - 8
        assert p[0] == BOS and p[-1] == SEP and len(p) == env.prompt_length
        assert env.target(t) == env.answers[key] and env.parts(t)[0] == key
        # a scripted policy that knows the rule solves every task; any other answer none
        right = env.step(t, [env.target(t)])
        assert (right.done, right.reward, right.observation) == (True, 1.0, ())
        assert all(env.step(t, [a]).reward == 0.0 for a in range(32) if a != env.target(t))
    assert KeyedAnswerTask(32, seed=1).answers.tolist() != env.answers.tolist()
    with pytest.raises(ValueError, match="no distractor"):
        KeyedAnswerTask(vocab_size=19, num_keys=8)


def test_pass_metrics_on_a_fixed_reward_matrix():
    from benchmarks.qwen35_397b_grpo.workload import pass_metrics

    r = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1], [0, 0, 0, 0]], float)
    assert pass_metrics(r) == {"pass@k": 3 / 5, "pass^k": 1 / 5, "pass@1": 7 / 20}


# ------------------------------------------------------------------------------------ the loop's pieces

@pytest.fixture(scope="module")
def workload():
    return decoder_golden.build_workload(CONFIG, [])


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def leave_one_out(r: np.ndarray, n: int) -> np.ndarray:
    out = []
    for group in r.reshape(-1, n):
        for i in range(n):
            others = np.delete(group, i)
            b, s = others.mean(), others.std(ddof=1)
            out.append((group[i] - b) / (s + 1e-6) if s > 0 else group[i] - b)
    return np.array(out)


def test_rollout_batch_and_loss_term_against_numpy(workload):
    import tensorflow as tf

    b, facts = workload.rollouts(3)
    env, g, p = workload.env, workload.group, workload.prompts_per_step
    tasks = [int(t) for t in env.train_ids[2 * p:3 * p] for _ in range(g)]   # step 3: the third P tasks, G each
    n, s = len(tasks), env.prompt_length
    np.testing.assert_array_equal(b["tokens"][:, :s], [env.reset(t) for t in tasks])
    np.testing.assert_array_equal(b["lengths"], s + 1)
    np.testing.assert_array_equal(b["generated"], np.tile(np.arange(s + 1) == s, (n, 1)))
    rewards = (b["tokens"][:, s] == [env.target(t) for t in tasks]).astype(float)
    assert facts["reward"] == pytest.approx(rewards.mean())
    np.testing.assert_allclose(b["advantages"], leave_one_out(rewards, g), atol=1e-6)
    assert len(set(b["tokens"][:g, s].tolist())) > 1                        # a group's draws differ
    # the generator's log-prob of each drawn token is the trainer's full forward's (temperature 1, top-p 1)
    tokens = tf.constant(b["tokens"])
    hidden, _ = workload.model(tokens)
    logits = workload.model.logits(hidden).numpy()[:, s - 1]
    lp = log_softmax(logits)[np.arange(n), b["tokens"][:, s]]
    np.testing.assert_allclose(b["logprobs"][:, s], lp, atol=1e-5)
    # the loss term: numerator -sum A_i w_i over the generated tokens (w = exp(lp - lp_gen), kept), count n
    terms, stats = workload.loss({k: tf.constant(v) for k, v in b.items()}, tf.constant([0, 0], tf.int64))
    term = terms["grpo"]
    w = np.exp(lp - b["logprobs"][:, s])
    assert np.all(np.abs(np.log(w)) < 1e-3)                                  # inside seq-mask-tis's bounds
    assert float(term.count) == n
    assert float(term.total) == pytest.approx(-(b["advantages"] * w).sum(), abs=1e-5)
    assert {k: float(v) for k, v in stats.items()} == {"rollouts": n, "logprob_error_masked": 0.0,
                                                       "tis_dropped": 0.0, "overlong": 0.0}


def test_a_refit_is_read_by_the_next_rollouts_without_a_retrace(workload):
    """Weights changed in place (what the optimizer step does) change the next rollouts' log-probs; the
    generator's compiled prefill is reused."""
    before, _ = workload.rollouts(1)
    again, _ = workload.rollouts(1)
    np.testing.assert_array_equal(again["tokens"], before["tokens"])        # same seed, same weights
    traces = workload.generator._prefill.experimental_get_tracing_count()
    head = workload.model.output
    saved = head.numpy()
    try:
        head.assign(saved * 3.0)
        after, _ = workload.rollouts(1)
    finally:
        head.assign(saved)
    assert workload.generator._prefill.experimental_get_tracing_count() == traces
    assert not np.allclose(after["logprobs"], before["logprobs"])
