"""Next-token cross-entropy fused with the LM head, in blocks of tokens: never a [tokens, vocab] tensor.

At Llama 3.1's 128,256-id vocabulary, logits of 8 rows of 1,024 tokens are 4.2 GB in float32, and autodiff of
`logsumexp(logits) - logits[target]` keeps them, a softmax and a one-hot of the same size for the backward
pass. Here the head's matmul runs per block of positions (a slice of the sequence, every row), each block's
loss is reduced to one number per token at once, and the gradient is a custom one that recomputes each
block's logits in the backward pass: the step holds the logits of one block at a time (at most
`BLOCK_ELEMENTS` per device, a few copies of it while the block is live), plus per-token numbers.

On a mesh that splits `vocab` n ways the head is viewed as [hidden, n, vocab / n] with its second axis on the
vocabulary's devices, as `harness.nn.layers.vocab_parallel_lookup` views the embedding table: each device
computes the logits of its own shard only, the maximum, the sum of exponentials and the target's logit are
reduced over the vocabulary's mesh dimension (per-token numbers), and the target is picked by a one-hot of
the shard's size, never of the whole vocabulary; the head's gradient stays a shard.

Blocks run one after another (each waits on the previous block's result), so an executor that could run
independent blocks at once does not hold all their logits together.
"""
from __future__ import annotations

import tensorflow as tf

from harness.nn.layers import vocab_parallel_lookup
from harness.runtime.base import Runtime

BLOCK_ELEMENTS = 2 ** 24  # float32 logits per device in one block (64 MiB)
# Logits per device up to which the loss is one block whose softmax the forward pass keeps for the backward
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
                        budget: int = BLOCK_ELEMENTS, keep: int = KEEP_ELEMENTS) -> tf.Tensor:
    """-log softmax(hidden @ kernel)[target] per position, float32 [b, s]: logsumexp of the logits (blockwise)
    minus the target's logit, hidden . kernel[:, target] in float32 (a lookup of the target's column, as the
    input embedding looks up a row: no [tokens, vocab] one-hot).

    hidden [b, s, m] and kernel [m, vocab] in the compute dtype (the logits are float32, as the matmul's
    output cast up); targets [b, s] int. Gradients reach hidden and kernel."""
    columns = vocab_parallel_lookup(runtime, tf.transpose(kernel), tf.cast(targets, tf.int32))      # [b, s, m]
    picked = tf.reduce_sum(tf.cast(hidden, tf.float32) * tf.cast(columns, tf.float32), -1)
    return blockwise_logsumexp(runtime, hidden, kernel, budget, keep) - picked


