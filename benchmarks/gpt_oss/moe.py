"""GPT-OSS's mixture-of-experts feed-forward: token-choice top-k routing and SwiGLU experts.

Named dimensions `experts` and `ff` (an expert's hidden units) let a mesh runtime split them.
"""
from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from harness.nn.layers import Block, normal
from harness.runtime.base import Runtime

from benchmarks.gpt_oss.config import ModelConfig


# ------------------------------------------------------------------------------ mixture of experts

@dataclasses.dataclass
class Routing:
    """One MoE layer's routing of a batch: dispatch/combine [b, groups, s, experts, capacity] and the
    sums the auxiliary losses and health metrics need."""
    dispatch: tf.Tensor
    combine: tf.Tensor
    balance_sum: tf.Tensor   # sum over groups of E * sum_i f_i P_i (Switch/GShard load-balancing loss)
    z_sum: tf.Tensor         # sum over tokens of logsumexp(router logits)^2 (ST-MoE z-loss)
    dropped: tf.Tensor       # [b]: each row's assignments dropped for capacity
    groups: int
    tokens: int


def expert_capacity(group: int, experts: int, k: int, capacity_factor: float) -> int:
    """Slots per expert per group: the whole group when dropless (no expert can receive a token twice, so
    nothing overflows), else ceil(cf * group * k / experts) (Switch eq. 3 for top-k), at most the group."""
    if capacity_factor <= 0:
        return group
    return max(1, min(group, math.ceil(capacity_factor * group * k / experts)))


def route(logits: tf.Tensor, k: int, capacity: int) -> Routing:
    """Token-choice top-k routing of logits [b, groups, s, experts] (float32).

    The k experts are the top-k logits; their weights are a softmax over those k logits (gpt-oss). The
    top-k only picks indices (no gradient through TopKV2, which DTensor cannot partition); weights come
    from a one-hot product with the logits. Slots are assigned in priority order, every token's first
    choice before any second choice, earlier tokens first (causal-safe); assignments past `capacity` are
    dropped and the token keeps its residual only.
    """
    b, ng, s, e = logits.shape
    index = tf.math.top_k(tf.stop_gradient(logits), k).indices                  # [b, g, s, k]
    choice = tf.one_hot(index, e, dtype=tf.float32)                               # [b, g, s, k, e]
    gates = tf.nn.softmax(tf.reduce_sum(choice * tf.expand_dims(logits, 3), -1), -1)  # [b, g, s, k]
    priority = tf.reshape(tf.transpose(choice, [0, 1, 3, 2, 4]), [b, ng, k * s, e])
    position = tf.reduce_sum(tf.cumsum(priority, axis=2, exclusive=True) * priority, -1)
    position = tf.transpose(tf.reshape(position, [b, ng, k, s]), [0, 1, 3, 2])    # [b, g, s, k]
    kept = tf.cast(position < capacity, tf.float32)
    slot = tf.one_hot(tf.cast(position, tf.int32), capacity, dtype=tf.float32) * tf.expand_dims(kept, -1)
    dispatch = tf.einsum("bgske,bgskc->bgsec", choice, slot)
    combine = tf.einsum("bgske,bgskc,bgsk->bgsec", choice, slot, gates)
    fraction = tf.reduce_mean(choice, [2, 3])                                     # f_i: sums to 1
    # Softmax and logsumexp spelled out: the gradients of tf.nn.softmax and tf.reduce_logsumexp sum with
    # keep_dims, which DTensor's reduce expander rejects on these batch-split logits.
    # Partial reductions are einsums with ones (their gradients are einsums too, not Tile).
    top = tf.stop_gradient(tf.reduce_max(logits, -1))
    exp = tf.exp(logits - tf.expand_dims(top, -1))
    total = tf.einsum("bgse,e->bgs", exp, tf.ones([e]))
    prob = tf.einsum("bgse,s->bge", exp / tf.expand_dims(total, -1), tf.fill([s], 1.0 / s))  # P_i
    lse = top + tf.math.log(total)
    return Routing(dispatch, combine, balance_sum=float(e) * tf.reduce_sum(fraction * prob),
                   z_sum=tf.reduce_sum(tf.square(lse)), dropped=tf.reduce_sum(1.0 - kept, [1, 2, 3]),
                   groups=b * ng, tokens=b * ng * s)


class MoE(Block):
    """Experts [experts, hidden, ff] SwiGLU feed-forwards behind a float32 router.

    Tokens [b, s, m] are cut into groups; each group's tokens go to their experts' slots by a one-hot
    dispatch einsum, giving [experts, b, groups, capacity, m] with the batch split; `place` then splits
    the experts instead (on a mesh with experts and batch on one axis: an all-to-all), each device runs its
    experts (with `ff` split too: tensor parallelism inside an expert), and the reverse trip brings the
    outputs home to be combined with the gate weights.
    """

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        m, e, h = cfg.hidden_size, cfg.num_experts, cfg.expert_hidden
        self.cfg = cfg
        init = lambda name: normal(cfg.init_stddev, f"{path}/{name}", seed)  # noqa: E731
        self.router = self.var("router/kernel", (m, e), (None, None), init("router/kernel"))
        self.w_gate = self.var("experts/gate/kernel", (e, m, h), ("experts", None, "ff"), init("experts/gate"))
        self.w_up = self.var("experts/up/kernel", (e, m, h), ("experts", None, "ff"), init("experts/up"))
        self.w_down = self.var("experts/down/kernel", (e, h, m), ("experts", "ff", None), init("experts/down"))

    def __call__(self, x: tf.Tensor) -> tuple[tf.Tensor, Routing]:
        c, dt = self.cfg, self.dtype
        b, seq, m = x.shape
        s = min(c.moe_group_size, seq)
        xg = tf.reshape(x, [b, seq // s, s, m])
        logits = tf.einsum("bgsm,me->bgse", tf.cast(xg, tf.float32), self.router)
        r = route(logits, c.experts_per_token, expert_capacity(s, c.num_experts, c.experts_per_token,
                                                                c.capacity_factor))
        xe = tf.einsum("bgsec,bgsm->ebgcm", tf.cast(r.dispatch, dt), xg)
        xe = self.runtime.place(xe, ("experts", None, None, None, None))
        gate = tf.einsum("ebgcm,emh->ebgch", xe, tf.cast(self.w_gate, dt))
        up = tf.einsum("ebgcm,emh->ebgch", xe, tf.cast(self.w_up, dt))
        ye = tf.einsum("ebgch,ehm->ebgcm", tf.nn.silu(gate) * up, tf.cast(self.w_down, dt))
        ye = self.runtime.place(ye, (None, "batch", None, None, None))
        y = tf.einsum("bgsec,ebgcm->bgsm", tf.cast(r.combine, dt), ye)
        return tf.reshape(y, [b, seq, m]), r
