"""BERT in Hugging Face layout (`BertForPreTraining`): tensor names, shapes and config.json keys.

transformers writes `bert.embeddings.{word,position,token_type}_embeddings.weight`, `bert.embeddings.LayerNorm`,
per layer `bert.encoder.layer.N.attention.self.{query,key,value}`, `attention.output.{dense,LayerNorm}`,
`intermediate.dense`, `output.{dense,LayerNorm}`, then `bert.pooler.dense`, `cls.predictions.transform.{dense,
LayerNorm}`, `cls.predictions.bias` and `cls.seq_relationship` ([2, hidden], the reference's `output_weights`
orientation). Linear weights are [out, in]; LayerNorm `weight`/`bias` are gamma/beta. The masked-LM decoder is
tied to the word embeddings (`tie_word_embeddings`), so `cls.predictions.decoder.*` is a copy when present.
The model's GELU is the tanh form (the reference's); transformers calls it `gelu_new` (`gelu_pytorch_tanh` is
the same function), while `gelu` is the erf form, refused.
"""
from __future__ import annotations

from typing import Any, Callable

from harness.nn.hf_checkpoint import Checker, Entry, Layout, Out, Part, direct, linear_out, same, transposed

TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def config_problems(hf: dict[str, Any], m: Any) -> list[str]:
    c = Checker(hf)
    c.same("vocab_size", m.vocab_size, "model.vocab_size")
    c.same("hidden_size", m.hidden_size, "model.hidden_size")
    c.same("num_hidden_layers", m.num_layers, "model.num_layers")
    c.same("num_attention_heads", m.num_heads, "model.num_heads")
    c.same("intermediate_size", m.ff_size, "model.ff_size")
    c.same("max_position_embeddings", m.max_position, "model.max_position")
    c.same("type_vocab_size", m.type_vocab_size, "model.type_vocab_size")
    c.same("layer_norm_eps", m.layer_norm_epsilon, "model.layer_norm_epsilon", close=True)
    if hf.get("hidden_act", "gelu") not in TANH_GELU:
        c.problems.append(f"config.json hidden_act={hf.get('hidden_act', 'gelu')}: the model's GELU is the tanh "
                          f"form (gelu_new)")
    c.flag("tie_word_embeddings", True, True, "the model's masked-LM output is the word embeddings")
    c.flag("position_embedding_type", "absolute", "absolute", "the model's position embeddings are absolute")
    return c.problems


def layout(m: Any, ckpt_names: set[str], have: Callable[[str], bool]) -> Layout:
    """benchmarks/bert/model.py's variables <-> `BertForPreTraining`'s tensors."""
    del ckpt_names, have
    h, n, ff, v = m.hidden_size, m.num_heads, m.ff_size, m.vocab_size
    d = h // n
    entries: list[Entry] = []
    outs: list[Out] = []

    def add(path: str, shape: tuple[int, ...], name: str, hf_shape: tuple[int, ...], is_linear: bool) -> None:
        if is_linear:
            entries.append(transposed(path, shape, Part(name, hf_shape)))
            outs.append(Out(name, hf_shape, (path,), linear_out(hf_shape[1])))
        else:
            entries.append(direct(path, shape, Part(name, hf_shape)))
            outs.append(Out(name, hf_shape, (path,), same(hf_shape)))

    def dense(path: str, name: str, n_in: int, n_out: int, kernel: tuple[int, ...] | None = None,
              bias: tuple[int, ...] | None = None) -> None:
        add(f"{path}/kernel", kernel or (n_in, n_out), f"{name}.weight", (n_out, n_in), True)
        add(f"{path}/bias", bias or (n_out,), f"{name}.bias", (n_out,), False)

    def norm(path: str, name: str) -> None:
        add(f"{path}/gamma", (h,), f"{name}.weight", (h,), False)
        add(f"{path}/beta", (h,), f"{name}.bias", (h,), False)

    for kind, rows in (("word", v), ("position", m.max_position), ("token_type", m.type_vocab_size)):
        add(f"bert/embeddings/{kind}_embeddings_layer/embeddings", (rows, h),
            f"bert.embeddings.{kind}_embeddings.weight", (rows, h), False)
    norm("bert/embeddings/LayerNorm", "bert.embeddings.LayerNorm")
    for i in range(m.num_layers):
        us, hf = f"bert/encoder/layer_{i}", f"bert.encoder.layer.{i}"
        for part in ("query", "key", "value"):
            dense(f"{us}/attention/self/{part}", f"{hf}.attention.self.{part}", h, h, (h, n, d), (n, d))
        dense(f"{us}/attention/self/output", f"{hf}.attention.output.dense", h, h, (n, d, h))
        norm(f"{us}/attention/output/LayerNorm", f"{hf}.attention.output.LayerNorm")
        dense(f"{us}/intermediate/dense", f"{hf}.intermediate.dense", h, ff)
        dense(f"{us}/output/dense", f"{hf}.output.dense", ff, h)
        norm(f"{us}/output/LayerNorm", f"{hf}.output.LayerNorm")
    dense("bert/pooler/dense", "bert.pooler.dense", h, h)
    dense("cls/predictions/transform/dense", "cls.predictions.transform.dense", h, h)
    norm("cls/predictions/transform/LayerNorm", "cls.predictions.transform.LayerNorm")
    add("cls/predictions/output_bias", (v,), "cls.predictions.bias", (v,), False)
    add("cls/seq_relationship/output_weights", (2, h), "cls.seq_relationship.weight", (2, h), False)
    add("cls/seq_relationship/output_bias", (2,), "cls.seq_relationship.bias", (2,), False)
    copies = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "bert.embeddings.position_ids")
    return Layout(entries, outs, ignore=lambda name: name in copies)


def hf_config(m: Any, dtype: str) -> dict[str, Any]:
    """config.json for `BertForPreTraining` as this model computes (tanh GELU, tied masked-LM output)."""
    return {"architectures": ["BertForPreTraining"], "model_type": "bert", "vocab_size": m.vocab_size,
            "hidden_size": m.hidden_size, "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
            "intermediate_size": m.ff_size, "hidden_act": "gelu_new", "max_position_embeddings": m.max_position,
            "type_vocab_size": m.type_vocab_size, "layer_norm_eps": m.layer_norm_epsilon,
            "hidden_dropout_prob": m.hidden_dropout, "attention_probs_dropout_prob": m.attention_dropout,
            "initializer_range": m.init_stddev, "tie_word_embeddings": True, "pad_token_id": 0,
            "torch_dtype": dtype}
