"""The generation engine: batched, KV-cached sampling of the Qwen3.5 model (`Qwen35.step`) under XLA.

A batch of `slots` prompts is left-padded to `prompt_length` columns (the padding masked: see `Qwen35.step`);
one compiled prefill writes the attention caches and the DeltaNet states and samples each slot's first token;
one compiled decode step feeds the last token and samples the next, called once per token with the same
static shapes (the cache holds prompt_length + max_new_tokens columns). A slot stops on a stop token (kept as
its last generated token) or at max_new_tokens; the loop ends when every slot has stopped.

Sampling as the reference's generator does it (vLLM, vllm-project/vllm v1 sampler: `Sampler.sample`,
`apply_temperature`, `TopKTopPSampler.forward_native`, `apply_top_k_top_p`): logits in float32 divided by the
temperature, then top-p: sort ascending, drop the tokens whose cumulative probability is <= 1 - p, the largest
always kept; the token drawn from the softmax of what remains. Temperature < 1e-5 is greedy (argmax of the raw
logits). The defaults are the training rollouts' (temperature 1, top-p 1); `VALIDATION` is the evaluation's
(0.1, 0.95); mlcommons/training@aa344c7 llm_post_training, NeMo-RL@3fca04c9 recipe
grpo_qwen35_397b_swe_openhands_async.yaml `policy.generation`, `grpo.validation_generation`.

The randomness is stateless: the draw of slot s's n-th generated token uses the seed pair `row_seeds(seed,
key_s, n)`, key_s the slot's key (default: its index), so a run is reproducible and a slot's tokens do not depend
on the batch around it (given the same logits). Under XLA a stateless seed's components count only through
their low 32 bits (measured on TF 2 CPU: seeds (0, 2^32) and (0, 0) draw the same numbers), so the pair is
(a 64-bit hash of (seed, key), n), never key and n packed into one component.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from benchmarks.qwen35_397b_grpo.model import Qwen35

GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a temperature under it samples greedily


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature (< 1e-5: greedy) and top-p (1: no truncation); no top-k (the reference sets none)."""
    temperature: float = 1.0
    top_p: float = 1.0


TRAINING = SamplingParams(1.0, 1.0)     # policy.generation
VALIDATION = SamplingParams(0.1, 0.95)  # grpo.validation_generation


def top_p_keep(logits: tf.Tensor, top_p: tf.Tensor) -> tf.Tensor:
    """Which tokens top-p keeps, bool [b, vocab] of float32 logits [b, vocab] (already temperature-scaled):
    in ascending order of probability, a token is dropped when the cumulative probability up to and including
    it is <= 1 - top_p; the most probable token always stays (vLLM's apply_top_k_top_p)."""
    order = tf.argsort(logits, axis=-1, direction="ASCENDING", stable=True)
    sorted_logits = tf.gather(logits, order, batch_dims=1)
    cumulative = tf.cumsum(tf.nn.softmax(sorted_logits, -1), axis=-1)
    vocab = logits.shape[-1]
    drop = tf.logical_and(cumulative <= 1.0 - tf.cast(top_p, tf.float32), tf.range(vocab)[None, :] < vocab - 1)
    # back to vocabulary order: the inverse permutation of `order`
    return tf.logical_not(tf.gather(drop, tf.argsort(order, axis=-1), batch_dims=1))


def processed_logits(logits: tf.Tensor, temperature: tf.Tensor, top_p: tf.Tensor, branchless: bool = False
                     ) -> tf.Tensor:
    """The logits the draw samples from: float32 logits / temperature (1 when greedy), tokens top-p drops at
    -inf. Its log-softmax is vLLM's `processed_logprobs` (the generator's lp_gen in GRPO). `branchless`: the
    same numbers by a select of whole shape instead of a tf.cond (for a DTensor mesh)."""
    temperature = tf.cast(temperature, tf.float32)
    scaled = tf.cast(logits, tf.float32) / tf.where(temperature < GREEDY_BELOW, 1.0, temperature)
    if branchless:
        return tf.where(tf.logical_and(top_p < 1.0, tf.ones_like(scaled, tf.bool)),
                        tf.where(top_p_keep(scaled, top_p), scaled, -np.inf), scaled)
    return tf.cond(top_p < 1.0, lambda: tf.where(top_p_keep(scaled, top_p), scaled, -np.inf), lambda: scaled)


