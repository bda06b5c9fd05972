"""benchmarks/qwen35_397b_grpo/grpo.py against NumPy references written here from the definitions (NeMo-RL's
GRPO as the qwen35_397b_grpo reference configures it): leave-one-out advantages (the table of binary-reward
values, groups of 1, 2 and all-equal rewards), the token mask, the overlong / logprob-error / seq-mask-tis
filters just inside and just outside their bounds, the loss and its gradient, and the global token
normaliser: one batch equals two replicas and two micro-batches."""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.qwen35_397b_grpo import grpo

pytestmark = pytest.mark.quick


# ---------------------------------------------------------------- references (loops over the definitions)

def np_advantages(rewards: np.ndarray, group: int, include_self: bool = False) -> np.ndarray:
    out = np.zeros(len(rewards))
    for i, r in enumerate(rewards):
        start = (i // group) * group
        members = list(rewards[start:start + group])
        others = members if include_self else members[:i - start] + members[i - start + 1:]
        if not others:
            continue  # a group of one: baseline = reward, advantage 0
        b = float(np.mean(others))
        s = float(np.std(others, ddof=1)) if len(others) > 1 else 0.0
        out[i] = (r - b) / (s + 1e-6) if s > 0 else r - b
    return out


def np_loss_and_grad(lp, lp_gen, adv, token_mask, sample_mask, n_tok, lo=0.999, hi=1.002):
    """Loss and dL/dlp from the definition, token by token."""
    b, t = lp.shape
    loss, grad = 0.0, np.zeros((b, t))
    for i in range(b):
        valid = [j for j in range(t) if token_mask[i, j] > 0]
        rho = math.exp(sum(lp[i, j] - lp_gen[i, j] for j in valid) / len(valid)) if valid else 1.0
        keep = lo <= rho <= hi
        for j in range(t):
            if token_mask[i, j] * sample_mask[i] == 0 or not keep:
                continue
            w = math.exp(lp[i, j] - lp_gen[i, j])
            loss += -w * adv[i] / n_tok
            grad[i, j] = -w * adv[i] / n_tok
    return loss, grad


def f32(x) -> tf.Tensor:
    return tf.constant(np.asarray(x, np.float32))


# ---------------------------------------------------------------- advantages

# (successes among 16, advantage of a success, of a failure): the reference's values for binary rewards.
TABLE = [(0, 0.0, 0.0), (1, 1.0, -0.258198), (2, 3.614770, -0.378931), (4, 1.932179, -0.582574),
         (8, 1.032794, -1.032794), (12, 0.582574, -1.932179), (14, 0.378931, -3.614770), (15, 0.258198, -1.0),
         (16, 0.0, 0.0)]


def test_advantages_of_binary_rewards_match_the_reference_table():
    rewards = np.concatenate([[1.0] * m + [0.0] * (16 - m) for m, _, _ in TABLE]).astype(np.float32)
    got = grpo.leave_one_out_advantages(f32(rewards)).numpy().reshape(len(TABLE), 16)
    for row, (m, a_win, a_loss) in zip(got, TABLE):
        np.testing.assert_allclose(row[:m], a_win, atol=2e-6)
        np.testing.assert_allclose(row[m:], a_loss, atol=2e-6)
    np.testing.assert_allclose(got.ravel(), np_advantages(rewards, 16), atol=2e-6)


def test_advantages_leave_self_out_of_baseline_and_std():
    """Continuous rewards in several groups; the include-self variant (plain GRPO) must not pass."""
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=64).astype(np.float32)
    got = grpo.leave_one_out_advantages(f32(rewards)).numpy()
    np.testing.assert_allclose(got, np_advantages(rewards, 16), rtol=1e-5, atol=1e-6)
    assert np.abs(got - np_advantages(rewards, 16, include_self=True)).max() > 0.05


@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_advantages_of_small_groups(group):
    rewards = np.array([0.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.75, 0.5, 0.0, 1.0, 0.0, 0.5], np.float32)
    got = grpo.leave_one_out_advantages(f32(rewards), group_size=group).numpy()
    np.testing.assert_allclose(got, np_advantages(rewards, group), rtol=1e-5, atol=1e-6)
    if group == 1:
        assert not got.any()
    if group == 2:  # the one other has no spread: A_i = r_i - r_j
        np.testing.assert_allclose(got, rewards - rewards.reshape(-1, 2)[:, ::-1].ravel(), atol=1e-6)


def test_equal_rewards_give_zero_advantages():
    rewards = np.array([0.3] * 16 + [0.7] * 16 + [1.0] * 16, np.float32)
    assert np.abs(grpo.leave_one_out_advantages(f32(rewards)).numpy()).max() < 1e-6


# ---------------------------------------------------------------- masks and filters

def test_overlong_mask_at_the_length_cap():
    lengths = tf.constant([1, 65534, 65535, 65536])
    np.testing.assert_array_equal(grpo.overlong_sample_mask(lengths).numpy(), [1, 1, 1, 0])
    np.testing.assert_array_equal(grpo.overlong_sample_mask(lengths, max_tokens=65535).numpy(), [1, 1, 0, 0])


