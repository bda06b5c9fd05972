"""Llama 2 70B LoRA fine-tuning (MLPerf llama2_70b_lora, rulesets 4.0.0-6.1.0: one closed checker file, the
target eval loss <= 0.925): the decoder LMs' workload and stack (benchmarks/lm/) with the Llama block and
LoRA adapters on every layer's fused q/k/v and output projections (benchmarks/lm/attention.py `Lora`).

The base starts from a Hugging Face checkpoint (`model.init_checkpoint`, fused or separate q/k/v) and is
frozen: its variables are created non-trainable (Runtime.frozen), so the loop takes no gradient of them,
AdamW keeps no slots for them and nothing reduces them; FSDP still splits them and gathers them for use.
Rows come pre-packed (input_ids, labels with -100 where not scored); the model reads the whole row and the
logits at position j score labels[j + 1]. The rules (benchmarks/llama2_70b_lora/rules.py): training loss and
eval metric are the reference's, the mean cross-entropy over each row's scored tokens, then the mean over rows
(not over tokens); evals every ceil(384 / GBS) * GBS samples, the first floor(0.125 * GBS + 2) skipped (not
run, not logged); the run's length is optimizer.max_steps.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from harness.nn.hf_checkpoint import Format
from harness.train.reference import ReferenceModel

from benchmarks.llama2_70b_lora import config, peft_format, rules
from benchmarks.llama2_70b_lora.data import IGNORE, LoraData
from benchmarks.llama2_70b_lora.data_config import LoraDataConfig
from benchmarks.lm import hf_names
from benchmarks.lm.attention import Lora
from benchmarks.lm.llama import LLAMA_SPLIT_DIMS, Llama
from benchmarks.lm.workload import DecoderLMWorkload

# Llama 2 70B as the MLPerf reference fine-tunes it (regisss/llama2-70b-fused-qkv-mlperf).
REFERENCE_MODEL = ReferenceModel("Llama 2 70B", {
    "model.vocab_size": 32000, "model.hidden_size": 8192, "model.num_layers": 80, "model.num_heads": 64,
    "model.num_kv_heads": 8, "model.head_dim": 128, "model.ffn_hidden": 28672, "model.rope_base": 10000,
    "model.rope_scaling_factor": 0.0, "model.norm_epsilon": 1e-5, "model.lora_rank": 16})


class LoraWorkload(DecoderLMWorkload):
    NAME = "llama2_70b_lora"
    MLPERF_KEY = "llama2_70b_lora"
    RULESETS = ("4.0.0", "4.1.0", "5.0.0", "5.1.0", "6.0.0", "6.1.0")
    RULESET_NOTE = "llama2_70b_lora is a benchmark from MLPerf Training 4.0 on"
    SECTIONS = {"data": LoraDataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig}
    RULES = rules.RULES
    REFERENCE_MODEL = REFERENCE_MODEL
    # The dry run compiles 2 and 3 layers, SwiGLU widths of 1024 and 2048 and vocabularies of 512 and 1024
    # at full hidden size and extrapolates (harness.dryrun.extrapolate.linear_stand_in): two full 70B layers' weights
    # (1.7B parameters) are more than this host holds while they are split onto the mesh. Not 1 and 2: with
    # one layer XLA schedules its recompute otherwise, so the second layer's step looked like 514 MiB kept
    # per layer where the third adds 33 (its bfloat16 input; hidden 8192, rows of 2048, measured).
    DRY_RUN_LINEAR = {"model.num_layers": (2, 3), "model.ffn_hidden": (1024, 2048), "model.vocab_size": (512, 1024)}
    DRY_RUN_PAIRS = (("model.num_layers", "model.ffn_hidden"),)
    SPLIT_DIMS = {**DecoderLMWorkload.SPLIT_DIMS, **LLAMA_SPLIT_DIMS}
    HF_FORMAT = Format(hf_names.llama_layout, hf_names.llama_config_problems,
                       lambda cfg, dtype: hf_names.llama_config(cfg.model, cfg.data.seq_length, dtype))
    PEFT_FORMAT = peft_format  # export writes the adapters as PEFT does (harness/export/weights.py)

    # ------------------------------------------------------------------------------- data choices
    def make_source(self) -> LoraData:
        return LoraData(self.cfg.data, self.cfg.data.seq_length, self.cfg.model.vocab_size)

    def scored_rows(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The whole row in; position j's target is labels[j + 1] (the last position's, none: 0, not scored)."""
        ids, labels = batch["input_ids"], batch["labels"]
        targets = tf.concat([tf.maximum(labels[:, 1:], 0), tf.zeros_like(labels[:, :1])], 1)
        return ids, targets, tf.cast(tf.not_equal(labels[:, 1:], IGNORE), tf.float32)

    # ------------------------------------------------------------------------------ model choices
    def validate_model(self) -> None:
        super().validate_model()
        self.cfg.model.validate()

    def frozen_dtype(self, path: str) -> tf.DType | None:
        """The storage dtype of a frozen base weight (norm weights float32), None for an adapter."""
        if "/lora_" in path:
            return None
        if "norm" in path.rsplit("/", 2)[-2]:
            return tf.float32
        return tf.bfloat16 if self.cfg.model.frozen_dtype == "bfloat16" else tf.float32

    def make_model(self) -> Llama:
        m = self.cfg.model
        self.lora = Lora(m.lora_rank, m.lora_alpha, m.lora_dropout)
        with self.runtime.frozen(self.frozen_dtype):
            return Llama(self.runtime, "llama", self.cfg.seed, m, self.cfg.data.seq_length, lora=self.lora)

    def forward(self, inputs: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor | None) -> tuple[tf.Tensor, Any]:
        """The adapters' dropout draws from `seed` (None: none); a recomputed layer keeps its own (decoder
        `remat`)."""
        with self.lora.seeded(seed):
            return self.model(inputs)

    def dry_run_notes(self) -> list[str]:
        if self.cfg.model.frozen_dtype != "bfloat16":
            return []
        return ["frozen bfloat16 base: XLA:CPU computes a bfloat16 dot in float32, so its plan holds float32 "
                "copies of the weights of the layer it computes (made per layer, after the layer's input; none "
                "held across layers), where a GPU or TPU reads them in bfloat16: the activation estimate is high "
                "by up to one layer's weights in float32 (kept, not subtracted)"]

    def extra_hparams(self) -> dict[str, Any]:
        """A frozen bfloat16 base computes its linear layers in bfloat16 whatever the run's precision; the
        adapters keep no experts. Values legal in 6.0.0 too."""
        keys: dict[str, Any] = {"expert_parallelism": 1}
        if self.cfg.model.frozen_dtype == "bfloat16":
            keys["lowest_numerical_precision_in_linear"] = "bfloat16"
        return keys
