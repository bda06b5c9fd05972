"""Llama 3.1 8B pretraining (MLPerf llama31_8b, rulesets 5.1.0-6.1.0: one closed checker file, gpt_oss_20b's but
for the target 3.3; 6.1.0's disclosure keys logged in all three): the decoder LMs' workload and stack
(benchmarks/lm/) with the Llama block (benchmarks/lm/llama.py) as NeMo's `Llama31Config8B` sets them:
grouped-query attention with Llama 3.1's RoPE scaling, every position trained and scored."""
from __future__ import annotations

from harness.nn.hf_checkpoint import Format
from harness.train.reference import ReferenceModel

from benchmarks.llama31_8b import config
from benchmarks.lm import hf_names
from benchmarks.lm.llama import LLAMA_SPLIT_DIMS, Llama
from benchmarks.lm.rules import PRETRAINING
from benchmarks.lm.workload import DecoderLMWorkload

# Llama 3.1 8B as the MLPerf reference builds it (NeMo's Llama31Config8B).
REFERENCE_MODEL = ReferenceModel("Llama 3.1 8B", {
    "model.vocab_size": 128256, "model.hidden_size": 4096, "model.num_layers": 32, "model.num_heads": 32,
    "model.num_kv_heads": 8, "model.head_dim": 128, "model.ffn_hidden": 14336, "model.rope_base": 500000,
    "model.rope_scaling_factor": 8.0, "model.rope_low_freq_factor": 1.0, "model.rope_high_freq_factor": 4.0,
    "model.rope_original_context": 8192, "model.norm_epsilon": 1e-5, "model.init_stddev": 0.02,
    "model.output_init_stddev": 0.0})


class LlamaWorkload(DecoderLMWorkload):
    NAME = "llama31_8b"
    MLPERF_KEY = "llama31_8b"
    RULESETS = ("5.1.0", "6.0.0", "6.1.0")
    RULESET_NOTE = "llama31_8b is a benchmark from MLPerf Training 5.1 on"
    SECTIONS = {"data": config.DataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig}
    RULES = PRETRAINING
    EOD_MASK_LOSS = False  # the reference trains and scores every position (eod_mask_loss=False)
    REFERENCE_MODEL = REFERENCE_MODEL
    # The dry run of a model too big for the host compiles 1 and 2 layers and vocabularies of 512 and 1024
    # at full width and extrapolates (harness.dryrun.extrapolate.linear_stand_in).
    DRY_RUN_LINEAR = {"model.num_layers": (1, 2), "model.vocab_size": (512, 1024)}
    SPLIT_DIMS = {**DecoderLMWorkload.SPLIT_DIMS, **LLAMA_SPLIT_DIMS}
    HF_FORMAT = Format(hf_names.llama_layout, hf_names.llama_config_problems,
                       lambda cfg, dtype: hf_names.llama_config(cfg.model, cfg.data.seq_length, dtype))

    def validate_model(self) -> None:
        super().validate_model()
        self.cfg.model.validate()

    def make_model(self) -> Llama:
        return Llama(self.runtime, "llama", self.cfg.seed, self.cfg.model, self.cfg.data.seq_length)