def test_token_mask_trains_generated_tokens_only():
    # Row 0: prompt (0) then an assistant turn (1), a tool output (0), another turn (1), then padding.
    generated = np.array([[0, 0, 1, 1, 0, 0, 1, 1, 1, 1],
                          [0, 1, 1, 1, 1, 1, 1, 1, 1, 1]], np.int32)
    lengths = np.array([8, 5], np.int32)
    got = grpo.generated_token_mask(tf.constant(generated), tf.constant(lengths)).numpy()
    want = np.zeros((2, 9))
    for i in range(2):
        for t in range(9):  # column t predicts token t + 1
            want[i, t] = float(generated[i, t + 1] == 1 and t + 1 < lengths[i])
    np.testing.assert_array_equal(got, want)
    assert got[0].tolist() == [0, 1, 1, 0, 0, 1, 1, 0, 0]


def test_logprob_error_filter_at_its_threshold():
    """err = mean of exp|lp_gen - lp_prev| over the row's trained tokens; kept while err <= 2."""
    d = math.log(2.0)
    gaps = np.array([[d - 1e-4] * 3, [d + 1e-4] * 3, [0.0, 2 * d - 1e-3, 0.0],
                     [0.0, 5.0, 0.0], [0.0, 0.0, 0.0]], np.float32)
    token_mask = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 0, 1], [0, 0, 0]], np.float32)
    lp_prev = -np.ones_like(gaps)
    sample_mask = np.array([1, 1, 1, 1, 1], np.float32)
    got = grpo.logprob_error_keep(f32(lp_prev), f32(lp_prev - gaps), f32(token_mask), f32(sample_mask)).numpy()
    # row 2: (1 + (4 - 0.004) + 1) / 3 = 1.9987 <= 2; row 3: the large gap is on an untrained token.
    np.testing.assert_array_equal(got, [1, 0, 1, 1, 1])
    already = grpo.logprob_error_keep(f32(lp_prev), f32(lp_prev - gaps), f32(token_mask),
                                      f32([1, 1, 0, 1, 0])).numpy()
    np.testing.assert_array_equal(already, [1, 0, 0, 1, 0])


@pytest.mark.parametrize("bound", [0.999, 1.002])
def test_seq_mask_tis_at_its_bounds(bound):
    """The geometric-mean ratio exp(mean(lp - lp_gen)) is kept inside [0.999, 1.002], bounds included."""
    inward = 1.0 if bound < 1 else -1.0
    means = [math.log(bound) + inward * 1e-5, math.log(bound) - inward * 1e-5]  # just in, just out
    lp = np.full((2, 4), -2.0, np.float32)
    # Per-token differences that vary around the mean, so only their mean decides.
    spread = np.array([0.01, -0.01, 0.02, -0.02])
    lp_gen = lp - (np.array(means)[:, None] + spread[None, :])
    token_mask = np.ones((2, 4), np.float32)
    got = grpo.seq_tis_keep(f32(lp), f32(lp_gen), f32(token_mask)).numpy()
    np.testing.assert_array_equal(got, [1, 0])


def test_seq_mask_tis_averages_over_the_token_mask_only():
    lp = np.zeros((3, 3), np.float32)
    lp_gen = np.array([[0.0, -9.0, 0.0], [0.0, 0.0, 0.0], [np.nan, 0.0, 0.0]], np.float32)
    token_mask = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1]], np.float32)
    # Row 0's large gap is untrained; row 1 has no trained token (ratio 1); row 2's NaN counts as 0.
    got = grpo.seq_tis_keep(f32(lp), f32(lp_gen), f32(token_mask)).numpy()
    np.testing.assert_array_equal(got, [1, 1, 1])


def test_importance_weights_are_raw_and_finite():
    lp = np.array([[-1.0, -2.0, 0.0, -1.0]], np.float32)
    lp_gen = np.array([[-1.5, -1.0, -np.inf, np.nan]], np.float32)
    got = grpo.token_importance_weights(f32(lp), f32(lp_gen)).numpy()
    np.testing.assert_allclose(got, [[math.exp(0.5), math.exp(-1.0), 0.0, 0.0]], rtol=1e-6)


# ---------------------------------------------------------------- the loss

def random_batch(seed: int, b: int = 6, t: int = 7):
    rng = np.random.default_rng(seed)
    lp = rng.uniform(-3.0, -0.1, (b, t)).astype(np.float32)
    lp_gen = (lp - rng.uniform(-3e-4, 3e-4, (b, t))).astype(np.float32)  # ratios near 1: kept
    lp_gen[1] = lp[1] - 0.01  # geometric mean 1.01: dropped by seq-mask-tis, still counted in N
    token_mask = (rng.uniform(size=(b, t)) < 0.7).astype(np.float32)
    sample_mask = np.ones(b, np.float32)
    sample_mask[2] = 0.0
    adv = rng.normal(size=b).astype(np.float32)
    return lp, lp_gen, adv, token_mask, sample_mask


