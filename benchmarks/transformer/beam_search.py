"""Beam search with static shapes (one compiled program for the whole eval), as the MLPerf reference
decodes: beam 4, length penalty ((5 + length) / 6)^alpha on finished hypotheses, EOS ends a hypothesis.

The reference (and Google's v0.7 code) keeps `beam` alive and `beam` finished hypotheses per sentence,
grows 2 * beam candidates a step, and stops once no alive hypothesis can beat the worst finished one.
Here each sentence has its own length limit (its input length + extra) and freezes once done, so its
result does not depend on which sentences share its decode batch; the reference's limit is the padded
batch's length, which makes its output depend on the batching.
"""
from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

EOS_ID = 1
_INF = 1.0e7  # finite, so -inf arithmetic never produces NaN


def length_penalty(length: tf.Tensor, alpha: float) -> tf.Tensor:
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


StepFn = Callable[[tf.Tensor, tf.Tensor, Any, tf.Tensor], tuple[tf.Tensor, Any]]


def beam_search(step_fn: StepFn, cache: Any, batch: int, beam: int, max_steps: int, max_lengths: tf.Tensor,
                alpha: float, take: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], eos_id: int = EOS_ID
                ) -> tuple[tf.Tensor, tf.Tensor]:
    """Decodes `batch` sentences; returns the best hypothesis ids (batch, max_steps), EOS included and
    zeros after it, and its score.

    step_fn(ids (batch*beam,), i, cache, sequences (batch*beam, max_steps)) -> (logits (batch*beam, vocab),
    cache): the next-token logits at position i given the tokens so far; tensors in `cache` have
    batch*beam rows (beam-major within a sentence) and are reordered as beams are. `max_lengths` (batch,)
    caps each sentence's hypothesis length. `take(x, index)`: x (batch, beams, ...) -> rows `index`
    (batch, k) of each sentence's beams (`Runtime.take_along_axis1`).
    """
    k, steps = beam, max_steps
    max_lengths = tf.minimum(tf.cast(max_lengths, tf.int32), steps)
    first = tf.concat([[0.0], tf.fill([k - 1], -_INF)], 0)
    state = {
        "alive_seq": tf.zeros([batch, k, steps], tf.int32),
        "alive_logp": tf.tile(tf.expand_dims(first, 0), [batch, 1]),
        "fin_seq": tf.zeros([batch, k, steps], tf.int32),
        "fin_score": tf.fill([batch, k], -_INF),
        "fin_flag": tf.zeros([batch, k], tf.bool),
        "done": tf.zeros([batch], tf.bool),
    }
    positions = tf.range(steps)
    lp_max = length_penalty(max_lengths, alpha)

    def reorder(x: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
        return take(x, index)

    def body(i: tf.Tensor, state: dict[str, tf.Tensor], cache: Any) -> tuple:
        alive_seq = state["alive_seq"]
        prev = tf.gather(alive_seq, tf.maximum(i - 1, 0), axis=2) * tf.cast(i > 0, tf.int32)
        logits, new_cache = step_fn(tf.reshape(prev, [-1]), i, cache, tf.reshape(alive_seq, [batch * k, steps]))
        logp = tf.nn.log_softmax(tf.cast(logits, tf.float32))
        vocab = tf.shape(logp)[-1]
        cand = tf.expand_dims(state["alive_logp"], 2) + tf.reshape(logp, [batch, k, -1])
        top_logp, top_idx = tf.math.top_k(tf.reshape(cand, [batch, -1]), 2 * k)
        src_beam, token = top_idx // vocab, top_idx % vocab
        top_seq = reorder(alive_seq, src_beam)
        top_seq = tf.where(tf.reshape(tf.equal(positions, i), [1, 1, steps]), tf.expand_dims(token, 2), top_seq)
        is_eos = tf.equal(token, eos_id)

        # Alive: the best k candidates that did not end.
        alive_logp, a_idx = tf.math.top_k(tf.where(is_eos, -_INF, top_logp), k)
        alive_seq = reorder(top_seq, a_idx)
        order = reorder(src_beam, a_idx)

        # Finished: the best k of the old finished and the candidates that ended here, length-penalized.
        ended = tf.where(is_eos, top_logp / length_penalty(i + 1, alpha), -_INF)
        all_score = tf.concat([state["fin_score"], ended], 1)
        fin_score, f_idx = tf.math.top_k(all_score, k)
        fin_seq = reorder(tf.concat([state["fin_seq"], top_seq], 1), f_idx)
        fin_flag = reorder(tf.concat([state["fin_flag"], is_eos], 1), f_idx)

        # A sentence is done at its length limit, or when no alive hypothesis, even at the longest
        # length's penalty, can beat its worst finished one.
        worst_fin = tf.where(tf.reduce_any(fin_flag, 1),
                             tf.reduce_min(tf.where(fin_flag, fin_score, _INF), 1), -_INF)
        best_alive = alive_logp[:, 0] / lp_max
        done = state["done"] | (i + 1 >= max_lengths) | (worst_fin > best_alive)

        # Sentences already done keep their state (so a sentence's result ignores its batch-mates).
        keep = state["done"]
        new = {"alive_seq": alive_seq, "alive_logp": alive_logp, "fin_seq": fin_seq, "fin_score": fin_score,
               "fin_flag": fin_flag}
        new = {name: tf.where(tf.reshape(keep, [batch] + [1] * (len(v.shape) - 1)), state[name], v)
               for name, v in new.items()}
        new["done"] = done
        new_cache = tf.nest.map_structure(
            lambda c: tf.reshape(reorder(tf.reshape(c, [batch, k] + c.shape[1:].as_list()), order), c.shape),
            new_cache)
        return i + 1, new, new_cache

    def cond(i: tf.Tensor, state: dict[str, tf.Tensor], cache: Any) -> tf.Tensor:
        return tf.logical_and(i < steps, tf.logical_not(tf.reduce_all(state["done"])))

    _, state, _ = tf.while_loop(cond, body, (tf.constant(0), state, cache), maximum_iterations=steps)
    # A sentence with no finished hypothesis falls back to its best alive one (as the reference does).
    any_fin = tf.reduce_any(state["fin_flag"], 1)
    seq = tf.where(tf.expand_dims(any_fin, 1), state["fin_seq"][:, 0, :], state["alive_seq"][:, 0, :])
    score = tf.where(any_fin, state["fin_score"][:, 0], state["alive_logp"][:, 0])
    return seq, score
