"""DeepSeek-V3's mixture-of-experts feed-forward: a shared SwiGLU expert plus routed SwiGLU experts behind a
float32 sigmoid router with group-limited top-k selection steered by a non-trained expert bias.

Routing of a token's hidden state h (NVIDIA/Megatron-LM@b0cc270:megatron/core/transformer/moe/moe_utils.py
`group_limited_topk` and `topk_routing_with_score_function`, transformers `DeepseekV3TopkRouter`):
    s = sigmoid(h W_g)                      float32, one score per expert
    c = s + b                               b: the expert bias, used for the selection only
    group score = sum of the top n c in each of the expert_groups contiguous groups (n: model.group_score_top(),
                  Megatron's k / groups_per_token, or transformers' 2 for a Hugging Face checkpoint)
    keep the groups_per_token best groups, other experts' c := -inf, choose the top-k of c
    w_j = s_j / (sum of the chosen s + 1e-20) * routed_scaling_factor     (the unbiased scores)
    y = sum_j w_j Expert_j(h) + SharedExpert(h)
Every shape is static; the top-k ops pick indices only (on stopped gradients) and the gate weights come from
one-hot products with the scores, so the gradient reaches the router through the sigmoid alone.

Two executions of the routed experts (`model.moe_dispatch`), the same routing and, dropless, the same result:
- alltoall (the default): each row's assignments are gathered into a static buffer [b, experts, capacity, m]
  (benchmarks/lm/moe_dispatch.py, shared with gpt_oss_20b; the routing group is the row), relaid from
  batch-split to experts-split, which on a mesh with the batch and the experts on one axis is one all-to-all;
  each device runs its own experts' slots with its own experts' weights (never gathered), and the reverse
  all-to-all brings the outputs home to be weighted by the gates. Slots fill in priority order (every token's
  first choice before any second, earlier tokens first). Dropless by default (model.capacity_factor 0, as the
  reference's alltoall dispatcher without a capacity factor): each expert's capacity is the whole row, the
  only static bound, so the compiled routed-expert work is experts x seq slots per row, experts / k times the
  useful k x seq (4x at the smoke's 8 experts top-2, 32x at the reference's 256 top-8; the dense execution's
  ratio too), and the buffer holds experts x seq rows of the hidden size each way. A capacity factor cf
  gives each expert ceil(cf x seq x k / experts) slots of a row (about cf x the useful work) and drops the
  assignments past it: a dropped assignment contributes nothing (the token keeps its other experts, the
  shared expert and the residual), and each row's dropped count is in the routing (eval reports the share).
  Measured on the smoke's router after 48 steps of training (16 eval rows of 256 tokens x 3 MoE layers, MTP's
  included; re-slotted as scripts/moe_drops.py does): cf 1 would drop 5.35% of the assignments, 1.25 0.26%,
  1.5 and above none (the busiest expert of a row took 1.42x the mean load).
- dense: every expert computes every token and the outputs are weighted by the (mostly zero) gates: exact,
  never drops, and on a mesh DTensor gathers the experts' weights to each device. The small reference of the
  tests.
The routing counts (the bias update's) and the sequence aux loss read the routing, before any drop.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from harness.nn.layers import Block, constant, normal
from harness.runtime.base import Runtime

from benchmarks.deepseekv3_671b.config import ModelConfig
from benchmarks.lm.ffn import SwiGLU, swiglu
from benchmarks.lm.moe_capacity import expert_capacity
from benchmarks.lm.moe_dispatch import alltoall_experts, slot_positions


@dataclasses.dataclass
class Routing:
    """One MoE layer's routing of a batch, reduced to what the losses, the bias update and eval read:
    `counts` [experts], assignments per expert over the batch (the real, biased, group-limited routing,
    before any capacity drop); `seq_aux` the sum over rows of each row's sequence-level balance loss (without
    its coefficient); `rows` the rows it sums over; `dropped` [b] each row's assignments dropped for capacity."""
    counts: tf.Tensor
    seq_aux: tf.Tensor
    rows: int
    dropped: tf.Tensor

    def remat_outputs(self) -> list[tf.Tensor]:
        return [self.counts, self.seq_aux, self.dropped]

    def with_remat_outputs(self, tensors: list[tf.Tensor]) -> Routing:
        return Routing(tensors[0], tensors[1], self.rows, tensors[2])