def loss_and_grad(lp, lp_gen, adv, token_mask, sample_mask, n_tok):
    lp_var = tf.Variable(lp)
    with tf.GradientTape() as tape:
        loss = grpo.grpo_loss(lp_var, f32(lp_gen), f32(adv), f32(token_mask), f32(sample_mask), f32(n_tok))
    return float(loss), tape.gradient(loss, lp_var).numpy()


def test_loss_and_gradient_match_the_definition():
    lp, lp_gen, adv, token_mask, sample_mask = random_batch(1)
    n_tok = float((token_mask * sample_mask[:, None]).sum())
    assert float(grpo.valid_token_count(f32(token_mask), f32(sample_mask))) == n_tok
    loss, grad = loss_and_grad(lp, lp_gen, adv, token_mask, sample_mask, n_tok)
    want_loss, want_grad = np_loss_and_grad(lp.astype(np.float64), lp_gen.astype(np.float64), adv, token_mask,
                                            sample_mask, n_tok)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-8)
    assert not grad[1].any() and not grad[2].any()  # seq-mask-tis drop, sample_mask 0
    compiled = tf.function(grpo.grpo_loss, jit_compile=True)
    xla = compiled(f32(lp), f32(lp_gen), f32(adv), f32(token_mask), f32(sample_mask), f32(n_tok))
    np.testing.assert_allclose(float(xla), want_loss, rtol=1e-5)


class Policy:
    """A one-matrix policy, so that the gradient reaches shared weights through every row's log-probs."""

    def __init__(self, seed: int, d: int = 5, vocab: int = 11, b: int = 8, t: int = 6):
        rng = np.random.default_rng(seed)
        self.w = tf.Variable(rng.normal(scale=0.3, size=(d, vocab)).astype(np.float32))
        self.x = rng.normal(size=(b, t, d)).astype(np.float32)
        self.tokens = rng.integers(0, vocab, (b, t))
        self.token_mask = np.zeros((b, t), np.float32)
        for i in range(b):  # trajectories of different lengths, so a per-shard mean would weigh them wrongly
            self.token_mask[i, :1 + (3 * i) % t] = 1.0
        self.sample_mask = np.ones(b, np.float32)
        self.sample_mask[5] = 0.0
        self.adv = rng.normal(size=b).astype(np.float32)
        self.lp_gen = self.logprobs(np.arange(b)).numpy() - rng.uniform(-2e-4, 2e-4, (b, t)).astype(np.float32)

    def logprobs(self, rows) -> tf.Tensor:
        logits = tf.einsum("btd,dv->btv", self.x[rows], self.w)
        return tf.gather(tf.nn.log_softmax(logits), self.tokens[rows], batch_dims=2)

    def local_count(self, rows) -> tf.Tensor:
        return grpo.valid_token_count(f32(self.token_mask[rows]), f32(self.sample_mask[rows]))

    def loss_and_grad(self, rows, n_tok) -> tuple[float, np.ndarray]:
        with tf.GradientTape() as tape:
            loss = grpo.grpo_loss(self.logprobs(rows), f32(self.lp_gen[rows]), f32(self.adv[rows]),
                                  f32(self.token_mask[rows]), f32(self.sample_mask[rows]), n_tok)
        return float(loss), tape.gradient(loss, self.w).numpy()


def test_global_normaliser_one_batch_equals_two_replicas_and_two_micro_batches():
    policy = Policy(3)
    everything = np.arange(8)
    n_all = policy.local_count(everything)
    one_loss, one_grad = policy.loss_and_grad(everything, n_all)

    # Two replicas: interleaved rows; the global count is the all-reduce SUM of their local counts, and so are
    # the losses and gradients.
    replicas = [everything[0::2], everything[1::2]]
    n_global = tf.add_n([policy.local_count(r) for r in replicas])
    parts = [policy.loss_and_grad(r, n_global) for r in replicas]
    np.testing.assert_allclose(sum(p[0] for p in parts), one_loss, rtol=1e-5)
    np.testing.assert_allclose(sum(p[1] for p in parts), one_grad, rtol=1e-5, atol=1e-7)

    # Two micro-batches of one replica: contiguous halves, each divided by the count fixed before the step.
    halves = [everything[:4], everything[4:]]
    parts = [policy.loss_and_grad(h, n_all) for h in halves]
    np.testing.assert_allclose(sum(p[0] for p in parts), one_loss, rtol=1e-5)
    np.testing.assert_allclose(sum(p[1] for p in parts), one_grad, rtol=1e-5, atol=1e-7)

    # A per-micro-batch mean (the wrong normaliser) does not give the same gradient here.
    wrong = sum(policy.loss_and_grad(h, policy.local_count(h))[1] for h in halves) / 2
    assert np.abs(wrong - one_grad).max() > 1e-3 * np.abs(one_grad).max()
