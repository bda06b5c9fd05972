"""DeepSeek-V3 671B continued pre-training (MLPerf deepseekv3_671b, rulesets 6.0.0 and 6.1.0) as a workload.

The decoder LMs' common workload (benchmarks/lm/workload.py: AdamW with cosine-with-linear-warmup, token
cross-entropy, eval log perplexity, LOWER is better), target 3.6, on the DeepSeek-V3 model (model.py: MLA,
dense-first layers, the group-limited sigmoid MoE with a shared expert), started from a Hugging Face
`DeepseekV3ForCausalLM` checkpoint (`model.init_checkpoint`, hf_names.py), plus the MoE's sequence-level
balance loss (model.seq_aux_loss_coef) and the aux-loss-free expert-bias update (model.bias_update_rate):
each training forward's routing counts leave the loss as a step statistic, which the loop sums over
micro-batches and replicas, and move every MoE layer's float32 expert bias by rate * sign(mean - count) once
per step, after the gradients are complete and before the optimizer (the reference's finalize_model_grads);
eval counts nothing.
With multi-token prediction on (model.mtp_layers, the reference's depth 1) the training loss adds
model.mtp_loss_weight x the MTP head's mean cross-entropy on the token after next (every position but the
last); the eval metric is the main head's alone.

Closed is the reference's run, its rules record in benchmarks/deepseekv3_671b/rules.py (with the eval cadence
`plan` reads too). The decay AdamW applies may differ from the logged one (optimizer.applied_weight_decay: the
reference logs 0.1 and applies 0.033).
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from harness.errors import HarnessError
from harness.nn.hf_checkpoint import Format
from harness.train.reference import ReferenceModel
from harness.train.workload import LossTerm

from benchmarks.deepseekv3_671b import config, hf_names, rules
from benchmarks.deepseekv3_671b.model import DeepseekV3
from benchmarks.deepseekv3_671b.moe import DeepseekMoE
from benchmarks.lm.moe_capacity import expert_capacity
from benchmarks.lm.workload import MOE_TOTALS, DecoderLMWorkload

# DeepSeek-V3 as the reference builds it from the checkpoint's config.json (docs/workloads/deepseekv3_671b.md, Sources).
REFERENCE_MODEL = ReferenceModel("DeepSeek-V3 671B", {
    "model.vocab_size": 129280, "model.hidden_size": 7168, "model.num_layers": 61, "model.num_heads": 128,
    "model.q_lora_rank": 1536, "model.kv_lora_rank": 512, "model.qk_nope_head_dim": 128,
    "model.qk_rope_head_dim": 64, "model.v_head_dim": 128, "model.rope_base": 10000.0,
    "model.rope_scaling_factor": 40.0, "model.rope_original_context": 4096, "model.rope_mscale": 1.0,
    "model.rope_mscale_all_dim": 1.0, "model.ffn_hidden": 18432, "model.first_dense_layers": 3,
    "model.num_experts": 256, "model.experts_per_token": 8, "model.expert_hidden": 2048,
    "model.shared_experts": 1, "model.expert_groups": 8, "model.groups_per_token": 4,
    "model.routed_scaling_factor": 2.5, "model.seq_aux_loss_coef": 0.01, "model.norm_epsilon": 1e-6})


class DeepseekV3Workload(DecoderLMWorkload):
    NAME = "deepseekv3_671b"
    MLPERF_KEY = "deepseekv3_671b"
    RULESETS = ("6.0.0", "6.1.0")
    RULESET_NOTE = "deepseekv3_671b is a benchmark from MLPerf Training 6.0 on"
    SECTIONS = {"data": config.DataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig}
    RULES = rules.RULES
    EOD_MASK_LOSS = False  # the reference scores every position (eod_mask_loss False)
    REFERENCE_MODEL = REFERENCE_MODEL
    STEP_TOTALS = MOE_TOTALS
    # The dry run of the full model compiles 1-2 layers, 0-1 of them dense, with or without MTP, at small
    # vocabularies (what this host holds) and extrapolates: each count adds its layers' share; MTP's head and
    # loss also grow with the vocabulary (the pair).
    DRY_RUN_LINEAR = {"model.num_layers": (1, 2), "model.first_dense_layers": (0, 1), "model.mtp_layers": (0, 1),
                      "model.vocab_size": (512, 1024)}
    DRY_RUN_PAIRS = (("model.mtp_layers", "model.vocab_size"),)
    SPLIT_DIMS = {**DecoderLMWorkload.SPLIT_DIMS, "model.num_experts": "experts", "model.expert_hidden": "ff",
                  "model.ffn_hidden": "ff"}
    HF_FORMAT = Format(hf_names.layout, hf_names.config_problems,
                       lambda cfg, dtype: hf_names.hf_config(cfg.model, cfg.data.seq_length, dtype))

    # ------------------------------------------------------------------------------ model choices
    def validate_model(self) -> None:
        super().validate_model()
        m = self.cfg.model
        if m.num_kv_heads != m.num_heads:
            raise HarnessError(f"model.num_kv_heads={m.num_kv_heads} must equal model.num_heads={m.num_heads} "
                               f"(MLA: every head has its own keys and values)")
        if m.qk_rope_head_dim % 2:
            raise HarnessError(f"model.qk_rope_head_dim={m.qk_rope_head_dim} must be even (RoPE turns pairs)")
        if m.num_experts % m.expert_groups:
            raise HarnessError(f"model.num_experts={m.num_experts} is not a multiple of model.expert_groups="
                               f"{m.expert_groups}")
        if m.groups_per_token > m.expert_groups:
            raise HarnessError(f"model.groups_per_token={m.groups_per_token} exceeds model.expert_groups="
                               f"{m.expert_groups}")
        per_group = m.num_experts // m.expert_groups
        if m.experts_per_token > m.groups_per_token * per_group:
            raise HarnessError(f"model.experts_per_token={m.experts_per_token} exceeds the experts of "
                               f"model.groups_per_token={m.groups_per_token} groups ({m.groups_per_token * per_group})")
        if m.group_score_top() > per_group:
            raise HarnessError(f"a group is scored by its top {m.group_score_top()} experts (model.group_score_experts"
                               f"={m.group_score_experts}), more than its {per_group}")
        if m.capacity_factor and m.moe_dispatch != "alltoall":
            raise HarnessError(f"model.capacity_factor={m.capacity_factor} needs model.moe_dispatch=alltoall (the "
                               f"{m.moe_dispatch} dispatch computes every expert on every token: it never drops)")

    def make_model(self) -> DeepseekV3:
        return DeepseekV3(self.runtime, self.cfg.seed, self.cfg.model, self.cfg.data.seq_length)

    def expert_biases(self) -> list[tf.Variable]:
        """The MoE layers' expert biases, in layer order (the MTP layer's last)."""
        layers = self.model.layers + ([self.model.mtp.layer] if self.model.mtp is not None else [])
        return [layer.ffn.expert_bias for layer in layers if isinstance(layer.ffn, DeepseekMoE)]

    def forward(self, inputs: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor | None) -> tuple[tf.Tensor, Any]:
        """The main model's hidden states; extras: (each layer's routing, then the MTP layer's; the MTP block's
        hidden states, or None). Position i's next input token is targets[i]; its MTP target, targets[i + 1]."""
        hidden, routings = self.model(inputs)
        mtp_hidden = None
        if self.model.mtp is not None:
            mtp_hidden, routing = self.model.mtp(hidden, targets)
            routings = list(routings) + [routing]
        return hidden, (routings, mtp_hidden)

    def mtp_xent(self, extras: Any, targets: tf.Tensor) -> tf.Tensor | None:
        """The MTP head's cross-entropy [b, s - 1] on the token after next: every position but the last (the
        reference rolls in token 0 there and masks it: causal, so the rest agree); None without MTP."""
        mtp_hidden = extras[1]
        return None if mtp_hidden is None else self.xent(mtp_hidden[:, :-1], targets[:, 1:])

    def routings(self, extras: Any) -> list[Any]:
        return [r for r in extras[0] if r is not None]

    def extra_losses(self, extras: Any, targets: tf.Tensor) -> dict[str, LossTerm]:
        """The MTP loss (its weight x its mean over positions) and the sequence-level balance loss when their
        weights are on: each MoE layer's mean over rows, summed over the layers (MTP's too), times the
        coefficient."""
        m, moe, terms = self.cfg.model, self.routings(extras), {}
        mtp_xent = self.mtp_xent(extras, targets)
        if mtp_xent is not None and m.mtp_loss_weight:
            terms["mtp"] = LossTerm(m.mtp_loss_weight * tf.reduce_sum(mtp_xent),
                                    tf.constant(float(mtp_xent.shape[0] * mtp_xent.shape[1])))
        if m.seq_aux_loss_coef and moe:
            terms["seq_aux"] = LossTerm(m.seq_aux_loss_coef * tf.add_n([r.seq_aux for r in moe]),
                                        tf.constant(float(moe[0].rows)))
        return terms

    def model_stats(self, extras: Any) -> dict[str, tf.Tensor]:
        """Each MoE layer's routing counts [moe layers, experts] of this forward, for the bias update."""
        moe = self.routings(extras)
        return {"expert_counts": tf.stack([r.counts for r in moe])} if moe else {}

    def model_updates(self, stats: dict[str, tf.Tensor]) -> None:
        """Every MoE layer's expert bias moves by rate * sign(mean - count) over the step's counts."""
        rate = self.cfg.model.bias_update_rate
        if "expert_counts" in stats and rate:
            for bias, n in zip(self.expert_biases(), tf.unstack(stats["expert_counts"])):
                bias.assign_add(rate * tf.sign(tf.reduce_mean(n) - n))

    def experts_stay_put(self) -> bool:
        return self.cfg.model.moe_dispatch == "alltoall"

    def dry_run_notes(self) -> list[str]:
        return expert_traffic_notes(self.cfg, self.runtime)

    def extra_hparams(self) -> dict[str, Any]:
        """Expert parallelism as computed: the alltoall dispatch sends tokens to the devices of their experts
        (the layout's split); the dense one computes every expert on every device (1: the split is storage).
        The capacity factor when one can drop, the sequence balance loss's coefficient (the checker wants it, 0
        included), the checkpoint's step (the reference loads step 0: no optimizer state, the schedule from its
        start) and, not an MLPerf key, the decay applied where it differs from opt_adamw_weight_decay."""
        m, o = self.cfg.model, self.cfg.optimizer
        keys: dict[str, Any] = {
            "expert_parallelism": self.runtime.shards("experts") if m.moe_dispatch == "alltoall" else 1}
        if m.capacity_factor:
            keys["moe_expert_capacity_factor"] = m.capacity_factor
        keys["moe_aux_loss_coeff"] = m.seq_aux_loss_coef
        keys["init_checkpoint_step"] = 0
        if o.applied_decay() != o.weight_decay:
            keys["harness_applied_weight_decay"] = o.applied_decay()
        return keys