def group_limited_index(choice: tf.Tensor, k: int, groups: int, groups_per_token: int,
                        group_top: int | None = None) -> tf.Tensor:
    """Each token's k experts [..., k] (int32, best first) from selection scores `choice` [..., experts] (no
    gradient): each group scored by the sum of its top `group_top` scores (default k / groups_per_token,
    Megatron's `group_limited_topk`; transformers' `DeepseekV3TopkRouter` sums the top 2), the best
    groups_per_token groups kept, the top k of their experts chosen."""
    *lead, e = choice.shape
    per_group = e // groups
    grouped = tf.reshape(choice, [-1, groups, per_group])
    top = group_top or max(1, k // groups_per_token)
    group_score = tf.reduce_sum(tf.math.top_k(grouped, top).values, -1)                              # [t, G]
    best = tf.math.top_k(group_score, groups_per_token).indices
    keep = tf.reduce_sum(tf.one_hot(best, groups, dtype=choice.dtype), -2)                           # [t, G]
    keep = tf.reshape(tf.repeat(keep, per_group, axis=-1), [-1, e])
    masked = tf.where(keep > 0, tf.reshape(choice, [-1, e]), tf.constant(float("-inf"), choice.dtype))
    return tf.reshape(tf.math.top_k(masked, k).indices, lead + [k])


def group_limited_topk(choice: tf.Tensor, k: int, groups: int, groups_per_token: int,
                       group_top: int | None = None) -> tf.Tensor:
    """One-hot [..., experts] of `group_limited_index`'s k experts."""
    index = group_limited_index(choice, k, groups, groups_per_token, group_top)
    return tf.reduce_sum(tf.one_hot(index, choice.shape[-1], dtype=choice.dtype), -2)


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
        """(gate weights [b, s, experts], the chosen experts [b, s, k] int32 best first, sigmoid scores
        [b, s, experts]) of x [b, s, hidden]."""
        c = self.cfg
        scores = tf.sigmoid(tf.einsum("bsm,me->bse", tf.cast(x, tf.float32), tf.cast(self.router, tf.float32)))
        choice = tf.stop_gradient(scores) + tf.cast(self.expert_bias, tf.float32)
        index = tf.stop_gradient(group_limited_index(choice, c.experts_per_token, c.expert_groups,
                                                     c.groups_per_token, c.group_score_top()))
        chosen = tf.reduce_sum(tf.one_hot(index, c.num_experts, dtype=tf.float32), -2)
        return gate_weights(scores, chosen, c.routed_scaling_factor), index, scores

    def __call__(self, x: tf.Tensor) -> tuple[tf.Tensor, Routing]:
        c = self.cfg
        gates, index, scores = self.route(x)
        choice = tf.one_hot(index, c.num_experts, dtype=tf.float32)                     # [b, s, k, experts]
        if c.moe_dispatch == "alltoall":
            y, dropped = self._alltoall(x, gates, index, choice)
        else:
            y, dropped = self._dense(x, gates), tf.zeros([x.shape[0]])
        if self.shared is not None:
            y = y + self.shared(x)
        routing = Routing(tf.reduce_sum(choice, [0, 1, 2]),
                          tf.reduce_sum(seq_aux_loss(scores, c.experts_per_token)), x.shape[0], dropped)
        return y, routing

    def _dense(self, x: tf.Tensor, gates: tf.Tensor) -> tf.Tensor:
        dt = self.dtype
        hidden = swiglu(x, tf.cast(self.w_gate, dt), tf.cast(self.w_up, dt), tf.cast(self.w_down, dt),
                        "bsm,emh->bseh", "bseh,ehm->bsem")
        return tf.einsum("bsem,bse->bsm", hidden, tf.cast(gates, dt))

    def _alltoall(self, x: tf.Tensor, gates: tf.Tensor, index: tf.Tensor,
                  choice: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The routed experts' output [b, s, m] and each row's dropped assignments [b]; one routing group per
        row (index, kept, position [b, 1, s, k])."""
        c, dt = self.cfg, self.dtype
        b, seq, _ = x.shape
        k, e = c.experts_per_token, c.num_experts
        capacity = expert_capacity(seq, e, k, c.capacity_factor)
        # reshapes, not [:, None] / [:, 0] slices: DTensor (TF 2.21) segfaults on those of batch-split tensors
        position = slot_positions(tf.reshape(choice, [b, 1, seq, k, e]))
        kept = tf.cast(position < capacity, tf.float32)

        def experts(xe: tf.Tensor) -> tf.Tensor:  # [b, experts, capacity, m], split over `experts`
            return swiglu(xe, tf.cast(self.w_gate, dt), tf.cast(self.w_up, dt), tf.cast(self.w_down, dt),
                          "becm,emh->bech", "bech,ehm->becm")

        ya = alltoall_experts(self.runtime, x, tf.reshape(index, [b, 1, seq, k]), kept, position, e, capacity,
                              experts)
        weights = tf.einsum("bske,bse->bsk", choice, gates) * tf.reshape(kept, [b, seq, k])
        return tf.einsum("bskm,bsk->bsm", ya, tf.cast(weights, dt)), tf.reduce_sum(1.0 - kept, [1, 2, 3])
