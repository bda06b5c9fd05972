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

from harness.runtime.base import Runtime

BLOCK_ELEMENTS = 2 ** 26  # float32 logits per device in one block (256 MiB)


def block_length(batch: int, seq: int, vocab: int, budget: int = BLOCK_ELEMENTS) -> int:
    """The longest slice of the sequence that divides `seq` and whose logits, over `batch` rows and `vocab`
    columns (a device's share), fit in `budget` elements; at least 1."""
    best = 1
    for c in range(1, seq + 1):
        if seq % c == 0 and batch * c * vocab <= budget:
            best = c
    return best


def token_cross_entropy(runtime: Runtime, hidden: tf.Tensor, kernel: tf.Tensor, targets: tf.Tensor,
                        budget: int = BLOCK_ELEMENTS) -> tf.Tensor:
    """-log softmax(hidden @ kernel)[target] per position, float32 [b, s].

    hidden [b, s, m] and kernel [m, vocab] in the compute dtype (the logits are float32, as the matmul's
    output cast up); targets [b, s] int. Gradients reach hidden and kernel (the kernel's summed over blocks in
    float32 and returned in its dtype)."""
    b, seq, _ = hidden.shape
    vocab = kernel.shape[-1]
    n = runtime.shards("vocab")
    rows = runtime.shards("batch")
    local_b = b // rows if b % rows == 0 else b
    c = block_length(local_b, seq, vocab // n, budget)
    targets = tf.cast(targets, tf.int32)
    if n == 1:
        return _whole_vocab(hidden, kernel, targets, c)
    return _split_vocab(runtime, hidden, kernel, targets, c, n)


def _after(deps: list[tf.Tensor], fn):
    """fn() run after `deps` (empty: at once)."""
    if not deps:
        return fn()
    with tf.control_dependencies(deps):
        return fn()


def _whole_vocab(hidden: tf.Tensor, kernel: tf.Tensor, targets: tf.Tensor, c: int) -> tf.Tensor:
    """Every device holds the whole vocabulary: the fused sparse softmax cross-entropy kernel per block."""
    b, seq, _ = hidden.shape
    vocab = kernel.shape[-1]
    starts = range(0, seq, c)

    def fused(x: tf.Tensor, w: tf.Tensor, i: int) -> tuple[tf.Tensor, tf.Tensor]:
        """Block i's losses [b, c] and d loss / d logits [b, c, vocab] (the kernel takes rank 2)."""
        z = tf.reshape(tf.cast(tf.einsum("bcm,mv->bcv", x[:, i:i + c], w), tf.float32), [b * c, vocab])
        loss, backprop = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(
            features=z, labels=tf.reshape(targets[:, i:i + c], [b * c]))
        return tf.reshape(loss, [b, c]), tf.reshape(backprop, [b, c, vocab])

    @tf.custom_gradient
    def xent(x: tf.Tensor, w: tf.Tensor):
        out: list[tf.Tensor] = []
        for i in starts:
            loss, _ = _after(out[-1:], lambda: fused(x, w, i))
            out.append(loss)
        losses = tf.concat(out, axis=1) if len(out) > 1 else out[0]

        def grad(dy: tf.Tensor):
            dxs: list[tf.Tensor] = []
            dw = None
            for i in starts:
                def block(i=i):
                    _, backprop = fused(x, w, i)
                    return tf.cast(backprop * tf.expand_dims(dy[:, i:i + c], -1), x.dtype)
                dlogits = _after([] if dw is None else [dw], block)
                dxs.append(tf.einsum("bcv,mv->bcm", dlogits, w))
                part = tf.cast(tf.einsum("bcm,bcv->mv", x[:, i:i + c], dlogits), tf.float32)
                dw = part if dw is None else dw + part
            dx = tf.concat(dxs, axis=1) if len(dxs) > 1 else dxs[0]
            return dx, tf.cast(dw, w.dtype)

        return losses, grad

    return xent(hidden, kernel)


def _split_vocab(runtime: Runtime, hidden: tf.Tensor, kernel: tf.Tensor, targets: tf.Tensor, c: int,
                 n: int) -> tf.Tensor:
    """The vocabulary split n ways: each device scores its shard; per-token numbers are reduced over it."""
    b, seq, m = hidden.shape
    vocab = kernel.shape[-1]
    rows = vocab // n
    starts = range(0, seq, c)
    tokens = ("batch", None)
    own = runtime.place(tf.one_hot(targets // rows, n, dtype=tf.float32), tokens + ("vocab",))   # [b, s, n]
    local = targets % rows                                                                     # [b, s]

    def sharded(w: tf.Tensor) -> tf.Tensor:
        return runtime.place(tf.reshape(w, [m, n, rows]), (None, "vocab", None))

    def logits(x: tf.Tensor, w3: tf.Tensor, i: int) -> tf.Tensor:
        z = tf.einsum("bcm,mkr->bckr", x[:, i:i + c], w3)
        return runtime.place(tf.cast(z, tf.float32), tokens + ("vocab", None))                   # [b, c, n, rows]

    def target_hot(i: int) -> tf.Tensor:
        """[b, c, n, rows]: 1 at the target in the shard that holds it (each device builds its shard's)."""
        hot = tf.one_hot(local[:, i:i + c], rows, dtype=tf.float32)
        return runtime.place(tf.einsum("bcr,bck->bckr", hot, own[:, i:i + c]), tokens + ("vocab", None))

    def block_loss(z: tf.Tensor, i: int) -> tuple[tf.Tensor, tf.Tensor]:
        top = tf.stop_gradient(tf.reduce_max(z, axis=[2, 3]))                                  # [b, c]
        shifted = z - tf.expand_dims(tf.expand_dims(top, -1), -1)
        lse = tf.math.log(tf.reduce_sum(tf.exp(shifted), axis=[2, 3])) + top
        picked = tf.reduce_sum(z * target_hot(i), axis=[2, 3])
        return lse - picked, lse

    @tf.custom_gradient
    def xent(x: tf.Tensor, w: tf.Tensor):
        w3 = sharded(w)
        out: list[tf.Tensor] = []
        lses: list[tf.Tensor] = []
        for i in starts:
            loss, lse = _after(out[-1:], lambda: block_loss(logits(x, w3, i), i))
            out.append(loss)
            lses.append(lse)
        losses = tf.concat(out, axis=1) if len(out) > 1 else out[0]

        def grad(dy: tf.Tensor):
            dxs: list[tf.Tensor] = []
            dw = None
            for j, i in enumerate(starts):
                def block(i=i, j=j):
                    z = logits(x, w3, i)
                    lse = tf.expand_dims(tf.expand_dims(lses[j], -1), -1)
                    scale = tf.expand_dims(tf.expand_dims(dy[:, i:i + c], -1), -1)
                    return tf.cast((tf.exp(z - lse) - target_hot(i)) * scale, x.dtype)
                dz = _after([] if dw is None else [dw], block)
                dxs.append(tf.einsum("bckr,mkr->bcm", dz, w3))
                part = tf.cast(tf.einsum("bcm,bckr->mkr", x[:, i:i + c], dz), tf.float32)
                part = runtime.place(part, (None, "vocab", None))
                dw = part if dw is None else dw + part
            dx = tf.concat(dxs, axis=1) if len(dxs) > 1 else dxs[0]
            return dx, tf.cast(tf.reshape(dw, [m, vocab]), w.dtype)

        return losses, grad

    return xent(hidden, kernel)
