"""GPT-OSS 20B pretraining (MLPerf gpt_oss_20b, rulesets 6.0.0 and 6.1.0) as a workload.

The decoder benchmarks' mechanism (benchmarks/lm/workload.py: AdamW with cosine-with-linear-warmup, token
cross-entropy, eval log perplexity, LOWER is better) under the pretraining rules (benchmarks/lm/rules.py),
target 3.34, plus the MoE's optional router losses (load balancing, z-loss), the share of dropped expert
assignments in training and in every eval, and the router options in the log when they are on.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from harness.errors import HarnessError
from harness.nn.hf_checkpoint import Format
from harness.train.reference import ReferenceModel
from harness.train.workload import LossTerm

from benchmarks.gpt_oss_20b import config, hf_names
from benchmarks.gpt_oss_20b.model import GptOss
from benchmarks.lm.rules import PRETRAINING
from benchmarks.lm.workload import MOE_TOTALS, DecoderLMWorkload

# GPT-OSS 20B as the MLPerf reference implementation (Primus/Megatron, which produced the RCPs) builds it:
# dropless top-4 of 32 plain SwiGLU experts, q/k norm, a 129-key window, plain RoPE, none of the published
# architecture's sinks, biases or clamp, the router options beside the reference off.
REFERENCE_MODEL = ReferenceModel("GPT-OSS 20B", {
    "model.vocab_size": 128256, "model.hidden_size": 2880, "model.num_layers": 24, "model.num_heads": 64,
    "model.num_kv_heads": 8, "model.head_dim": 64, "model.rope_base": 150000, "model.sliding_window": 129,
    "model.num_experts": 32, "model.experts_per_token": 4, "model.expert_hidden": 2880,
    "model.capacity_factor": 0.0, "model.load_balancing_coef": 0.0, "model.router_z_loss_coef": 0.0,
    "model.qk_norm": True, "model.attention_sinks": False, "model.attention_bias": False,
    "model.router_bias": False, "model.expert_bias": False, "model.swiglu_alpha": 1.0, "model.swiglu_limit": 0.0,
    "model.swiglu_up_offset": 0.0, "model.rope_type": "default", "model.norm_epsilon": 1e-6,
    "model.init_stddev": 0.008, "model.output_init_stddev": 0.0})


class GptOssWorkload(DecoderLMWorkload):
    NAME = "gpt_oss_20b"
    MLPERF_KEY = "gpt_oss_20b"
    RULESETS = ("6.0.0", "6.1.0")
    RULESET_NOTE = "gpt_oss_20b is a benchmark from MLPerf Training 6.0 on"
    SECTIONS = {"data": config.DataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig}
    RULES = PRETRAINING
    REFERENCE_MODEL = REFERENCE_MODEL
    STEP_TOTALS = MOE_TOTALS
    # The dry run of a model too big for the host compiles 2 and 4 layers, expert hidden sizes of 8 and 16 and
    # vocabularies of 512 and 1024 at full width otherwise (all 32 experts), and extrapolates
    # (harness.dryrun.extrapolate.linear_stand_in). Every shape is static, so the compiled work and bytes are linear
    # in each: the routed rows and the sorted dispatch's padding blocks depend on the experts, which stay full.
    # Layers come in pairs (a sliding-window layer, then a full-attention one, whose scores dominate a layer's
    # transient memory): from 1 to 2 layers the plan's peak grows by a full-attention layer's transient, which
    # with model.remat is not kept per layer, so a slope over 1 -> 2 layers would multiply it by 23.
    # The expert weights are per layer: their effects multiply, so one more compile has both at the larger size.
    DRY_RUN_LINEAR = {"model.num_layers": (2, 4), "model.expert_hidden": (8, 16), "model.vocab_size": (512, 1024)}
    DRY_RUN_PAIRS = (("model.num_layers", "model.expert_hidden"),)
    SPLIT_DIMS = {**DecoderLMWorkload.SPLIT_DIMS, "model.num_experts": "experts", "model.expert_hidden": "ff"}
    HF_FORMAT = Format(hf_names.layout, hf_names.config_problems,
                       lambda cfg, dtype: hf_names.hf_config(cfg.model, cfg.data.seq_length, dtype))

    def validate_model(self) -> None:
        super().validate_model()
        m, d = self.cfg.model, self.cfg.data
        if m.experts_per_token > m.num_experts:
            raise HarnessError(f"model.experts_per_token={m.experts_per_token} exceeds model.num_experts="
                               f"{m.num_experts}")
        seq = d.seq_length
        group = min(m.moe_group_size, seq)
        if seq % group:
            raise HarnessError(f"data.seq_length={seq} is not a multiple of model.moe_group_size={group}")
        for window in {m.sliding_window, m.full_attention_span or seq}:
            blk = seq if window >= seq else min(m.attention_block, seq)
            if seq % blk:
                raise HarnessError(f"data.seq_length={seq} is not a multiple of model.attention_block={blk}")
        if m.full_attention_span and m.full_attention_span < seq:
            if not m.document_attention:
                raise HarnessError(f"model.full_attention_span={m.full_attention_span} is shorter than a row: "
                                   f"full attention is only exact within documents, so it needs "
                                   f"model.document_attention=true")
            if d.source != "synthetic" or d.synthetic_doc_max > m.full_attention_span:
                longest = d.synthetic_doc_max if d.source == "synthetic" else "unbounded (indexed data)"
                raise HarnessError(f"model.full_attention_span={m.full_attention_span} must cover the longest "
                                   f"document ({longest}); set it to 0 (the whole row) or at least that")

    def make_model(self) -> GptOss:
        c = self.cfg
        return GptOss(self.runtime, c.seed, c.model, c.data.seq_length, c.data.eod_id)

    def routings(self, extras: Any) -> list[Any]:
        return list(extras)

    def extra_losses(self, routings, targets: tf.Tensor) -> dict[str, LossTerm]:
        """With their coefficients on: the load-balancing loss (mean over routing groups, summed over
        layers) and the router z-loss (mean over tokens, summed over layers)."""
        m, terms = self.cfg.model, {}
        if m.load_balancing_coef:
            terms["load_balancing"] = LossTerm(m.load_balancing_coef * tf.add_n([r.balance_sum for r in routings]),
                                               tf.constant(float(routings[0].groups)))
        if m.router_z_loss_coef:
            terms["router_z"] = LossTerm(m.router_z_loss_coef * tf.add_n([r.z_sum for r in routings]),
                                         tf.constant(float(routings[0].tokens)))
        return terms

    def experts_stay_put(self) -> bool:
        """The alltoall dispatch (benchmarks/lm/moe_dispatch.py) sends tokens to their experts' devices and never
        gathers the experts' weights, as deepseekv3_671b's does."""
        return self.cfg.model.moe_dispatch == "alltoall"

    def extra_hparams(self) -> dict[str, Any]:
        """The router options that are on, and expert parallelism as computed: the sorted dispatch keeps tokens on
        their device and gathers the (data-split) expert weights where used, so every device computes every
        expert (1: the split is storage, as FSDP's); the dense and alltoall dispatches send tokens to the
        devices of their experts (the layout's split)."""
        m, keys = self.cfg.model, {}
        keys["expert_parallelism"] = (self.runtime.shards("experts") if m.moe_dispatch in ("dense", "alltoall")
                                   else 1)
        if m.capacity_factor:
            keys["moe_expert_capacity_factor"] = m.capacity_factor
        if m.load_balancing_coef:
            keys["moe_aux_loss_coeff"] = m.load_balancing_coef
        if m.router_z_loss_coef:
            keys["moe_z_loss_coeff"] = m.router_z_loss_coef
        return keys