def per_row(fn: Any, rows: tf.Tensor, dtype: tf.DType, unroll: bool = False) -> tf.Tensor:
    """fn over the rows of `rows`, stacked: a map_fn, or with `unroll` (a static row count) a Python loop of
    the same ops, which a DTensor mesh lays out (it has none for map_fn's TensorList ops)."""
    if unroll:
        return tf.stack([fn(rows[i]) for i in range(rows.shape[0])])
    return tf.map_fn(fn, rows, fn_output_signature=dtype)


def sample(logits: tf.Tensor, temperature: tf.Tensor, top_p: tf.Tensor, seeds: tf.Tensor, unroll: bool = False
           ) -> tuple[tf.Tensor, tf.Tensor]:
    """(tokens [b] int32, their log-probabilities [b] float32) of float32 logits [b, vocab], seeds [b, 2] int64
    (one stateless seed per row).

    The log-probability is that of the distribution drawn from, as vLLM reports `processed_logprobs` (the
    reference's logprobs mode; NeMo-RL's lp_gen): log_softmax(processed_logits) at the token, i.e. after
    temperature and top-p; at temperature 1 and top-p 1 (training) the raw log-softmax. Greedy
    (temperature < 1e-5): the argmax and the raw log-softmax at it (vLLM's all-greedy path). The draw is
    Gumbel-max, argmax(processed + G), G = -log(-log U), U ~ uniform(seed of the row): exactly a draw from
    softmax(processed) (vLLM's exponential race, probs / Exp(1), is the same distribution). `unroll` (for a
    DTensor mesh): see `per_row`, and `processed_logits`'s `branchless` (the same numbers)."""
    processed = processed_logits(logits, temperature, top_p, branchless=unroll)
    greedy = temperature < GREEDY_BELOW
    if unroll:  # a scalar condition broadcast by tf.where crashes a DTensor mesh's CPU run (measured)
        greedy = tf.logical_and(greedy, tf.ones_like(processed, tf.bool))
    vocab = logits.shape[-1]

    def gumbel(seed: tf.Tensor) -> tf.Tensor:
        u = tf.random.stateless_uniform([vocab], seed, minval=np.finfo(np.float32).tiny, maxval=1.0)
        return -tf.math.log(-tf.math.log(u))

    noise = per_row(gumbel, seeds, tf.float32, unroll)
    drawn = tf.argmax(processed + tf.where(greedy, 0.0, noise), -1, output_type=tf.int32)
    lp = tf.nn.log_softmax(tf.where(greedy, tf.cast(logits, tf.float32), processed), -1)
    return drawn, tf.gather(lp, drawn, batch_dims=1)


def row_seeds(seed: tf.Tensor, keys: tf.Tensor, n: tf.Tensor | int, unroll: bool = False) -> tf.Tensor:
    """Stateless seed pairs [b, 2] int64 for draw n of rows keyed keys [b] under run seed `seed`: the key, then
    n, folded into (seed, 0) (tf.random.experimental.stateless_fold_in: (hash of the seed pair, data)). Distinct
    keys and distinct n give distinct streams, under XLA too (which reads each component's low 32 bits: keep
    seed, key and n below 2^32). `unroll`: see `per_row`."""
    base = tf.stack([tf.cast(seed, tf.int64), tf.constant(0, tf.int64)])
    n = tf.cast(n, tf.int64)
    fold = tf.random.experimental.stateless_fold_in
    return per_row(lambda k: fold(fold(base, k), n), tf.cast(keys, tf.int64), tf.int64, unroll)