def blockwise_logsumexp(runtime: Runtime, hidden: tf.Tensor, kernel: tf.Tensor, budget: int = BLOCK_ELEMENTS,
                        keep: int = KEEP_ELEMENTS) -> tf.Tensor:
    """log sum_v exp(hidden @ kernel)[..., v], float32 [b, s], one block of positions at a time, with a
    gradient that recomputes each block's logits (d/dz = softmax(z)); logits of at most `keep` elements per
    device are one block whose softmax the backward pass reuses."""
    b, seq, m = hidden.shape
    vocab = kernel.shape[-1]
    n = runtime.shards("vocab")
    data = runtime.shards("batch")
    local_b = b // data if b % data == 0 else b
    kept = local_b * seq * (vocab // n) <= keep
    c = seq if kept else block_length(local_b, seq, vocab // n, budget)
    head = (WholeHead if n == 1 else SplitHead)(runtime, b, c, m, vocab, n)

    def after(x: tf.Tensor, earlier: tf.Tensor | None) -> tf.Tensor:
        """x [b, c, m] made to depend on `earlier` [b, ...] (the previous block's result) by adding 0 x one
        of its numbers per row: blocks run one after another under any executor or compiler (nothing is
        computed ahead of its block), so one block's logits are live at a time."""
        if earlier is None:
            return x
        first = tf.reshape(earlier[:, :1], [b, -1])[:, :1]
        return x + tf.cast(tf.expand_dims(first * 0.0, -1), x.dtype)

    @tf.custom_gradient
    def lse_of(x: tf.Tensor, w: tf.Tensor):
        w = head.kernel(w)
        lses: list[tf.Tensor] = []
        softmax: list[tf.Tensor] = []
        for i in range(0, seq, c):
            z = head.logits(after(x[:, i:i + c], head.rows_of(lses[-1]) if lses else None), w)
            top = tf.reduce_max(z, axis=head.vocab_axes)
            lses.append(tf.math.log(tf.reduce_sum(tf.exp(z - head.per_token(top)), axis=head.vocab_axes)) + top)
            if kept:
                softmax.append(tf.exp(z - head.per_token(lses[-1])))

        def grad(dy: tf.Tensor):
            dxs: list[tf.Tensor] = []
            dw = None
            for j, i in enumerate(range(0, seq, c)):
                # + 0 x the upstream gradient: the recomputed logits are not the forward's, so no common-
                # subexpression pass (Grappler's, XLA's) merges the two and keeps every block's logits.
                x_again = after(x[:, i:i + c], dy[:, i:i + c])
                if dxs:
                    # The next block waits on both products of the previous block's gradient: an executor that
                    # ran the kernel's chain first would otherwise hold every block's logit gradient until it got
                    # to the inputs' products. The running sum, not the block's part, is what it waits on: each
                    # partial sum then has a second reader, so Grappler cannot fold the chain of additions
                    # into one AddN that waits for (and holds) every block's [m, vocab] part.
                    x_again = after(x_again, dxs[-1]) + tf.cast(tf.reduce_sum(dw[:1, ..., :1]) * 0.0, x.dtype)
                probs = softmax[j] if kept else tf.exp(head.logits(x_again, w) - head.per_token(lses[j]))
                dz = tf.cast(probs * head.per_token(head.tokens(dy[:, i:i + c])), x.dtype)
                dx, part = head.backward(x[:, i:i + c], w, dz)
                dxs.append(dx)
                dw = part if dw is None else dw + part
            return tf.concat(dxs, axis=1) if len(dxs) > 1 else dxs[0], tf.cast(head.unkernel(dw), w.dtype)

        lse = [head.rows_of(t) for t in lses]
        return (tf.concat(lse, axis=1) if len(lse) > 1 else lse[0]), grad

    return lse_of(hidden, kernel)


class WholeHead:
    """Every device holds the whole vocabulary: a block's logits are [b * c, vocab], plain 2-D matmuls."""

    vocab_axes = -1

    def __init__(self, runtime: Runtime, b: int, c: int, m: int, vocab: int, n: int) -> None:
        self.b, self.c, self.m = b, c, m

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

    def backward(self, x: tf.Tensor, w: tf.Tensor, dz: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        dx = tf.reshape(tf.matmul(dz, w, transpose_b=True), [self.b, self.c, self.m])
        dw = tf.cast(tf.matmul(tf.reshape(x, [self.b * self.c, self.m]), dz, transpose_a=True), tf.float32)
        return dx, dw


class SplitHead:
    """The vocabulary split n ways: the kernel viewed as [m, n, vocab / n] with its second axis on the
    vocabulary's devices, a block's logits [b, c, n, vocab / n] (each device computes its shard); the
    maximum and the sum of exponentials reduce over the shards."""

    vocab_axes = (2, 3)

    def __init__(self, runtime: Runtime, b: int, c: int, m: int, vocab: int, n: int) -> None:
        self.runtime, self.m, self.vocab, self.n = runtime, m, vocab, n
        self.split = ("batch", None, "vocab", None)

    def kernel(self, w: tf.Tensor) -> tf.Tensor:
        return self.runtime.place(tf.reshape(w, [self.m, self.n, self.vocab // self.n]), (None, "vocab", None))

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

    def backward(self, x: tf.Tensor, w3: tf.Tensor, dz: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        dx = tf.einsum("bckr,mkr->bcm", dz, w3)
        dw = tf.cast(tf.einsum("bcm,bckr->mkr", x, dz), tf.float32)
        return dx, self.runtime.place(dw, (None, "vocab", None))
