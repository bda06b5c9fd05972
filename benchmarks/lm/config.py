"""The decoder LMs' shared config sections (defaults: the MLPerf references' C4 data and AdamW) and the base
of their model sections."""
from __future__ import annotations

import dataclasses
import math

from harness.config import field
from harness.train.input_pipeline import PipelineConfig


@dataclasses.dataclass
class DecoderModelConfig:
    """The `model` fields every decoder LM has (benchmarks/lm/decoder.py reads them); a model's config extends
    it. Defaults: Llama 3.1 8B's; a model re-declares those its reference sets otherwise."""
    vocab_size: int = field(128256, min=8, doc="Llama-3.1 tokenizer")
    hidden_size: int = field(4096, min=8)
    num_layers: int = field(32, min=1)
    num_heads: int = field(32, min=1, doc="query heads")
    num_kv_heads: int = field(8, min=1, doc="key/value heads (grouped-query attention)")
    head_dim: int = field(128, min=2)
    rope_base: float = field(500000.0, min=1.0)
    norm_epsilon: float = field(1e-5, min=0.0)
    init_stddev: float = field(0.02, min=0.0, doc="normal init of the weights (init_method_std)")
    output_init_stddev: float = field(0.0, min=0.0, doc="normal init of the attention output and feed-forward "
                                      "(or experts') down projections; 0 = init_stddev / sqrt(2 * num_layers), "
                                      "Megatron's scaled init (output_layer_init_method), which the references keep")
    init_checkpoint: str = field("", doc="a Hugging Face checkpoint directory (config.json, safetensors) "
                                 "loaded into the model after it is built, before the timed run (open division)")
    remat: bool = field(False, doc="recompute each decoder layer in the backward pass (tf.recompute_grad): only "
                        "each layer's input is kept for the backward pass, at the cost of a second forward pass")


    def output_stddev(self) -> float:
        return self.output_init_stddev or self.init_stddev / math.sqrt(2.0 * self.num_layers)


@dataclasses.dataclass
class DataConfig(PipelineConfig):
    source: str = field("synthetic", choices=("synthetic", "indexed"))
    data_dir: str = field("", doc="indexed: folder holding the Megatron .bin/.idx pairs")
    train_prefix: str = field("c4-train.en_6_text_document", doc="indexed: <prefix>.bin/.idx of the training set")
    eval_prefix: str = field("c4-validation-91205-samples.en_text_document",
                             doc="indexed: <prefix>.bin/.idx of the validation set (first eval_samples rows)")
    seq_length: int = field(8192, min=8, doc="tokens per row (MLPerf max_sequence_length)")
    eod_id: int = field(0, min=0, doc="end-of-document token; where the workload's reference masks it "
                        "(gpt_oss_20b's eod_mask_loss), no loss is taken where it is the input")
    train_samples: int = field(0, min=0, doc="rows in one epoch (MLPerf train_samples); 0 = counted from "
                               "the data (indexed) or the synthetic corpus size")
    eval_samples: int = field(1024, min=1, doc="rows of the fixed eval set (closed: 1024)")
    eval_every_samples: int = field(0, min=0, doc="eval cadence in training samples (0 = the rules: "
                                    "ceil(12288 / global_batch_size) * global_batch_size)")
    shuffle_buffer: int = field(64, min=1)
    synthetic_seed: int = field(0, doc="fixes the synthetic language; the run seed fixes the order")
    synthetic_train_rows: int = field(4096, min=1, doc="synthetic: rows in one epoch")
    synthetic_doc_min: int = field(64, min=2, doc="synthetic: shortest document, EOD included")
    synthetic_doc_max: int = field(256, min=2, doc="synthetic: longest document, EOD included")
    synthetic_main_prob: float = field(0.8, min=0.0, max=1.0, doc="synthetic: probability of a token's "
                                       "main successor (the rest is spread over synthetic_branching - 1)")
    synthetic_branching: int = field(4, min=1, doc="synthetic: successors per token")


@dataclasses.dataclass
class OptimizerConfig:
    base_learning_rate: float = field(4e-4, min=0.0)
    end_learning_rate: float = field(4e-5, min=0.0)
    warmup_steps: int = field(128, min=0)
    max_steps: int = field(1_200_000, min=1, doc="length of the cosine (MLPerf max_steps); decay steps are "
                           "max_steps - warmup_steps. The run stops at the target long before")
    beta_1: float = field(0.9, min=0.0, max=1.0)
    beta_2: float = field(0.95, min=0.0, max=1.0)
    epsilon: float = field(1e-5, min=0.0)
    weight_decay: float = field(0.1, min=0.0)
    clip_norm: float = field(1.0, min=0.0, doc="clip gradients by global norm (0 = off)")
    exclude_from_decay: list[str] = field(default_factory=lambda: [r"norm", r"/bias$", r"/sinks$"],
                                          doc="regexes of variable paths without weight decay (Megatron decays "
                                          "no bias and no 1-D weight: norms, gpt_oss_20b's attention sinks)")

    def applied_decay(self) -> float:
        """The weight decay AdamW applies: the logged one (deepseekv3_671b's reference applies another)."""
        return self.weight_decay
