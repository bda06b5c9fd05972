"""GPT-OSS's mixture-of-experts feed-forward: token-choice top-k routing and SwiGLU experts.

Named dimensions `experts` and `ff` (an expert's hidden units) let a mesh runtime split them.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from harness.nn.layers import Block, constant, normal
from harness.runtime.base import Runtime

from benchmarks.gpt_oss_20b.config import ModelConfig
from benchmarks.lm.ffn import SWIGLU, Glu, swiglu, swiglu_hidden
from benchmarks.lm.moe_capacity import expert_capacity
from benchmarks.lm.moe_dispatch import alltoall_experts, combine_rows, dispatch_rows, slot_positions


# ------------------------------------------------------------------------------ mixture of experts

@dataclasses.dataclass
class Routing:
    """One MoE layer's routing of a batch: each token's k experts, their gate weights and whether each
    assignment was kept, the dense dispatch/combine [b, groups, s, experts, capacity] when the dense
    dispatch asked for them, and the sums the auxiliary losses and health metrics need (a layer recomputed in
    the backward pass, `model.remat`, returns only those: index, gates and kept are None)."""
    index: tf.Tensor | None  # [b, groups, s, k] int32: the chosen experts, best first
    gates: tf.Tensor | None  # [b, groups, s, k] float32: softmax over the k chosen logits
    kept: tf.Tensor | None   # [b, groups, s, k] float32: 1 = the assignment has a slot, 0 = dropped
    balance_sum: tf.Tensor   # sum over groups of E * sum_i f_i P_i (Switch/GShard load-balancing loss)
    z_sum: tf.Tensor         # sum over tokens of logsumexp(router logits)^2 (ST-MoE z-loss)
    dropped: tf.Tensor       # [b]: each row's assignments dropped for capacity
    groups: int
    tokens: int
    dispatch: tf.Tensor | None = None   # [b, g, s, e, c] one-hot slots (dense dispatch only)
    combine: tf.Tensor | None = None    # the same weighted by the gates
    position: tf.Tensor | None = None   # [b, groups, s, k] int32: each assignment's slot in its expert's
                                        # capacity (dense and alltoall dispatches, or when capacity can drop)

    def remat_outputs(self) -> list[tf.Tensor]:
        """What a layer recomputed in the backward pass returns (benchmarks/lm/decoder.py's remat)."""
        return [self.balance_sum, self.z_sum, self.dropped]

    def with_remat_outputs(self, tensors: list[tf.Tensor]) -> Routing:
        """The routing as seen outside a recomputed layer: the sums of `remat_outputs`, no per-token tensors."""
        return Routing(None, None, None, *tensors, groups=self.groups, tokens=self.tokens)


def route(logits: tf.Tensor, k: int, capacity: int, dense: bool = True, positions: bool = False) -> Routing:
    """Token-choice top-k routing of logits [b, groups, s, experts] (float32).

    The k experts are the top-k logits; their weights are a softmax over those k logits (gpt-oss). The
    top-k only picks indices (no gradient through TopKV2, which DTensor cannot partition); weights come
    from a one-hot product with the logits. Slots are assigned in priority order, every token's first
    choice before any second choice, earlier tokens first (causal-safe); assignments past `capacity` are
    dropped and the token keeps its residual only. `dense`: also build the one-hot dispatch/combine
    tensors (O(s x experts x capacity) per group); without it, positions are only computed when the
    capacity can drop anything (capacity < s) or `positions` asks for them.
    """
    b, ng, s, e = logits.shape
    index = tf.math.top_k(tf.stop_gradient(logits), k).indices                  # [b, g, s, k]
    choice = tf.one_hot(index, e, dtype=tf.float32)                               # [b, g, s, k, e]
    gates = tf.nn.softmax(tf.reduce_sum(choice * tf.expand_dims(logits, 3), -1), -1)  # [b, g, s, k]
    position = None
    if dense or capacity < s or positions:
        position = slot_positions(choice)                                          # [b, g, s, k]
        kept = tf.cast(position < capacity, tf.float32)
    else:  # each expert can take the whole group: nothing is dropped
        kept = tf.ones([b, ng, s, k], tf.float32)
    dispatch = combine = None
    if dense:
        slot = tf.one_hot(position, capacity, dtype=tf.float32) * tf.expand_dims(kept, -1)
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
    return Routing(index, gates, kept, balance_sum=float(e) * tf.reduce_sum(fraction * prob),
                   z_sum=tf.reduce_sum(tf.square(lse)), dropped=tf.reduce_sum(1.0 - kept, [1, 2, 3]),
                   groups=b * ng, tokens=b * ng * s, dispatch=dispatch, combine=combine, position=position)


@dataclasses.dataclass
class Blocks:
    """Where each row's expert assignments go in the sorted dispatch: per row, the assignments sorted by
    expert (assignment order within an expert), each expert's run padded to a multiple of `block` rows.
    Shapes are static: `blocks` = floor((a + experts x (block - 1)) / block) covers any split of the a
    assignments among the experts."""
    block_expert: tf.Tensor   # [r, blocks] int32: the expert each block of rows belongs to
    row_source: tf.Tensor     # [r, blocks * block] int32: the assignment a row computes (a: none, padding)
    destination: tf.Tensor    # [r, a] int32: the row holding each assignment's output (rows: dropped)
    blocks: int
    block: int


def sort_blocks(expert: tf.Tensor, experts: int, block: int) -> Blocks:
    """Block layout of assignments `expert` [r, a] (int32 expert ids; `experts` marks a dropped one).

    Sorting is one TopKV2 over a unique key (expert-major, then assignment order); counts come from a
    one-hot sum and offsets from cumulative sums over the experts, so nothing is O(a^2) or data-shaped.
    """
    r, a = expert.shape
    blocks = (a + experts * (block - 1)) // block
    rows = blocks * block
    key = expert * a + tf.range(a, dtype=tf.int32)[None, :]
    order = tf.math.top_k(-key, a, sorted=True).indices                           # sorted -> assignment
    inverse = tf.math.top_k(-order, a, sorted=True).indices                       # assignment -> sorted
    counts = tf.reduce_sum(tf.one_hot(expert, experts, dtype=tf.int32), 1)        # [r, E] (dropped: none)
    padded = (counts + block - 1) // block * block
    padded_end = tf.cumsum(padded, 1)
    padded_start = padded_end - padded
    sorted_start = tf.cumsum(counts, 1, exclusive=True)
    # Block j belongs to the first expert whose padded run ends past j * block (trailing blocks past every
    # run: the last expert, all rows padding).
    starts = tf.range(blocks, dtype=tf.int32) * block
    block_expert = tf.minimum(tf.reduce_sum(
        tf.cast(padded_end[:, None, :] <= starts[None, :, None], tf.int32), -1), experts - 1)
    row_expert = tf.repeat(block_expert, block, axis=1)                            # [r, rows]
    within = tf.range(rows, dtype=tf.int32)[None, :] - tf.gather(padded_start, row_expert, batch_dims=1)
    valid = within < tf.gather(counts, row_expert, batch_dims=1)
    sorted_at = tf.minimum(tf.gather(sorted_start, row_expert, batch_dims=1) + within, a - 1)
    row_source = tf.where(valid, tf.gather(order, sorted_at, batch_dims=1), a)
    own = tf.minimum(expert, experts - 1)
    destination = (tf.gather(padded_start, own, batch_dims=1) + inverse
                   - tf.gather(sorted_start, own, batch_dims=1))
    destination = tf.where(expert < experts, destination, rows)
    return Blocks(block_expert, row_source, destination, blocks, block)


def after(index: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
    """index [b, ...] (int, >= 0), unchanged, but computed from t [b, ...] too (max(index, -isnan(max t))).

    A gather of expert weights by `index` in the backward pass is otherwise the same op as the forward
    pass's, and XLA's common-subexpression elimination merges them, keeping every copy alive from the
    forward to the backward pass. The reduction keeps each batch row on its own device (no collective)."""
    row = tf.reduce_max(t, axis=list(range(1, t.shape.rank)))
    floor = -tf.cast(tf.math.is_nan(row), index.dtype)                 # 0 (or -1 on NaN): never above index
    return tf.maximum(index, tf.reshape(floor, [-1] + [1] * (index.shape.rank - 1)))


def after_all(index: tf.Tensor, ts: list[tf.Tensor | None]) -> tf.Tensor:
    """index (int, >= 0), unchanged, but computed from every tensor of `ts` (None: skipped) as `after`
    does, over all of each tensor's elements (tensors without a batch dimension)."""
    for t in ts:
        if t is not None:
            index = tf.maximum(index, -tf.cast(tf.math.is_nan(tf.reduce_max(t)), index.dtype))
    return index


def expert_blocks(xs: tf.Tensor, block_expert: tf.Tensor, w_gate: tf.Tensor, w_up: tf.Tensor,
                  w_down: tf.Tensor, chunk: int = 0, act: Glu = SWIGLU,
                  biases: tuple[tf.Tensor, tf.Tensor, tf.Tensor] | None = None) -> tf.Tensor:
    """SwiGLU (`act`'s variant) of each block of rows xs [b, blocks, block, m] with its own expert's weights
    (w_gate, w_up [experts, m, h], w_down [experts, h, m]; block_expert [b, blocks]) and, when given,
    `biases` (gate, up [experts, h], down [experts, m]) -> [b, blocks, block, m].

    Without a grouped matmul each block multiplies its own gathered copy of its expert's weights, 3 x m x h
    values per block. `chunk` > 0 computes `chunk` blocks at a time, each chunk's gathers after the previous
    chunk's output (`after`), so one chunk's copies are live at once; the backward pass gathers them again
    per chunk (the gate and up activations are kept, so no expert matmul is recomputed) and sums each
    expert's weight gradient over the chunks in float32 (a one-hot product over the blocks). 0: one chunk.
    Padding rows (zero inputs) get the biases as outputs, which nothing reads: their gradient is zero."""
    b, nb, block, m = xs.shape
    experts = w_gate.shape[0]
    chunk = chunk or nb
    sizes = [min(chunk, nb - j) for j in range(0, nb, chunk)]
    index = tf.split(block_expert, sizes, 1)
    weights = (w_gate, w_up, w_down) + (tuple(biases) if biases is not None else ())

    def plus_bias(y: tf.Tensor, n: int, i: tf.Tensor, ws) -> tf.Tensor:
        """y [b, j, block, width] + bias n (0 gate, 1 up, 2 down) of each block's expert (y without biases)."""
        return y + tf.expand_dims(tf.gather(ws[3 + n], i), 2) if len(ws) > 3 else y

    @tf.custom_gradient
    def run(xs, *ws):
        gates, ups, outs = [], [], []
        for x, i in zip(tf.split(xs, sizes, 1), index):
            if outs:
                i = after(i, outs[-1])
            gate = plus_bias(tf.einsum("bjcm,bjmh->bjch", x, tf.gather(ws[0], i)), 0, i, ws)
            up = plus_bias(tf.einsum("bjcm,bjmh->bjch", x, tf.gather(ws[1], i)), 1, i, ws)
            outs.append(plus_bias(tf.einsum("bjch,bjhm->bjcm", swiglu_hidden(gate, up, act), tf.gather(ws[2], i)),
                                  2, i, ws))
            gates.append(gate)
            ups.append(up)

        def grad(dys):
            dxs, dw, last = [], [None] * len(ws), dys
            for x, i, gate, up, dy in zip(tf.split(xs, sizes, 1), index, gates, ups, tf.split(dys, sizes, 1)):
                i = after(i, last)
                with tf.GradientTape() as tape:
                    tape.watch([gate, up])
                    hidden = swiglu_hidden(gate, up, act)
                dhidden = tf.einsum("bjcm,bjhm->bjch", dy, tf.gather(ws[2], i))
                dgate, dup = tape.gradient(hidden, [gate, up], output_gradients=dhidden)
                dxs.append(tf.einsum("bjch,bjmh->bjcm", dgate, tf.gather(ws[0], i))
                           + tf.einsum("bjch,bjmh->bjcm", dup, tf.gather(ws[1], i)))
                last = dxs[-1]
                # Each block's weight gradient summed into its expert's by a one-hot contraction, not a
                # scatter (unsorted_segment_sum): a scatter writes into a zero-filled [experts, m, h] buffer
                # that depends on nothing, and XLA's scheduler may create it at the start of the step, so
                # every chunk's of every layer and micro-batch would be live at once (at the reference 18
                # chunks x 3 x 24 layers x 2 micro-batches x 1.06 GB of float32). The product's output is
                # made when its operands are, one chunk at a time; its extra work (experts / block of the
                # weight gradient's multiply-adds) reads no more bytes than the scatter writes.
                # The running sums (`after`) too: else XLA fuses the sums of a layer's chunks into one add
                # of every chunk's part, all of them live at once.
                onehot = tf.one_hot(after_all(i, dw), experts, dtype=x.dtype)     # [b, j, experts]
                parts = [("bje,bjmh->emh", tf.einsum("bjcm,bjch->bjmh", x, dgate)),
                         ("bje,bjmh->emh", tf.einsum("bjcm,bjch->bjmh", x, dup)),
                         ("bje,bjmh->emh", tf.einsum("bjch,bjcm->bjhm", hidden, dy))]
                if len(ws) > 3:  # a bias's gradient: its projection's output gradient summed over the rows
                    parts += [("bje,bjh->eh", tf.reduce_sum(g, 2)) for g in (dgate, dup, dy)]
                for n, (equation, block_grad) in enumerate(parts):
                    part = tf.cast(tf.einsum(equation, onehot, block_grad), tf.float32)
                    dw[n] = part if dw[n] is None else dw[n] + part
            return (tf.concat(dxs, 1),) + tuple(tf.cast(g, w.dtype) for g, w in zip(dw, ws))

        return tf.concat(outs, 1), grad

    return run(xs, *weights)


class MoE(Block):
    """Experts [experts, hidden, ff] SwiGLU feed-forwards (model.swiglu_*: gpt-oss's clamped variant) behind a
    float32 router, with router and expert biases when model.router_bias / model.expert_bias are on.

    Three dispatches (`model.moe_dispatch`), the same routing and the same result:
    - sorted: each batch row's token x top-k assignments are sorted by expert into a static buffer of
      blocks (`sort_blocks`), each block multiplied by its expert's weights (gathered per block), and the
      outputs gathered back and combined with the gates. The expert work is at most the assignments plus
      experts x block rows, whatever the routing. On a mesh the experts' weights are gathered whole over
      the axis that splits them (FSDP-style, `ff` stays split) and the tokens never leave their device.
    - dense: tokens are cut into groups; each group's tokens go to their experts' slots by a one-hot
      dispatch einsum, giving [experts, b, groups, capacity, m] with the batch split; `place` then splits
      the experts instead (on a mesh with experts and batch on one axis: an all-to-all), each device runs
      its experts (with `ff` split too), and the reverse trip brings the outputs home to be combined. In
      dropless mode the capacity is the whole group, so each expert computes every slot (experts / k times
      the useful work) and the einsums cost as much again.
    - alltoall: the dense dispatch's route without its one-hot einsums. Each row's kept assignments are
      gathered into a static buffer [b, experts, groups x capacity, m] (benchmarks/lm/moe_dispatch.py: one sort, gathers
      both ways, O(assignments + slots) per row); relaid from batch-split to experts-split it crosses the
      mesh by one all-to-all, each device multiplies its own experts' slots by its own experts' weights
      (never gathered; `ff` may be split too), and the reverse all-to-all brings the outputs home to be
      combined with the gates. Capacity is per expert per routing group (a group lives on one device);
      dropless (capacity_factor 0) makes it the whole group, the worst case, so the buffer and the expert
      work are experts / k times the assignments; a capacity factor bounds them and drops the overflow.
    """

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        m, e, h = cfg.hidden_size, cfg.num_experts, cfg.expert_hidden
        self.cfg, self.act = cfg, cfg.glu()
        init = lambda name: normal(cfg.init_stddev, f"{path}/{name}", seed)  # noqa: E731
        self.router = self.var("router/kernel", (m, e), (None, None), init("router/kernel"))
        self.w_gate = self.var("experts/gate/kernel", (e, m, h), ("experts", None, "ff"), init("experts/gate"))
        self.w_up = self.var("experts/up/kernel", (e, m, h), ("experts", None, "ff"), init("experts/up"))
        self.w_down = self.var("experts/down/kernel", (e, h, m), ("experts", "ff", None),
                               normal(cfg.output_stddev(), f"{path}/experts/down", seed))   # Megatron's linear_fc2
        # model.router_bias / model.expert_bias: zero init; each bias split as its kernel's output dimension
        self.router_bias = self.var("router/bias", (e,), (None,), constant(0.0)) if cfg.router_bias else None
        self.b_gate = self.b_up = self.b_down = None
        if cfg.expert_bias:
            self.b_gate = self.var("experts/gate/bias", (e, h), ("experts", "ff"), constant(0.0))
            self.b_up = self.var("experts/up/bias", (e, h), ("experts", "ff"), constant(0.0))
            self.b_down = self.var("experts/down/bias", (e, m), ("experts", None), constant(0.0))

    def __call__(self, x: tf.Tensor) -> tuple[tf.Tensor, Routing]:
        c = self.cfg
        b, seq, m = x.shape
        s = min(c.moe_group_size, seq)
        xg = tf.reshape(x, [b, seq // s, s, m])
        logits = tf.einsum("bgsm,me->bgse", tf.cast(xg, tf.float32), self.router)
        if self.router_bias is not None:  # before the top-k: the bias moves the choice too
            logits += tf.cast(self.router_bias, tf.float32)
        dense, alltoall = c.moe_dispatch == "dense", c.moe_dispatch == "alltoall"
        capacity = expert_capacity(s, c.num_experts, c.experts_per_token, c.capacity_factor)
        r = route(logits, c.experts_per_token, capacity, dense=dense, positions=alltoall)
        if dense:
            y = self._dense(xg, r)
        elif alltoall:
            y = self._alltoall(x, r, capacity)
        else:
            y = self._sorted(x, r)
        return tf.reshape(y, [b, seq, m]), r

    def _dense(self, xg: tf.Tensor, r: Routing) -> tf.Tensor:
        dt = self.dtype
        xe = tf.einsum("bgsec,bgsm->ebgcm", tf.cast(r.dispatch, dt), xg)
        xe = self.runtime.place(xe, ("experts", None, None, None, None))
        biases = None
        if self.b_gate is not None:  # [e, 1, 1, 1, width]: each expert's own, on its slots
            biases = tuple(tf.reshape(tf.cast(v, dt), [v.shape[0], 1, 1, 1, v.shape[1]])
                           for v in (self.b_gate, self.b_up, self.b_down))
        ye = swiglu(xe, tf.cast(self.w_gate, dt), tf.cast(self.w_up, dt), tf.cast(self.w_down, dt),
                    "ebgcm,emh->ebgch", "ebgch,ehm->ebgcm", self.act, biases)
        ye = self.runtime.place(ye, (None, "batch", None, None, None))
        return tf.einsum("bgsec,ebgcm->bgsm", tf.cast(r.combine, dt), ye)

    def _sorted(self, x: tf.Tensor, r: Routing) -> tf.Tensor:
        c, dt = self.cfg, self.dtype
        b, seq, m = x.shape
        k, e = c.experts_per_token, c.num_experts
        a = seq * k                                                      # assignments per row: token-major
        expert = tf.where(tf.reshape(r.kept, [b, a]) > 0, tf.reshape(r.index, [b, a]), e)
        lay = sort_blocks(expert, e, c.moe_block_size)
        xs = tf.reshape(dispatch_rows(x, lay, k), [b, lay.blocks, lay.block, m])
        # The experts' weights, whole over the axis that splits the experts (on a mesh: an all-gather;
        # `ff` stays split), then one copy per block, `moe_chunk_blocks` blocks at a time.
        w_gate, w_up, w_down = (self.runtime.place(tf.cast(w, dt), (None,) + dims) for w, dims in (
            (self.w_gate, (None, "ff")), (self.w_up, (None, "ff")), (self.w_down, ("ff", None))))
        biases = None
        if self.b_gate is not None:
            biases = tuple(self.runtime.place(tf.cast(v, dt), (None, dim)) for v, dim in (
                (self.b_gate, "ff"), (self.b_up, "ff"), (self.b_down, None)))
        ys = expert_blocks(xs, lay.block_expert, w_gate, w_up, w_down, c.moe_chunk_blocks, self.act, biases)
        ya = tf.reshape(combine_rows(tf.reshape(ys, [b, lay.blocks * lay.block, m]), lay), [b, seq, k, m])
        weights = tf.reshape(r.gates * r.kept, [b, seq, k])
        return tf.einsum("bskm,bsk->bsm", ya, tf.cast(weights, dt))

    def _alltoall(self, x: tf.Tensor, r: Routing, capacity: int) -> tf.Tensor:
        c, dt = self.cfg, self.dtype
        b, seq, _ = x.shape
        biases = None
        if self.b_gate is not None:  # [1, e, 1, width]: each expert's own, on its slots
            biases = tuple(tf.reshape(tf.cast(v, dt), [1, v.shape[0], 1, v.shape[1]])
                           for v in (self.b_gate, self.b_up, self.b_down))

        def experts(xe: tf.Tensor) -> tf.Tensor:  # [b, experts, slots, m], split over `experts`
            return swiglu(xe, tf.cast(self.w_gate, dt), tf.cast(self.w_up, dt), tf.cast(self.w_down, dt),
                          "becm,emh->bech", "bech,ehm->becm", self.act, biases)

        ya = alltoall_experts(self.runtime, x, r.index, r.kept, r.position, c.num_experts, capacity, experts)
        weights = tf.reshape(r.gates * r.kept, [b, seq, c.experts_per_token])
        return tf.einsum("bskm,bsk->bsm", ya, tf.cast(weights, dt))
