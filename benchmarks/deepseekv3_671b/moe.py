"""DeepSeek-V3's mixture-of-experts feed-forward: a shared SwiGLU expert plus routed SwiGLU experts behind a
float32 sigmoid router with group-limited top-k selection steered by a non-trained expert bias.

Routing of a token's hidden state h (spec section 1.3; Megatron `group_limited_topk` and
`topk_routing_with_score_function`, transformers `DeepseekV3TopkRouter`):
    s = sigmoid(h W_g)                      float32, one score per expert
    c = s + b                               b: the expert bias, used for the selection only
    group score = sum of the top (k / groups_per_token) c in each of the expert_groups contiguous groups
    keep the groups_per_token best groups, other experts' c := -inf, choose the top-k of c
    w_j = s_j / (sum of the chosen s + 1e-20) * routed_scaling_factor     (the unbiased scores)
    y = sum_j w_j Expert_j(h) + SharedExpert(h)
Every shape is static; the top-k ops pick indices only (on stopped gradients) and the gate weights come from
one-hot products with the scores, so the gradient reaches the router through the sigmoid alone.

The routed experts here compute every token with every expert and weight the outputs by the (mostly zero)
gates: exact and dropless, experts / k times the useful work. It is the reference semantics for small
models and tests; a large model needs an expert-parallel dispatch in its place.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from harness.nn.layers import Block, constant, normal
from harness.runtime.base import Runtime

from benchmarks.deepseekv3_671b.config import ModelConfig
from benchmarks.lm.ffn import SwiGLU, swiglu


@dataclasses.dataclass
class Routing:
    """One MoE layer's routing of a batch, reduced to what the losses and the bias update read:
    `counts` [experts], assignments per expert over the batch (the real, biased, group-limited routing);
    `seq_aux` the sum over rows of each row's sequence-level balance loss (without its coefficient);
    `rows` the rows it sums over."""
    counts: tf.Tensor
    seq_aux: tf.Tensor
    rows: int

    def remat_outputs(self) -> list[tf.Tensor]:
        return [self.counts, self.seq_aux]

    def with_remat_outputs(self, tensors: list[tf.Tensor]) -> Routing:
        return Routing(tensors[0], tensors[1], self.rows)


def group_limited_topk(choice: tf.Tensor, k: int, groups: int, groups_per_token: int) -> tf.Tensor:
    """One-hot [..., experts] of each token's k experts from selection scores `choice` [..., experts] (no
    gradient): each group scored by the sum of its top k / groups_per_token scores, the best
    groups_per_token groups kept, the top k of their experts chosen."""
    *lead, e = choice.shape
    per_group = e // groups
    grouped = tf.reshape(choice, [-1, groups, per_group])
    group_score = tf.reduce_sum(tf.math.top_k(grouped, max(1, k // groups_per_token)).values, -1)   # [t, G]
    best = tf.math.top_k(group_score, groups_per_token).indices
    keep = tf.reduce_sum(tf.one_hot(best, groups, dtype=choice.dtype), -2)                           # [t, G]
    keep = tf.reshape(tf.repeat(keep, per_group, axis=-1), [-1, e])
    masked = tf.where(keep > 0, tf.reshape(choice, [-1, e]), tf.constant(float("-inf"), choice.dtype))
    index = tf.math.top_k(masked, k).indices
    return tf.reshape(tf.reduce_sum(tf.one_hot(index, e, dtype=choice.dtype), -2), lead + [e])


def gate_weights(scores: tf.Tensor, chosen: tf.Tensor, scaling: float) -> tf.Tensor:
    """Gate weights [..., experts]: the chosen experts' scores normalized over them (+1e-20) x scaling, 0
    elsewhere; the gradient flows through `scores`."""
    picked = scores * chosen
    return picked / (tf.reduce_sum(picked, -1, keepdims=True) + 1e-20) * scaling


def seq_aux_loss(scores: tf.Tensor, k: int) -> tf.Tensor:
    """Each row's sequence-level balance loss [b] from sigmoid scores [b, s, experts] (Megatron
    `seq_aux_loss`): E / (k T^2) * sum_e (sum_t p_te) (sum_t m_te), p the scores normalized over all experts,
    m the plain top-k of the unbiased scores (no group limit; a constant)."""
    _, t, e = scores.shape
    p = scores / tf.reduce_sum(scores, -1, keepdims=True)
    m = tf.reduce_sum(tf.one_hot(tf.math.top_k(tf.stop_gradient(scores), k).indices, e, dtype=scores.dtype), -2)
    return e / (k * t * t) * tf.reduce_sum(tf.reduce_sum(p, 1) * tf.reduce_sum(m, 1), -1)


class DeepseekMoE(Block):
    """Routed experts [experts, hidden, expert_hidden] and a shared expert behind a float32 router with a
    float32, non-trainable expert bias (`router/expert_bias`, loaded from e_score_correction_bias)."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        m, e, h = cfg.hidden_size, cfg.num_experts, cfg.expert_hidden
        self.cfg = cfg
        init = lambda name, sd=cfg.init_stddev: normal(sd, f"{path}/{name}", seed)  # noqa: E731
        self.router = self.var("router/kernel", (m, e), (None, None), init("router/kernel"))
        self.expert_bias = self.var("router/expert_bias", (e,), (None,), constant(0.0), trainable=False)
        self.w_gate = self.var("experts/gate/kernel", (e, m, h), ("experts", None, "ff"), init("experts/gate"))
        self.w_up = self.var("experts/up/kernel", (e, m, h), ("experts", None, "ff"), init("experts/up"))
        self.w_down = self.var("experts/down/kernel", (e, h, m), ("experts", "ff", None),
                               init("experts/down", cfg.output_stddev()))
        self.shared = None
        if cfg.shared_experts:
            self.shared = SwiGLU(runtime, f"{path}/shared", seed, m, cfg.shared_experts * h, cfg.init_stddev,
                                 cfg.output_stddev())

    def route(self, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(gate weights [b, s, experts], chosen one-hot [b, s, experts], sigmoid scores) of x [b, s, hidden]."""
        c = self.cfg
        scores = tf.sigmoid(tf.einsum("bsm,me->bse", tf.cast(x, tf.float32), tf.cast(self.router, tf.float32)))
        choice = tf.stop_gradient(scores) + tf.cast(self.expert_bias, tf.float32)
        chosen = tf.stop_gradient(group_limited_topk(choice, c.experts_per_token, c.expert_groups,
                                                     c.groups_per_token))
        return gate_weights(scores, chosen, c.routed_scaling_factor), chosen, scores

    def __call__(self, x: tf.Tensor) -> tuple[tf.Tensor, Routing]:
        c, dt = self.cfg, self.dtype
        gates, chosen, scores = self.route(x)
        hidden = swiglu(x, tf.cast(self.w_gate, dt), tf.cast(self.w_up, dt), tf.cast(self.w_down, dt),
                        "bsm,emh->bseh", "bseh,ehm->bsem")
        y = tf.einsum("bsem,bse->bsm", hidden, tf.cast(gates, dt))
        if self.shared is not None:
            y = y + self.shared(x)
        routing = Routing(tf.reduce_sum(chosen, [0, 1]), tf.reduce_sum(seq_aux_loss(scores, c.experts_per_token)),
                          x.shape[0])
        return y, routing
