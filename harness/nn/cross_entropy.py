"""Next-token cross-entropy fused with the LM head, in blocks of positions: no [tokens, vocab] tensor beyond
one block's.

At Llama 3.1's 128,256-id vocabulary, logits of 8 rows of 1,024 tokens are 4.2 GB in float32, and autodiff of
`logsumexp(logits) - logits[target]` keeps them, a softmax and a one-hot of the same size for the backward
pass. Here the head's matmul runs per block of positions (a slice of the sequence, every row), each block is
reduced to one loss per token at once, and a custom gradient recomputes each block's logits in the backward
pass (d loss / d logits = softmax - one-hot of the target): the step holds one block's logits at a time (at
most `BLOCK_ELEMENTS` per device, a few copies while the block is live), plus per-token numbers. Logits of
at most `KEEP_ELEMENTS` per device in all are one block whose gradient the forward pass keeps (no
recomputation: small vocabularies and batches).

On a mesh that splits `vocab` n ways the head is viewed as [hidden, n, vocab / n] with its second axis on the
vocabulary's devices, as `harness.nn.layers.vocab_parallel_lookup` views the embedding table: each device
computes the logits of its own shard only; the maximum, the sum of exponentials and the target's logit are
reduced over the vocabulary's mesh dimension (per-token numbers); the target's one-hot is the block's and
the shard's size; the head's gradient stays a shard.

Blocks run one after another: each block's input is made to depend on the previous block's result by data
(x + 0 x one of its numbers), because neither XLA nor the order in which TensorFlow's executor runs ready ops
honours a control dependency as a memory bound; anything a block computes, its one-hot included, waits for
it. A non-finite number in one block therefore spreads to the later ones: the step is non-finite anyway.
"""
from __future__ import annotations

import tensorflow as tf

from harness.runtime.base import Runtime

BLOCK_ELEMENTS = 2 ** 24  # float32 logits per device in one block (64 MiB)
# Logits per device up to which the loss is one block whose gradient the forward pass keeps for the backward
# (256 MiB): small vocabularies and batches skip the recomputation (a third more of the head's multiply-adds).
KEEP_ELEMENTS = 2 ** 26


def block_length(batch: int, seq: int, vocab: int, budget: int = BLOCK_ELEMENTS) -> int:
    """The longest slice of the sequence that divides `seq` and whose logits, over `batch` rows and `vocab`
    columns (a device's share), fit in `budget` elements; at least 1."""
    best = 1
    for c in range(1, seq + 1):
        if seq % c == 0 and batch * c * vocab <= budget:
            best = c
    return best


