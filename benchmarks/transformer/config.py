"""Transformer's own config sections (defaults: the MLPerf reference, Transformer-big on WMT En-De)."""
from __future__ import annotations

import dataclasses

from harness.config import field
from harness.train.input_pipeline import PipelineConfig


@dataclasses.dataclass
class DataConfig(PipelineConfig):
    """WMT En-De sources and packing; the input-technique keys (parallel_reads, deterministic, threads, cache_eval,
    prefetch_to_device, service) come from harness.train.input_pipeline.PipelineConfig."""

    source: str = field("synthetic", choices=("synthetic", "tfrecord", "tfds"))
    data_dir: str = field("", doc="tfrecord: folder of the reference's encoded shards; tfds: the TFDS data_dir")
    train_pattern: str = field("*encoded-train*", doc="tfrecord: glob of training shards (int64 inputs/targets)")
    vocab_file: str = field("", doc="tfrecord/tfds: the reference subword vocab (vocab.ende.32768)")
    eval_source_file: str = field("", doc="tfrecord: raw newstest2014.en, one sentence a line")
    eval_reference_file: str = field("", doc="tfrecord: raw newstest2014.de, the BLEU references")
    tfds_name: str = field("wmt14_translate/de-en", doc="tfds: dataset with 'en' and 'de' text features")
    tfds_train_split: str = field("train")
    tfds_eval_split: str = field("test", doc="newstest2014 (3003 sentences) in wmt14_translate")
    max_sequence_length: int = field(256, min=2, doc="training pairs with a side longer than this (EOS "
                                     "included) are discarded (MLPerf max_sequence_length, method discard)")
    packing: bool = field(True, doc="pack several pairs into each row (segment ids keep them apart); "
                          "false: one pair per row, padded")
    row_length: int = field(0, min=0, doc="tokens per training row (0 = max_sequence_length)")
    train_samples: int = field(0, min=0, doc="rows in one epoch (MLPerf train_samples); synthetic and "
                               "tfrecord: 0 = counted (tfrecord: once, cached beside the files; `mlperf-harness "
                               "data count CONFIG` prints it), a stated count must match; tfds: required")
    eval_samples: int = field(3003, min=1, doc="sentences in the eval set (newstest2014: 3003)")
    shuffle_buffer: int = field(10000, min=1)
    synthetic_seed: int = field(0, doc="fixes the synthetic language and corpus; the run seed fixes the order")
    synthetic_train_pairs: int = field(20000, min=1)


@dataclasses.dataclass
class ModelConfig:
    vocab_size: int = field(0, min=0, doc="0 = the data's (vocab file or synthetic language); otherwise it "
                            "must equal it")
    hidden_size: int = field(1024, min=8)
    num_layers: int = field(6, min=1, doc="encoder layers, and as many decoder layers")
    num_heads: int = field(16, min=1)
    filter_size: int = field(4096, min=8)
    layer_postprocess_dropout: float = field(0.1, min=0.0, max=1.0)
    attention_dropout: float = field(0.1, min=0.0, max=1.0)
    relu_dropout: float = field(0.1, min=0.0, max=1.0)
    label_smoothing: float = field(0.1, min=0.0, max=1.0)
    max_position: int = field(512, min=8, doc="longest position the sinusoid table covers (rows and decodes)")
    layer_norm_epsilon: float = field(1e-6, min=0.0)


@dataclasses.dataclass
class OptimizerConfig:
    name: str = field("adam", choices=("adam", "lazy_adam"), doc="logged opt_name; the update is Adam")
    base_learning_rate: float = field(2.0, min=0.0, doc="C in C * d^-0.5 * min(1, s/W) * max(s, W)^-0.5")
    warmup_steps: int = field(16000, min=1, doc="W (opt_learning_rate_warmup_steps)")
    beta_1: float = field(0.9, min=0.0, max=1.0)
    beta_2: float = field(0.997, min=0.0, max=1.0)
    epsilon: float = field(1e-9, min=0.0, doc="closed division: 1e-9 (the checker demands it)")


@dataclasses.dataclass
class EvalConfig:
    beam_size: int = field(4, min=1)
    alpha: float = field(0.6, min=0.0, doc="length penalty ((5 + length) / 6)^alpha")
    extra_decode_length: int = field(50, min=1, doc="a hypothesis may be this many tokens longer than its input")
