"""The `data` section of llama2_70b_lora: the reference's parquet files or a synthetic prompt -> answer set,
the eval cadence the rules set for this benchmark, and the input-technique keys every workload's data section
inherits."""
from __future__ import annotations

import dataclasses

from harness.config import field
from harness.train.input_pipeline import PipelineConfig

from benchmarks.llama2_70b_lora.rules import REFERENCE_EVAL_ROWS


@dataclasses.dataclass
class LoraDataConfig(PipelineConfig):
    source: str = field("synthetic", choices=("synthetic", "parquet"))
    data_dir: str = field("", doc="parquet: folder holding the reference's train and validation files")
    train_file: str = field("train-00000-of-00001.parquet", doc="parquet: training rows under data_dir")
    eval_file: str = field("validation-00000-of-00001.parquet", doc="parquet: validation rows under data_dir")
    seq_length: int = field(8192, min=8, doc="tokens per row (the files' rows; closed: 8192)")
    train_samples: int = field(0, min=0, doc="rows in one epoch (MLPerf train_samples; closed: 3901); parquet: "
                               "the file must hold exactly this many, 0 = as many as it holds; synthetic: 0 = "
                               "synthetic_train_rows")
    eval_samples: int = field(REFERENCE_EVAL_ROWS, min=1, doc="validation rows scored every eval (closed: 173); "
                              "parquet: the file must hold exactly this many; synthetic: rows generated")
    eval_every_samples: int = field(0, min=0, doc="eval cadence in training samples (0 = the rules: "
                                    "ceil(384 / global_batch_size) * global_batch_size)")
    eval_skip: int = field(-1, min=-1, doc="evals skipped (not run, not logged) at the start; -1 = the rules: "
                           "floor(0.125 * global_batch_size + 2)")
    synthetic_seed: int = field(0, doc="synthetic: fixes the rows and the answer map; the run seed fixes the order")
    synthetic_map_seed: int = field(-1, min=-1, doc="synthetic: fixes the answer map alone (-1 = synthetic_seed); "
                                    "a base trained on one map and fine-tuned on another starts confidently wrong")
    synthetic_train_rows: int = field(512, min=1, doc="synthetic: rows in one epoch when train_samples is 0")
    synthetic_alphabet: int = field(4, min=2, doc="synthetic: distinct prompt tokens (ids 4 .. 3 + alphabet); "
                                    "an answer token is a fixed permutation of the prompt token it answers, so "
                                    "a model that has not learned the map scores ln(alphabet) at best")
    synthetic_prompt_len: int = field(4, min=1, doc="synthetic: prompt tokens per example, and answer tokens")
    synthetic_train_labels: str = field("all", choices=("all", "answer"),
                                        doc="synthetic: training rows score every token (as the reference's "
                                        "train split does) or only the answers (as its validation split does)")