def token_cross_entropy(runtime: Runtime, hidden: tf.Tensor, kernel: tf.Tensor, targets: tf.Tensor,
                        budget: int | None = None, keep: int | None = None) -> tf.Tensor:
    """-log softmax(hidden @ kernel)[target] per position, float32 [b, s].

    hidden [b, s, m] and kernel [m, vocab] in the compute dtype (the logits are float32, as the matmul's
    output cast up); targets [b, s] int. Gradients reach hidden and kernel; the kernel's is summed over
    blocks in float32. `budget` / `keep` (default: the module's BLOCK_ELEMENTS / KEEP_ELEMENTS, read at the
    call) bound a block's logits and the logits kept whole, per device."""
    budget = BLOCK_ELEMENTS if budget is None else budget
    keep = KEEP_ELEMENTS if keep is None else keep
    b, seq, m = hidden.shape
    vocab = kernel.shape[-1]
    n = runtime.shards("vocab")
    data = runtime.shards("batch")
    local_b = b // data if b % data == 0 else b
    kept = local_b * seq * (vocab // n) <= keep
    c = seq if kept else block_length(local_b, seq, vocab // n, budget)
    head = (WholeHead if n == 1 else SplitHead)(runtime, tf.cast(targets, tf.int32), b, c, m, vocab, n)

    def after(x: tf.Tensor, earlier: tf.Tensor | None) -> tf.Tensor:
        """x [b, c, m] made to wait for `earlier` [b, ...] by adding 0 x one of its numbers per row."""
        if earlier is None:
            return x
        first = tf.reshape(earlier[:, :1], [b, -1])[:, :1]
        return x + tf.cast(tf.expand_dims(first * 0.0, -1), x.dtype)

    def block(x: tf.Tensor, w: tf.Tensor, i: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Block i's (loss [b, c], logsumexp and d loss / d logits per unit upstream gradient, float32) from
        its already-chained input x [b, c, m]."""
        z = head.logits(x, w)
        top = tf.reduce_max(z, axis=head.vocab_axes)
        # One exponential per logit: the softmax is exp(z - top) / its sum, the same numbers as
        # exp(z - logsumexp) to float32 rounding.
        e = tf.exp(z - head.per_token(top))
        total = tf.reduce_sum(e, axis=head.vocab_axes)
        lse = tf.math.log(total) + top
        hot = head.target_hot(i, x)
        loss = lse - tf.reduce_sum(z * hot, axis=head.vocab_axes)
        return head.rows_of(loss), lse, e * head.per_token(1.0 / total) - hot

    @tf.custom_gradient
    def xent(x: tf.Tensor, w: tf.Tensor):
        w = head.kernel(w)
        losses: list[tf.Tensor] = []
        kept_grads: list[tf.Tensor] = []
        for i in range(0, seq, c):
            loss, _, dz = block(after(x[:, i:i + c], losses[-1] if losses else None), w, i)
            losses.append(loss)
            if kept:
                kept_grads.append(dz)

        def grad(dy: tf.Tensor):
            dxs: list[tf.Tensor] = []
            dw = None
            for j, i in enumerate(range(0, seq, c)):
                if kept:
                    dz = kept_grads[j]
                else:
                    # + 0 x the upstream gradient: the recomputed logits are not the forward's, so no common-
                    # subexpression pass (Grappler's, XLA's) merges the two and keeps every block's logits.
                    x_again = after(x[:, i:i + c], dy[:, i:i + c])
                    if dxs:
                        # The next block waits on both products of the previous block's gradient: an executor
                        # that ran the kernel's chain first would otherwise hold every block's logit gradient
                        # until it got to the inputs' products. It waits on the running sum, not the block's
                        # part: each partial sum then has a second reader, so Grappler cannot fold the chain of
                        # additions into one AddN that waits for (and holds) every block's [m, vocab] part.
                        x_again = after(x_again, dxs[-1]) + tf.cast(tf.reduce_sum(dw[:1, ..., :1]) * 0.0, x.dtype)
                    _, _, dz = block(x_again, w, i)
                dz = tf.cast(dz * head.per_token(head.tokens(dy[:, i:i + c])), x.dtype)
                dx, part = head.backward(x[:, i:i + c], w, dz)
                dxs.append(dx)
                dw = part if dw is None else dw + part
            return tf.concat(dxs, axis=1) if len(dxs) > 1 else dxs[0], tf.cast(head.unkernel(dw), w.dtype)

        return (tf.concat(losses, axis=1) if len(losses) > 1 else losses[0]), grad

    return xent(hidden, kernel)


def _ids_after(ids: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
    """Target ids [b, c] as float32 (exact below 2^24), made to wait for the block's input x [b, c, m]: a
    one-hot whose only input is the targets would otherwise be computed for every block at the step's start
    and held until its block runs."""
    return tf.cast(ids, tf.float32) + tf.cast(x[:, :, 0], tf.float32) * 0.0


def _hot(ids: tf.Tensor, size: int) -> tf.Tensor:
    """Float32 one-hot [..., size] of float ids [...]: a compare against 0..size-1."""
    return tf.cast(tf.equal(tf.expand_dims(ids, -1), tf.range(size, dtype=tf.float32)), tf.float32)


class WholeHead:
    """Every device holds the whole vocabulary: a block's logits are [b * c, vocab], plain 2-D matmuls."""

    vocab_axes = -1

    def __init__(self, runtime: Runtime, targets: tf.Tensor, b: int, c: int, m: int, vocab: int, n: int) -> None:
        self.targets, self.b, self.c, self.m, self.vocab = targets, b, c, m, vocab

    def kernel(self, w: tf.Tensor) -> tf.Tensor:
        return w

    def unkernel(self, dw: tf.Tensor) -> tf.Tensor:
        return dw

    def tokens(self, t: tf.Tensor) -> tf.Tensor:
        """[b, c] -> this head's token axis [b * c]."""
        return tf.reshape(t, [self.b * self.c])

    def rows_of(self, t: tf.Tensor) -> tf.Tensor:
        return tf.reshape(t, [self.b, self.c])

    def per_token(self, t: tf.Tensor) -> tf.Tensor:
        return tf.expand_dims(t, -1)

    def logits(self, x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.cast(tf.matmul(tf.reshape(x, [self.b * self.c, self.m]), w), tf.float32)

    def target_hot(self, i: int, x: tf.Tensor) -> tf.Tensor:
        return _hot(self.tokens(_ids_after(self.targets[:, i:i + self.c], x)), self.vocab)

    def backward(self, x: tf.Tensor, w: tf.Tensor, dz: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        dx = tf.reshape(tf.matmul(dz, w, transpose_b=True), [self.b, self.c, self.m])
        dw = tf.cast(tf.matmul(tf.reshape(x, [self.b * self.c, self.m]), dz, transpose_a=True), tf.float32)
        return dx, dw


class SplitHead:
    """The vocabulary split n ways: the kernel viewed as [m, n, vocab / n] with its second axis on the
    vocabulary's devices, a block's logits [b, c, n, vocab / n] (each device computes its shard); the
    maximum, the sum of exponentials and the target's logit reduce over the shards."""

    vocab_axes = (2, 3)

    def __init__(self, runtime: Runtime, targets: tf.Tensor, b: int, c: int, m: int, vocab: int, n: int) -> None:
        self.runtime, self.c, self.m, self.vocab, self.n, self.rows = runtime, c, m, vocab, n, vocab // n
        self.split = ("batch", None, "vocab", None)
        # Which shard holds each target [b, s, n] (per-token numbers), and the target's index in it.
        self.owner = runtime.place(tf.one_hot(targets // self.rows, n, dtype=tf.float32), ("batch", None, "vocab"))
        self.local = targets % self.rows

    def kernel(self, w: tf.Tensor) -> tf.Tensor:
        return self.runtime.place(tf.reshape(w, [self.m, self.n, self.rows]), (None, "vocab", None))

    def unkernel(self, dw: tf.Tensor) -> tf.Tensor:
        return tf.reshape(dw, [self.m, self.vocab])

    def tokens(self, t: tf.Tensor) -> tf.Tensor:
        return t

    def rows_of(self, t: tf.Tensor) -> tf.Tensor:
        return t

    def per_token(self, t: tf.Tensor) -> tf.Tensor:
        return tf.expand_dims(tf.expand_dims(t, -1), -1)

    def logits(self, x: tf.Tensor, w3: tf.Tensor) -> tf.Tensor:
        return self.runtime.place(tf.cast(tf.einsum("bcm,mkr->bckr", x, w3), tf.float32), self.split)

    def target_hot(self, i: int, x: tf.Tensor) -> tf.Tensor:
        """1 at the target, in the shard that holds it (each device builds its own shard's part)."""
        hot = _hot(_ids_after(self.local[:, i:i + self.c], x), self.rows)
        return self.runtime.place(tf.einsum("bcr,bck->bckr", hot, self.owner[:, i:i + self.c]), self.split)

    def backward(self, x: tf.Tensor, w3: tf.Tensor, dz: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        dx = tf.einsum("bckr,mkr->bcm", dz, w3)
        dw = tf.cast(tf.einsum("bcm,bckr->mkr", x, dz), tf.float32)
        return dx, self.runtime.place(dw, (None, "vocab", None))
