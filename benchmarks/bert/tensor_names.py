"""MLPerf tensor names (as the checker's rulesets list them for `weights_initialization`) -> variable paths.

The names are the reference TF BERT checkpoint's, the same ones the initial checkpoint is loaded by
(`checkpoint.checkpoint_name` turns a variable path into one). Paths are listed from the config alone
(the model need not exist yet), following `model.py`; the masked-LM output weights are tied to the word
embeddings, so they have no tensor of their own, as in the reference.
"""
from __future__ import annotations

from harness.config import Config

from benchmarks.bert.checkpoint import checkpoint_name


def variable_paths(cfg: Config) -> list[str]:
    """The trainable variable paths of the BERT model the config builds."""
    paths = [f"bert/embeddings/{e}_embeddings_layer/embeddings" for e in ("word", "position", "token_type")]
    paths += ["bert/embeddings/LayerNorm/gamma", "bert/embeddings/LayerNorm/beta"]
    for i in range(cfg.model.num_layers):
        layer = f"bert/encoder/layer_{i}"
        for part in ("attention/self/query", "attention/self/key", "attention/self/value",
                     "attention/self/output", "intermediate/dense", "output/dense"):
            paths += [f"{layer}/{part}/kernel", f"{layer}/{part}/bias"]
        for norm in ("attention/output/LayerNorm", "output/LayerNorm"):
            paths += [f"{layer}/{norm}/gamma", f"{layer}/{norm}/beta"]
    paths += ["bert/pooler/dense/kernel", "bert/pooler/dense/bias",
              "cls/predictions/transform/dense/kernel", "cls/predictions/transform/dense/bias",
              "cls/predictions/transform/LayerNorm/gamma", "cls/predictions/transform/LayerNorm/beta",
              "cls/predictions/output_bias",
              "cls/seq_relationship/output_weights", "cls/seq_relationship/output_bias"]
    return paths


def weights_initialization_map(cfg: Config) -> dict[str, str]:
    return {checkpoint_name(p): p for p in variable_paths(cfg)}
