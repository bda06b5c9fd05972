"""dlrmv4's model section. Defaults are the reference's yambda-5b configuration: mlcommons/training@a67b8459
(PR #889 head) recommendation_v4/generative_recommenders/dlrm_v4/configs.py (`get_hstu_configs`,
`_build_embedding_table_config`) with train/gin/yambda_5b.gin (3 layers, max_seq_len 4096, history 4086)."""
from __future__ import annotations

import dataclasses

from harness.config import field

# The 11 tables in the reference's order and their rows (`YAMBDA_5B_CROSS_SPECS` and the id tables).
REFERENCE_TABLES = {
    "item_id": 9_390_624, "artist_id": 1_293_395, "album_id": 3_367_692, "uid": 1_000_001,
    "user_x_artist": 100_000_000, "user_x_album": 40_000_000, "user_x_hour": 24_000_000,
    "item_x_hour": 40_000_000, "artist_x_hour": 32_000_000, "user_x_is_organic": 2_000_000,
    "user_x_artist_x_hour": 40_000_000,
}
# Item-side tables, looked up for every history event and for the candidate.
ITEM_TABLES = ("item_id", "artist_id", "album_id")
# Contextual tables, one id each per sample, in the order the reference builds the contextual tokens.
CONTEXT_TABLES = ("uid", "user_x_artist", "user_x_album", "user_x_hour", "item_x_hour", "artist_x_hour",
                  "user_x_is_organic", "user_x_artist_x_hour")
NUM_ACTION_BITS = 3  # listen_plus 1, like 2, skip 4 (configs.py `action_weights` [1, 2, 4])


@dataclasses.dataclass
class ModelConfig:
    embedding_dim: int = field(512, min=2, doc="table dim = transducer dim D")
    num_layers: int = field(3, min=1, doc="STU layers (pinned at 3 by the 6.1 rules)")
    num_heads: int = field(4, min=1)
    attention_dim: int = field(128, min=1, doc="q/k dim per head")
    linear_dim: int = field(128, min=1, doc="u/v dim per head")
    preprocessor_hidden_dim: int = field(256, min=1)
    action_embedding_dim: int = field(8, min=1)
    item_hidden_dim: int = field(512, min=1, doc="item MLP hidden width (512 in dlrm_hstu.py, whatever D is)")
    head_hidden_dim: int = field(512, min=1, doc="head MLP hidden width (512 in dlrm_hstu.py, whatever D is)")
    history_length: int = field(4086, min=1, doc="most history events per sample (per pool: a third)")
    max_seq_len: int = field(4096, min=10, doc="logged max_sequence_length; must hold history + 9")
    num_position_buckets: int = field(8192, min=10)
    num_time_buckets: int = field(2048, min=1, doc="time-bucket rows minus one (buckets 0..this)")
    input_dropout: float = field(0.2, min=0.0, max=1.0)
    linear_dropout: float = field(0.1, min=0.0, max=1.0)
    loss_weight: float = field(0.2, min=0.0, doc="the reference's causal_multitask_weights")
    tables: dict[str, int] = field(default_factory=lambda: dict(REFERENCE_TABLES),
                                   doc="rows of each of the 11 embedding tables")

    def check(self) -> list[str]:
        """Problems with this model config, as one-line messages."""
        problems = []
        if sorted(self.tables) != sorted(REFERENCE_TABLES):
            problems.append(f"model.tables must name exactly {', '.join(REFERENCE_TABLES)}")
        if self.num_heads * self.linear_dim != self.embedding_dim:
            problems.append("model.num_heads * model.linear_dim must equal model.embedding_dim")
        if self.history_length + 9 > self.max_seq_len:
            problems.append("model.max_seq_len must hold history_length + 1 candidate + 8 contextual tokens")
        return problems


@dataclasses.dataclass
class DataConfig:
    """Where the samples come from. `yambda`: the reference's preprocessed flat cache (benchmarks/dlrmv4/
    yambda.py), training on day windows 0..train_windows-1 in order, scoring window eval_window; `synthetic`: a
    learnable stream generated from synthetic_seed (benchmarks/dlrmv4/data.py), for smokes only."""
    source: str = field("synthetic", choices=("synthetic", "yambda"))
    data_dir: str = field("", doc="yambda: the flat cache (flat_*.npy, user_start/end, positions_L<history>.npy)")
    metadata_dir: str = field("", doc="yambda: folder of artist_item_mapping.parquet and album_item_mapping.parquet")
    cache_files: str = field("*", doc="yambda: the files of data_dir that `data verify` checks against the "
                             "reference's list of the cache (all of them)")
    metadata_files: str = field("*_item_mapping.parquet", doc="yambda: the files of metadata_dir that `data "
                                "verify` checks (the two maps the reader opens)")
    train_windows: int = field(299, min=1, doc="yambda: train on day windows 0..this-1, once, in order")
    eval_window: int = field(299, min=0, doc="yambda: the day window scored at every eval")
    train_samples: int = field(0, min=0, doc="samples in the one pass (MLPerf train_samples; closed "
                               "2,290,835,423); 0 = counted from the cache, or synthetic_train_samples")
    eval_samples: int = field(0, min=0, doc="samples scored per eval (closed 2,058,204); 0 = counted from the "
                              "eval window, or synthetic_eval_samples")
    eval_every_samples: int = field(0, min=0, doc="eval every this many training samples, from the first "
                                    "multiple (0 = the 6.1.0 checker's grid and first eval)")
    synthetic_train_samples: int = field(4096, min=1)
    synthetic_eval_samples: int = field(512, min=1)
    synthetic_seed: int = field(0, doc="synthetic: fixes the task")
    synthetic_min_history: int = field(1, min=1, doc="synthetic: shortest history (= model.history_length "
                                       "makes every sample as long, so N is the same on any split of a batch)")
    synthetic_genres: int = field(2, min=2, doc="synthetic: a sample is positive when its candidate's genre "
                                  "(item mod genres) is its user's (uid mod genres), whose history mostly holds")


@dataclasses.dataclass
class OptimizerConfig:
    """One learning rate for Adam on the dense weights and row-wise Adagrad on the tables: linear warmup from 0
    over warmup_steps, then constant (train/gin/yambda_5b.gin). The betas, epsilons and the dense clip are the
    reference's and fixed (benchmarks/dlrmv4/training.py)."""
    base_learning_rate: float = field(1e-6, min=0.0, doc="closed: within [0.5, 1.5] x 1e-6 x GBS / 8192")
    warmup_steps: int = field(24000, min=0, doc="closed: 24,000")