@dataclasses.dataclass
class Rollouts:
    """What one `Generator.generate` returns, in the trainer's layout (rows start at column 0, right-padded
    with `pad_id`): tokens [b, S] int32 (prompt, then the generated tokens); generated [b, S] float32 (1 on
    generated tokens: the flags `grpo.generated_token_mask` takes); logprobs [b, S] float32 (the generator's
    log-probability of the token at that column, 0 elsewhere: lp_gen next-token aligned is logprobs[:, 1:]);
    lengths [b] (prompt + generated); stopped [b] (ended on a stop token, not the length cap).
    S = prompt_length + max_new_tokens."""
    tokens: np.ndarray
    generated: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    stopped: np.ndarray


class Generator:
    """Batched generation with the model's current weights (they are read at every call: no copy to refit).

    slots: rows per call; prompt_length: the longest prompt (shorter ones left-padded); max_new_tokens: the
    length cap per slot; stop_ids: tokens that end a slot. One XLA compile (jit_compile; else one trace) of the
    prefill and one of the decode step for these shapes, reused by every call, whatever the sampling settings
    (they are inputs).

    On a DTensor mesh runtime (the model's variables DVariables) the inputs are placed on the mesh as the
    training step's are: rows split over the batch mesh dimension (prompts, pads), the seeds' keys, the last
    logits the draw reads and so the drawn tokens replicated, scalars replicated; the caches take the weights'
    splits (`Qwen35.empty_cache`), and the drawn tokens and log-probabilities come back to the host whole.
    XLA as the runtime's own steps take it (a CPU mesh builds no XLA program: see harness/runtime/mesh.py
    `replica_function`)."""

    def __init__(self, model: Qwen35, slots: int, prompt_length: int, max_new_tokens: int,
                 stop_ids: tuple[int, ...] = (), pad_id: int = 0, jit_compile: bool = True) -> None:
        if slots < 1 or prompt_length < 1 or max_new_tokens < 1:
            raise ValueError(f"slots, prompt_length, max_new_tokens must be >= 1, got {slots}, {prompt_length}, "
                             f"{max_new_tokens}")
        self.model, self.slots, self.prompt_length, self.max_new_tokens = model, slots, prompt_length, max_new_tokens
        self.stop_ids = tuple(int(t) for t in stop_ids)
        self.pad_id = pad_id
        self.length = prompt_length + max_new_tokens
        self.mesh = getattr(model.runtime, "mesh", None)  # a DTensor mesh, or None (one device, replicas)
        if self.mesh is not None:
            jit_compile = jit_compile and model.runtime.device_type == "GPU"
        self._prefill = tf.function(self._prefill_fn, jit_compile=jit_compile, autograph=False)
        self._decode = tf.function(self._decode_fn, jit_compile=jit_compile, autograph=False)

    def _put(self, value: Any, dtype: tf.DType, dims: tuple[str | None, ...] = ()) -> tf.Tensor:
        """A host value as the compiled functions' input: on a mesh, a DTensor laid out by named `dims`."""
        t = tf.constant(value, dtype)
        if self.mesh is None:
            return t
        runtime = self.model.runtime
        return runtime.to_mesh(t, runtime.layout_for(dims or (None,) * t.shape.rank))

    def _host(self, t: tf.Tensor) -> np.ndarray:
        """A compiled function's per-row output, whole, on the host."""
        if self.mesh is None:
            return t.numpy()
        runtime = self.model.runtime
        return runtime.to_host(runtime.gather(t))

    def _whole(self, logits: tf.Tensor) -> tf.Tensor:
        """The last logits [slots, vocab] replicated (on a mesh, DTensor's CPU expansion of the draw's selects
        over rows split over `data` fails: measured); one device: unchanged."""
        return self.model.runtime.place(logits, (None, None))

    def _seeds(self, seed: tf.Tensor, keys: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
        return row_seeds(seed, keys, n, unroll=self.mesh is not None)

    def _prefill_fn(self, tokens, pads, seed, keys, temperature, top_p):
        cache = self.model.empty_cache(self.slots, self.length)
        logits, cache = self.model.step(tokens, cache, 0, pads)
        drawn, lp = sample(self._whole(logits[:, -1]), temperature, top_p, self._seeds(seed, keys, 0),
                           self.mesh is not None)
        return drawn, lp, cache

    def _decode_fn(self, token, cache, column, pads, seed, keys, n, temperature, top_p):
        logits, cache = self.model.step(token[:, None], cache, column, pads)
        drawn, lp = sample(self._whole(logits[:, 0]), temperature, top_p, self._seeds(seed, keys, n),
                           self.mesh is not None)
        return drawn, lp, cache

    def generate(self, prompts: list[list[int]], sampling: SamplingParams = TRAINING, seed: int = 0,
                 keys: list[int] | None = None, stop_ids: tuple[int, ...] | None = None) -> Rollouts:
        """Samples up to max_new_tokens after each prompt (at most `slots`; missing slots run one-token prompts
        whose rows are dropped from the result) with the seed `seed` and per-slot keys (default 0..); stop_ids
        (default: the generator's) end a slot."""
        stops = self.stop_ids if stop_ids is None else tuple(int(t) for t in stop_ids)
        n_rows = len(prompts)
        if not 1 <= n_rows <= self.slots:
            raise ValueError(f"between 1 and {self.slots} prompts per call, got {n_rows}")
        if any(not 1 <= len(p) <= self.prompt_length for p in prompts):
            raise ValueError(f"prompt lengths must be in [1, {self.prompt_length}], got {[len(p) for p in prompts]}")
        if keys is not None and len(keys) != n_rows:
            raise ValueError(f"one key per prompt: {len(keys)} keys for {n_rows} prompts")
        rows = list(prompts) + [[self.pad_id]] * (self.slots - n_rows)
        keys = list(range(self.slots)) if keys is None else list(keys) + list(range(n_rows, self.slots))
        pads = np.array([self.prompt_length - len(p) for p in rows], np.int32)
        block = np.full([self.slots, self.prompt_length], self.pad_id, np.int32)
        for r, p in enumerate(rows):
            block[r, pads[r]:] = p
        args = dict(seed=self._put(seed, tf.int64), keys=self._put(keys, tf.int64),
                    temperature=self._put(sampling.temperature, tf.float32),
                    top_p=self._put(sampling.top_p, tf.float32))
        pads_t = self._put(pads, tf.int32, ("batch",))
        with contextlib.nullcontext() if self.mesh is None else dtensor.default_mesh(self.mesh):
            token, lp, cache = self._prefill(self._put(block, tf.int32, ("batch", None)), pads_t, **args)
            out_tokens, out_lps = [self._host(token)], [self._host(lp)]
            done = np.isin(out_tokens[0], stops)
            for n in range(1, self.max_new_tokens):
                if done[:n_rows].all():
                    break
                token, lp, cache = self._decode(token, cache, self._put(self.prompt_length + n - 1, tf.int32),
                                                pads_t, n=self._put(n, tf.int64), **args)
                out_tokens.append(self._host(token))
                out_lps.append(self._host(lp))
                done |= np.isin(out_tokens[-1], stops)
        return self._rollouts(prompts, np.stack(out_tokens, 1), np.stack(out_lps, 1), stops)

    def _rollouts(self, prompts: list[list[int]], new: np.ndarray, lps: np.ndarray, stops: tuple[int, ...]
                  ) -> Rollouts:
        """Each slot's prompt and generated tokens, cut after its first stop token, as `Rollouts`."""
        b, width = len(prompts), self.length
        tokens = np.full([b, width], self.pad_id, np.int32)
        generated, logprobs = np.zeros([b, width], np.float32), np.zeros([b, width], np.float32)
        lengths, stopped = np.zeros([b], np.int32), np.zeros([b], bool)
        for r, prompt in enumerate(prompts):
            hits = np.flatnonzero(np.isin(new[r], stops))
            count = int(hits[0]) + 1 if hits.size else new.shape[1]
            stopped[r] = bool(hits.size)
            p = len(prompt)
            tokens[r, :p], tokens[r, p:p + count] = prompt, new[r, :count]
            generated[r, p:p + count], logprobs[r, p:p + count] = 1.0, lps[r, :count]
            lengths[r] = p + count
        return Rollouts(tokens, generated, logprobs, lengths, stopped)
