"""BERT's own config sections (defaults: the MLPerf reference, BERT-large phase 2)."""
from __future__ import annotations

import dataclasses

from harness.config import field
from harness.train.input_pipeline import PipelineConfig


@dataclasses.dataclass
class DataConfig(PipelineConfig):
    """MLPerf BERT sources; the input-technique keys (parallel_reads, deterministic, threads, cache_eval,
    prefetch_to_device, service) come from harness.train.input_pipeline.PipelineConfig."""

    source: str = field("synthetic", choices=("synthetic", "tfrecord"))
    data_dir: str = field("", doc="tfrecord: folder of the MLPerf BERT training shards and eval file")
    train_pattern: str = field("part-*", doc="glob of training shards inside data_dir (split over hosts)")
    eval_pattern: str = field("eval_10k*", doc="glob of the eval file(s), read in sorted order")
    seq_length: int = field(512, min=8)
    max_predictions: int = field(76, min=1, doc="masked-LM predictions per sequence")
    train_samples: int = field(156725653, min=1, doc="sequences in the training set (MLPerf train_samples)")
    eval_samples: int = field(10000, min=1)
    shuffle_buffer: int = field(10000, min=1)
    parse_block: int = field(64, min=1, doc="tfrecord: training records parsed together, by one "
                             "tf.io.parse_example over the block, then split again (the same examples in the "
                             "same order, at a fraction of the per-record cost); 1 = one parse_single_example "
                             "a record, as the reference")
    eval_every_samples: int = field(0, min=0, doc="eval cadence in training samples "
                                    "(0 = MLPerf: floor(0.05*(230.23*gbs+3e6)/25000)*25000)")
    synthetic_seed: int = field(0, doc="fixes the synthetic grammar and corpus; the run seed fixes the order")
    synthetic_branching: int = field(4, min=2, doc="successors per token in the synthetic grammar")
    synthetic_main_prob: float = field(0.9, min=0.0, max=1.0, doc="probability of a token's main successor")


@dataclasses.dataclass
class ModelConfig:
    vocab_size: int = field(30522, min=8)
    hidden_size: int = field(1024, min=8)
    num_layers: int = field(24, min=1)
    num_heads: int = field(16, min=1)
    ff_size: int = field(4096, min=8)
    max_position: int = field(512, min=8)
    type_vocab_size: int = field(2, min=1)
    hidden_dropout: float = field(0.1, min=0.0, max=1.0)
    attention_dropout: float = field(0.1, min=0.0, max=1.0)
    init_stddev: float = field(0.02, min=0.0)
    layer_norm_epsilon: float = field(1e-12, min=0.0)
    init_checkpoint: str = field("", doc="TF checkpoint (reference variable names) or Hugging Face checkpoint "
                                 "directory (BertForPreTraining) loaded during init")


@dataclasses.dataclass
class OptimizerConfig:
    name: str = field("lamb", choices=("lamb",))
    base_learning_rate: float = field(0.000425, min=0.0)
    end_learning_rate: float = field(0.0, min=0.0)
    warmup_steps: int = field(0, min=0, doc="linear warmup steps (num_warmup_steps)")
    start_warmup_step: int = field(0, doc="step the warmup counts from (MLPerf start_warmup_step)")
    train_steps: int = field(0, min=0, doc="polynomial decay length in steps (0 = the training budget)")
    poly_power: float = field(1.0, min=0.0)
    beta_1: float = field(0.9, min=0.0, max=1.0)
    beta_2: float = field(0.999, min=0.0, max=1.0)
    epsilon: float = field(1e-6, min=0.0)
    weight_decay: float = field(0.01, min=0.0)
    clip_norm: float = field(1.0, min=0.0, doc="clip gradients by global norm (0 = off)")
    exclude_from_decay: list[str] = field(default_factory=lambda: [r"LayerNorm", r"/bias$", r"_bias$"],
                                          doc="regexes of variable paths without weight decay/trust ratio")
