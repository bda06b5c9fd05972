"""benchmarks/qwen35_397b_grpo/generate.py: the XLA generation engine on a tiny Qwen3.5 MoE (random weights; one
Gated DeltaNet and one gated attention layer; one compile of prefill and decode shared by every test): greedy
cached generation of a left-padded batch equals greedy decoding by full recomputation of each prompt alone; the
reported log-probabilities are those of the full forward after temperature and top-p; top-p keeps exactly
vLLM's set, and seeded draws follow the truncated, renormalised distribution; a stop token ends its slot while
the others go on."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.qwen35_397b_grpo import generate as gen
from benchmarks.qwen35_397b_grpo.config import ModelConfig
from benchmarks.qwen35_397b_grpo.model import Qwen35
from harness.runtime import distribute

PROMPTS = [[5, 17, 3, 250, 9, 77, 41], [12, 8], [300, 1, 2, 3, 4]]   # different lengths: left padding matters
SLOTS, PROMPT_LENGTH, NEW = 4, 8, 7
TOLERANCE = 1e-5  # of max |logit|: float32 rounding between the cached and the full forward


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig(vocab_size=512, hidden_size=64, num_layers=2, full_attention_interval=2, num_heads=4,
                      num_kv_heads=2, head_dim=32, rotary_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                      linear_key_head_dim=16, linear_value_head_dim=32, num_experts=8, experts_per_token=2,
                      expert_hidden=32, shared_expert_hidden=48, moe_dispatch="dense", init_stddev=0.2)
    runtime = distribute.make_default("float32", False)
    with runtime.scope():
        return Qwen35(runtime, 0, cfg, PROMPT_LENGTH + NEW)


@pytest.fixture(scope="module")
def generator(model):
    return gen.Generator(model, SLOTS, PROMPT_LENGTH, NEW)


def full_logits(model: Qwen35, row: list[int]) -> np.ndarray:
    """float32 logits [len(row), vocab] of one unpadded row, no cache."""
    hidden, _ = model(tf.constant([row], tf.int32))
    return model.logits(hidden).numpy()[0]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def top_p_keep_numpy(logits: np.ndarray, top_p: float) -> np.ndarray:
    """vLLM's top-p rule on one row, in float64: ascending order, drop where the cumulative probability is
    <= 1 - p, the largest always kept."""
    order = np.argsort(logits, kind="stable")
    probs = np.exp(log_softmax(logits[order]))
    drop = np.cumsum(probs) <= 1.0 - top_p
    drop[-1] = False
    keep = np.ones_like(drop)
    keep[order] = ~drop
    return keep


def test_cached_greedy_generation_equals_full_recomputation(model, generator):
    """Greedy (temperature 0) from the left-padded batch under XLA: every slot's tokens are the argmax of a
    full forward over its own prompt and tokens so far (no cache, no padding; one causal forward over the
    finished row gives every step's), and each reported log-prob is that forward's log-softmax at the token.
    Each step's top-2 margin is checked to exceed the tolerance, so the comparison cannot hinge on a near tie."""
    out = generator.generate(PROMPTS, gen.SamplingParams(temperature=0.0))
    assert out.tokens.shape == (len(PROMPTS), PROMPT_LENGTH + NEW)
    columns = np.arange(PROMPT_LENGTH + NEW)
    for r, prompt in enumerate(PROMPTS):
        p = len(prompt)
        assert out.lengths[r] == p + NEW and not out.stopped[r]
        np.testing.assert_array_equal(out.tokens[r, :p], prompt)
        np.testing.assert_array_equal(out.generated[r], (columns >= p) & (columns < p + NEW))
        logits = full_logits(model, list(out.tokens[r, :p + NEW]))
        for col in range(p, p + NEW):
            step = logits[col - 1]
            top2 = np.sort(step)[-2:]
            assert top2[1] - top2[0] > 10 * TOLERANCE * np.abs(step).max(), (r, col)
            assert out.tokens[r, col] == np.argmax(step), (r, col)
            np.testing.assert_allclose(out.logprobs[r, col], log_softmax(step)[out.tokens[r, col]], atol=1e-5)


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampled_logprobs_are_the_processed_distribution(model, generator, temperature, top_p):
    """Sampled rollouts: every generated token lies in top-p's set of the full forward's logits / T, and its
    reported log-prob is the log-softmax over that set (vLLM's processed_logprobs); at T 1, p 1 that is the raw
    log-softmax. The same seed gives the same rollouts; another seed, others."""
    sampling = gen.SamplingParams(temperature, top_p)
    out = generator.generate(PROMPTS, sampling, seed=3)
    for r in range(len(PROMPTS)):
        length = out.lengths[r]
        logits = full_logits(model, list(out.tokens[r, :length]))
        for col in np.flatnonzero(out.generated[r]):
            scaled = logits[col - 1] / temperature
            keep = top_p_keep_numpy(scaled, top_p)
            token = out.tokens[r, col]
            assert keep[token], (r, col)
            want = log_softmax(np.where(keep, scaled, -np.inf))[token]
            np.testing.assert_allclose(out.logprobs[r, col], want, atol=1e-5, err_msg=f"{r}, {col}")
    again = generator.generate(PROMPTS, sampling, seed=3)
    np.testing.assert_array_equal(again.tokens, out.tokens)
    other = generator.generate(PROMPTS, sampling, seed=4)
    assert not np.array_equal(other.tokens, out.tokens)


def test_top_p_keeps_vllms_set():
    """top_p_keep equals the float64 definition on random rows at several p, and its boundary: p exactly the
    top token's probability keeps that token alone; p = 1 keeps everything."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, [16, 50]).astype(np.float32)
    for p in (0.1, 0.5, 0.9, 0.95):
        got = gen.top_p_keep(tf.constant(logits), tf.constant(p)).numpy()
        want = np.stack([top_p_keep_numpy(row, p) for row in logits])
        np.testing.assert_array_equal(got, want)
    probs = np.array([[0.5, 0.25, 0.125, 0.125]], np.float32)   # exact in binary
    keep = gen.top_p_keep(tf.constant(np.log(probs)), tf.constant(0.5)).numpy()
    np.testing.assert_array_equal(keep, [[True, False, False, False]])
    keep = gen.top_p_keep(tf.constant(np.log(probs)), tf.constant(0.75)).numpy()
    np.testing.assert_array_equal(keep, [[True, True, False, False]])
    assert gen.top_p_keep(tf.constant(np.log(probs)), tf.constant(1.0)).numpy().all()


def test_seeded_draws_follow_the_truncated_distribution():
    """20,000 seeded draws (one row each, under XLA) from a vocabulary of 6 at T 0.5, p 0.8: the frequencies
    are those of softmax(logits / T) restricted to top-p's set and renormalised, within 6 standard errors (a
    fixed seed: the counts are the same on every run); dropped tokens are never drawn; the reported log-prob
    is the renormalised one."""
    logits = np.array([2.0, 1.5, 0.4, 0.3, -1.0, 0.9], np.float32)
    temperature, top_p, n = 0.5, 0.8, 20000
    keep = top_p_keep_numpy(logits / temperature, top_p)
    assert 1 < keep.sum() < len(logits)
    want = np.exp(log_softmax(np.where(keep, logits / temperature, -np.inf)))
    seeds = np.stack([np.full(n, 11), np.arange(n)], 1).astype(np.int64)
    draw = tf.function(gen.sample, jit_compile=True)
    tokens, lps = (t.numpy() for t in draw(tf.constant(np.tile(logits, [n, 1])), tf.constant(temperature),
                                            tf.constant(top_p), tf.constant(seeds)))
    freq = np.bincount(tokens, minlength=len(logits)) / n
    assert (freq[~keep] == 0).all()
    assert np.all(np.abs(freq - want) <= 6 * np.sqrt(want * (1 - want) / n) + 1e-12), (freq, want)
    np.testing.assert_allclose(lps, np.log(want[tokens]), atol=1e-5)


def test_a_stop_token_ends_its_slot_while_the_others_continue(generator):
    """Greedy with a stop token the first slot generates at its third step (and the others never): the first
    slot ends there, the stop token kept and trained, nothing after it; the others are unchanged."""
    free = generator.generate(PROMPTS, gen.SamplingParams(temperature=0.0))
    p0 = len(PROMPTS[0])
    stop = int(free.tokens[0, p0 + 2])
    if stop in free.tokens[0, p0:p0 + 2] or any(stop in free.tokens[r, len(PROMPTS[r]):free.lengths[r]]
                                                 for r in (1, 2)):
        pytest.fail(f"pick another stop token: {stop} also appears elsewhere")
    out = generator.generate(PROMPTS, gen.SamplingParams(temperature=0.0), stop_ids=(stop,))
    assert out.stopped.tolist() == [True, False, False]
    assert out.lengths[0] == p0 + 3 and out.tokens[0, p0 + 2] == stop
    np.testing.assert_array_equal(out.generated[0], (np.arange(PROMPT_LENGTH + NEW) >= p0)
                                  & (np.arange(PROMPT_LENGTH + NEW) < p0 + 3))
    assert (out.tokens[0, p0 + 3:] == 0).all() and (out.logprobs[0, p0 + 3:] == 0).all()
    for name in ("tokens", "generated", "logprobs"):
        np.testing.assert_array_equal(getattr(out, name)[1:], getattr(free, name)[1:])


def test_one_trace_of_each_step_reads_the_current_weights(model, generator):
    """Weights changed in place (a refit from the trainer) are what the next call generates with, and no
    call of this file (greedy, sampled, other stop tokens, other weights) traced either step a second time."""
    before = generator.generate(PROMPTS, gen.SamplingParams(temperature=0.0))
    variable = model.embeddings
    saved = variable.numpy()
    try:
        variable.assign(saved[::-1].copy())
        after = generator.generate(PROMPTS, gen.SamplingParams(temperature=0.0))
        logits = full_logits(model, list(after.tokens[0, :len(PROMPTS[0]) + 1]))
        assert after.tokens[0, len(PROMPTS[0])] == np.argmax(logits[len(PROMPTS[0]) - 1])
    finally:
        variable.assign(saved)
    assert not np.array_equal(after.tokens, before.tokens)
    assert generator._prefill.experimental_get_tracing_count() == 1
    assert generator._decode.experimental_get_tracing_count() == 1