def expert_traffic_notes(cfg, runtime) -> list[str]:
    """What the dry run's one device cannot show of the all-to-all dispatch: the bytes each device sends to
    the experts' devices and receives back, from the config (the estimate of docs/workloads/deepseekv3_671b.md)."""
    m, schedule = cfg.model, cfg.schedule
    ep = runtime.shards("experts")
    if m.moe_dispatch != "alltoall" or ep <= 1:
        return []
    seq, k = cfg.data.seq_length, m.experts_per_token
    size = {"float32": 4}.get(cfg.runtime.precision, 2)
    rows = schedule.global_batch_size // runtime.num_replicas // max(1, schedule.gradient_accumulation_steps)
    useful = rows * seq * k * m.hidden_size * size                          # each way, dropless average
    capacity = expert_capacity(seq, m.num_experts, k, m.capacity_factor)
    buffer = rows * m.num_experts * capacity * m.hidden_size * size         # each way, the static slots
    layers = max(0, m.num_layers - m.first_dense_layers) + m.mtp_layers
    micro = max(1, schedule.gradient_accumulation_steps)
    passes = 3 if m.remat else 2  # forward, backward, and the forward again where layers are recomputed
    gb = lambda n: f"{n / 1e9:.3f} GB"  # noqa: E731
    per_step = 2 * layers * micro * passes / 1e12  # TB per byte sent each way per layer and micro-batch
    return [f"all-to-all over the {ep} devices splitting the experts (not compiled here: on one device it is a "
            f"transpose of its own slots): per MoE layer and micro-batch of {rows} row(s) a device sends "
            f"{gb(useful)} (its {rows * seq} tokens x {k} experts x {m.hidden_size} values, the dropless average) "
            f"and receives as much back, {gb(2 * useful)} in all, forward; the static slot buffer it sends is "
            f"{gb(buffer)} each way ({m.num_experts} experts x {capacity} slots, capacity factor "
            f"{m.capacity_factor or 'dropless'}); {layers} MoE layers x {micro} micro-batches x {passes} passes "
            f"(forward, backward{', recompute' if m.remat else ''}) = {useful * per_step:.2f} TB per device per "
            f"step by the average ({buffer * per_step:.2f} TB of slots)"]
