"""The decoder LMs' model: token embedding, a stack of pre-norm layers, a final RMSNorm and the LM head.

A model (llama31_8b, gpt_oss_20b, qwen35_397b_grpo's) subclasses `Decoder` and chooses each layer's attention
(or other sequence mixer) and feed-forward blocks (`attention`, `ffn`), its norms (`norm`), and, for attention
within documents, each position's document (`segments`).
Untied input and output embeddings, both normal(init_stddev). Named dimensions: `vocab` (the embedding
table through `vocab_parallel_lookup`, and the output layer, which the loss applies blockwise); the blocks
name their own. Every shape is static and no op leaves the device, so a step compiles under XLA.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import tensorflow as tf

from harness.nn.layers import Block, RMSNorm, normal, vocab_parallel_lookup
from harness.runtime.base import Runtime

from benchmarks.lm.config import DecoderModelConfig


class DecoderLayer(Block):
    """x + attention(norm(x)), then + ffn(norm(x)). The feed-forward returns its output, or (output, extras)
    for what the losses and metrics read besides the logits (a mixture of experts' routing)."""

    def __init__(self, decoder: Decoder, path: str, index: int) -> None:
        super().__init__(decoder.runtime, path, decoder.seed)
        self.attention_norm = decoder.norm(f"{path}/attention_norm")
        self.attention = decoder.attention(f"{path}/attention", index)
        self.mlp_norm = decoder.norm(f"{path}/mlp_norm")
        self.ffn = decoder.ffn(f"{path}/{decoder.FFN_NAME}", index)

    def __call__(self, x: tf.Tensor, segments: tf.Tensor | None) -> tuple[tf.Tensor, Any]:
        x = x + self.attention(self.attention_norm(x), segments)
        out = self.ffn(self.mlp_norm(x))
        y, extras = out if isinstance(out, tuple) else (out, None)
        return x + y, extras


@contextlib.contextmanager
def frozen_reads_after(block: Block, after: tf.Tensor) -> Iterator[None]:
    """Within: each frozen (non-trainable) variable that `block` or a block inside it holds is, as that
    block's attribute, its value read after the scalar `after` (`Runtime.read_after`); the variable again
    after."""
    held = [(m, name, v) for m in (block, *block.submodules) for name, v in list(vars(m).items())
            if isinstance(v, tf.Variable) and not v.trainable]
    try:
        for m, name, v in held:
            setattr(m, name, block.runtime.read_after(v, after))
        yield
    finally:
        for m, name, v in held:
            setattr(m, name, v)


def remat(layer: DecoderLayer, x: tf.Tensor, segments: tf.Tensor | None) -> tuple[tf.Tensor, Any]:
    """`layer` recomputed in the backward pass (tf.recompute_grad): only its input is kept. Extras leave it as
    the tensors of their `remat_outputs()` (those the losses and metrics read, with their gradients) and
    come back as `with_remat_outputs(tensors)`; None passes through.

    A block inside the layer whose call reads state set from outside (a LoRA adapter's dropout seed) has a
    `remat_context()`, taken here, in the forward pass: each run of the layer, the recompute too, sees that
    state as the forward pass did, tied to the run's input. Each run also reads the layer's frozen weights
    after its input (`frozen_reads_after`). tf.recompute_grad orders the recompute after the incoming
    gradient only through that input; a frozen weight (or a seed) is no input and gets no gradient, so a
    plain read is one value for both runs, and each copy made of it alone (a transposed layout, a bfloat16
    weight cast for a float32 dot, an FSDP gather, a dropout mask) is made once, in the forward pass, and
    held until the backward pass reaches the layer: a layer's weights kept per layer. Tied to the input,
    such a copy is also not made before its layer (XLA:CPU otherwise casts every layer's weights at the
    start of the step). Trainable weights are read as they are: the plain layer keeps about its input."""
    contexts = [m.remat_context() for m in (layer, *layer.submodules) if hasattr(m, "remat_context")]
    frozen = any(not v.trainable for v in layer.variables)
    made = {}

    def run(h):
        with contextlib.ExitStack() as stack:
            if contexts or frozen:
                # A reduce over two positions of each row, not one element, which XLA would fuse into every
                # weight's copy as a slice of the whole input (keeping the input until the last copy).
                after = tf.reduce_max(h[:, :2, 0])
                stack.enter_context(frozen_reads_after(layer, after))
                for context in contexts:
                    stack.enter_context(context(after))
            y, extras = layer(h, segments)
        made["extras"] = extras
        return y if extras is None else (y, *extras.remat_outputs())

    out = tf.recompute_grad(run)(x)
    extras = made["extras"]
    if extras is None:
        return out, None
    return out[0], extras.with_remat_outputs(list(out[1:]))


class Decoder(Block):
    """The hidden states that score the next token after each input token (through `head`), and each layer's
    extras (None for a plain one)."""

    FFN_NAME = "mlp"  # the feed-forward block's name in its variables' paths

    def __init__(self, runtime: Runtime, name: str, seed: int, cfg: DecoderModelConfig, seq: int) -> None:
        super().__init__(runtime, name, seed)
        self.cfg, self.seq = cfg, seq
        m, v, sd = cfg.hidden_size, cfg.vocab_size, cfg.init_stddev
        self.embeddings = self.var("embedding/embeddings", (v, m), ("vocab", None),
                                   normal(sd, f"{name}/embedding/embeddings", seed))
        self.layers = [DecoderLayer(self, f"{name}/layer_{i}", i) for i in range(cfg.num_layers)]
        self.final_norm = self.norm(f"{name}/final_norm")
        self.output = self.var("output/kernel", (m, v), (None, "vocab"), normal(sd, f"{name}/output/kernel", seed))

    def norm(self, path: str) -> Block:
        """The RMSNorm over the hidden size at `path` (each layer's two and the final one)."""
        return RMSNorm(self.runtime, path, self.seed, self.cfg.hidden_size, self.cfg.norm_epsilon)

    def attention(self, path: str, layer: int) -> Block:
        """Layer `layer`'s attention block at `path`, called as block(x, segments) -> x's shape."""
        raise NotImplementedError

    def ffn(self, path: str, layer: int) -> Block:
        """Layer `layer`'s feed-forward block at `path`, called as block(x) -> output or (output, extras)."""
        raise NotImplementedError

    def segments(self, inputs: tf.Tensor) -> tf.Tensor | None:
        """Each position's document index [b, s] when attention stays within documents; None: it crosses them."""
        return None

    def __call__(self, inputs: tf.Tensor) -> tuple[tf.Tensor, list[Any]]:
        """The final hidden states [b, s, hidden] (compute dtype, after the final norm) of inputs [b, s], and
        each layer's extras. The LM head is not applied here: the loss fuses it (`head`)."""
        segments = self.segments(inputs)
        x = tf.cast(vocab_parallel_lookup(self.runtime, self.embeddings, inputs), self.dtype)
        extras = []
        for layer in self.layers:
            x, e = remat(layer, x, segments) if self.cfg.remat else layer(x, segments)
            extras.append(e)
        return self.final_norm(x), extras

    def head(self) -> tf.Tensor:
        """The LM head's kernel [hidden, vocab] in the compute dtype."""
        return tf.cast(self.runtime.read(self.output), self.dtype)

    def logits(self, hidden: tf.Tensor) -> tf.Tensor:
        """Float32 logits [b, s, vocab] of hidden states [b, s, hidden]: the whole tensor, for inspection only
        (training and eval use the blockwise `harness.nn.cross_entropy`)."""
        return tf.cast(tf.einsum("bsm,mv->bsv", hidden, self.head()), tf.float32)
