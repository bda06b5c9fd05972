"""DeepSeek-V3 671B continued pre-training (MLPerf deepseekv3_671b, rulesets 6.0.0 and 6.1.0) as a workload.

The decoder LMs' common workload (benchmarks/lm/workload.py: AdamW with cosine-with-linear-warmup, token
cross-entropy, eval log perplexity, LOWER is better), target 3.6, on the DeepSeek-V3 model (model.py: MLA,
dense-first layers, the group-limited sigmoid MoE with a shared expert), started from a Hugging Face
`DeepseekV3ForCausalLM` checkpoint (`model.init_checkpoint`, hf_names.py), plus the MoE's sequence-level
balance loss (model.seq_aux_loss_coef) and the aux-loss-free expert-bias update (model.bias_update_rate):
each training forward's routing counts leave the loss with it, are summed over micro-batches and replicas,
and move every MoE layer's float32 expert bias by rate * sign(mean - count) once per step, after the
gradients are complete and before the optimizer (the reference's finalize_model_grads); eval counts nothing.
With multi-token prediction on (model.mtp_layers, the reference's depth 1) the training loss adds
model.mtp_loss_weight x the MTP head's mean cross-entropy on the token after next (every position but the
last); the eval metric is the main head's alone.

Closed (`validate_closed`) is the reference's run: rows of 4096 tokens, 1024 eval rows, GBS >= 15360 with the
learning rate on the rules' square-root line, the fixed optimizer, the MoE losses and MTP, the MLCommons
checkpoint, and an eval after every step from the step the run's rulesets allow (`closed_first_eval_steps`:
6.1.0's floor(42 + 24576 / gbs), 6.0.0's any step up to that; harness/benchmark_rules.py holds the cadence).
The decay AdamW applies may differ from the logged one (optimizer.applied_weight_decay: the reference logs
0.1 and applies 0.033).
"""
from __future__ import annotations

import math
import threading
from typing import Any

import tensorflow as tf

from harness import benchmark_rules as rules
from harness.errors import HarnessError
from harness.nn import cross_entropy
from harness.nn.cross_entropy import token_cross_entropy
from harness.nn.hf_checkpoint import Format
from harness.train.reference import ReferenceModel, lookup
from harness.train.workload import EvalSchedule, LossTerm, sample_schedule

from benchmarks.deepseekv3_671b import config, hf_names
from benchmarks.deepseekv3_671b.model import DeepseekV3
from benchmarks.deepseekv3_671b.moe import DeepseekMoE
from benchmarks.lm.moe_dispatch import DROPPED_METRIC, expert_capacity
from benchmarks.lm.workload import DecoderLMWorkload

# DeepSeek-V3 as the reference builds it from the checkpoint's config.json (spec sections 1.1-1.4).
REFERENCE_MODEL = ReferenceModel("DeepSeek-V3 671B", {
    "model.vocab_size": 129280, "model.hidden_size": 7168, "model.num_layers": 61, "model.num_heads": 128,
    "model.q_lora_rank": 1536, "model.kv_lora_rank": 512, "model.qk_nope_head_dim": 128,
    "model.qk_rope_head_dim": 64, "model.v_head_dim": 128, "model.rope_base": 10000.0,
    "model.rope_scaling_factor": 40.0, "model.rope_original_context": 4096, "model.rope_mscale": 1.0,
    "model.rope_mscale_all_dim": 1.0, "model.ffn_hidden": 18432, "model.first_dense_layers": 3,
    "model.num_experts": 256, "model.experts_per_token": 8, "model.expert_hidden": 2048,
    "model.shared_experts": 1, "model.expert_groups": 8, "model.groups_per_token": 4,
    "model.routed_scaling_factor": 2.5, "model.seq_aux_loss_coef": 0.01, "model.norm_epsilon": 1e-6})

# The closed division: the checker's bounds (closed_deepseekv3_671b.yaml) and the reference's learning rate
# rule, 2.4e-5 x sqrt(gbs / 16384) within 1e-9 (spec sections 4.1-4.3).
CLOSED_MIN_BATCH, CLOSED_SEQ_LENGTH, CLOSED_EVAL_SAMPLES = 15360, 4096, 1024
LR_AT_16384, LR_TOLERANCE = 2.4e-5, 1e-9
# What the checker (optimizer keys, moe_aux_loss_coeff) and the reference (MTP, the bias update) fix.
CLOSED_FIXED = (("optimizer.warmup_steps", 4), ("optimizer.max_steps", 12000), ("optimizer.beta_1", 0.9),
                ("optimizer.beta_2", 0.95), ("optimizer.epsilon", 1e-8), ("optimizer.weight_decay", 0.1),
                ("optimizer.clip_norm", 1.0), ("model.seq_aux_loss_coef", 0.01), ("model.mtp_layers", 1),
                ("model.mtp_loss_weight", 0.1), ("model.bias_update_rate", 1e-3))
# The decay the reference's scheduler applies on every step, whatever the optimizer (and the log) says.
CLOSED_APPLIED_DECAY = 0.033


def within(graph: Any, outer: Any) -> bool:
    """Whether `graph` is `outer` or nested in it: float16's loss scaling applies the gradients in a
    conditional branch (a graph of its own) of the step that traced the forwards."""
    while graph is not None:
        if graph is outer:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def closed_learning_rate(global_batch: int) -> float:
    """The rules' peak learning rate at `global_batch`: 2.4e-5 x sqrt(gbs / 16384)."""
    return LR_AT_16384 * math.sqrt(global_batch / 16384)


class DeepseekV3Workload(DecoderLMWorkload):
    NAME = "deepseekv3_671b"
    MLPERF_KEY = "deepseekv3_671b"
    RULESETS = ("6.0.0", "6.1.0")
    RULESET_NOTE = "deepseekv3_671b is a benchmark from MLPerf Training 6.0 on"
    SECTIONS = {"data": config.DataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig}
    EOD_MASK_LOSS = False  # the reference scores every position (eod_mask_loss False)
    REFERENCE_MODEL = REFERENCE_MODEL
    # What the checker binds in both divisions (spec section 0): no CPU-size run passes, so a failing log is
    # re-checked with these values and the harness says whether only they failed.
    SIZE_BOUND = {"global_batch_size": 15360, "max_sequence_length": 4096, "eval_samples": 1024}
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

    # ------------------------------------------------------------------------------------ schedule
    @property
    def eval_every_samples(self) -> int:
        return self.cfg.data.eval_every_samples or self.cfg.schedule.global_batch_size

    def closed_first_eval_steps(self) -> list[int]:
        """The steps a closed run's first eval may follow under every ruleset its log is checked against:
        [floor(42 + 24576 / gbs)] with 6.1.0 among them, 1 to that step under 6.0.0 alone."""
        c, gbs = self.cfg, self.cfg.schedule.global_batch_size
        allowed: set[int] | None = None
        for ruleset in [c.ruleset, *c.check_rulesets]:
            cadence = rules.cadence(self.MLPERF_KEY, ruleset, gbs)
            if cadence is None:
                continue
            steps = {round(p / gbs) for p in (cadence.first_choices or (cadence.first,))}
            allowed = steps if allowed is None else allowed & steps
        return sorted(allowed or {1})

    @property
    def first_eval_step(self) -> int:
        """data.first_eval_step, or by default closed the rules' first (the earliest every ruleset allows),
        open the first eval_every_samples mark."""
        d, gbs = self.cfg.data, self.cfg.schedule.global_batch_size
        if d.first_eval_step > 0:
            return d.first_eval_step
        if self.cfg.submission.division == "closed":
            return self.closed_first_eval_steps()[0]
        return max(1, math.ceil(self.eval_every_samples / gbs))

    def eval_schedule(self) -> EvalSchedule:
        """An eval after `first_eval_step`, then every `eval_every_samples` up to the budget (and at it)."""
        gbs = self.cfg.schedule.global_batch_size
        budget = max(1, math.ceil(self.cfg.schedule.max_epochs * self.train_samples / gbs - 1e-9)) * gbs
        first = self.first_eval_step * gbs
        marks = list(range(first, budget, self.eval_every_samples)) + [budget]
        return sample_schedule(marks, self.train_samples, gbs, None)

    # ---------------------------------------------------------------------------------- validation
    def validate_closed(self) -> None:
        """The reference's run (spec sections 3 and 4): each departure refused in one line."""
        c, d, gbs = self.cfg, self.cfg.data, self.cfg.schedule.global_batch_size
        fix = "; or set submission.division=open"
        if gbs < CLOSED_MIN_BATCH:
            raise HarnessError(f"closed {self.NAME} needs schedule.global_batch_size >= {CLOSED_MIN_BATCH} (the "
                               f"checker's bound; got {gbs}){fix}")
        if d.seq_length != CLOSED_SEQ_LENGTH:
            raise HarnessError(f"closed {self.NAME} trains on rows of {CLOSED_SEQ_LENGTH} tokens (got "
                               f"data.seq_length={d.seq_length}){fix}")
        if d.eval_samples != CLOSED_EVAL_SAMPLES:
            raise HarnessError(f"closed {self.NAME} scores {CLOSED_EVAL_SAMPLES} eval rows (got "
                               f"data.eval_samples={d.eval_samples}){fix}")
        if d.source != "indexed":
            raise HarnessError(f"closed {self.NAME} trains on the reference's C4 .bin/.idx files: set "
                               f"data.source=indexed (got {d.source}){fix}")
        if d.eval_every_samples not in (0, gbs):
            raise HarnessError(f"closed {self.NAME} evaluates after every step: set data.eval_every_samples=0 "
                               f"(got {d.eval_every_samples}){fix}")
        allowed = self.closed_first_eval_steps()
        if d.first_eval_step > 0 and d.first_eval_step not in allowed:
            where = f"step {allowed[0]}" if len(allowed) == 1 else f"a step from {allowed[0]} to {allowed[-1]}"
            raise HarnessError(f"closed {self.NAME} at global batch {gbs} evaluates first after {where} under "
                               f"rulesets {', '.join([c.ruleset, *c.check_rulesets])} (6.1.0: floor(42 + 24576 / "
                               f"gbs)): set data.first_eval_step=-1 (got {d.first_eval_step}){fix}")
        lr, want = c.optimizer.base_learning_rate, closed_learning_rate(gbs)
        if abs(lr - want) >= LR_TOLERANCE:
            raise HarnessError(f"closed {self.NAME}: optimizer.base_learning_rate must be 2.4e-5 x sqrt("
                               f"global_batch_size / 16384) = {want:.9f} at global batch {gbs}, within "
                               f"{LR_TOLERANCE:g} (got {lr:g}){fix}")
        for key, value in CLOSED_FIXED:
            if not math.isclose(lookup(c, key), value, rel_tol=1e-9, abs_tol=0.0):
                raise HarnessError(f"closed {self.NAME}: the reference fixes {key}={value:g} (got "
                                   f"{lookup(c, key):g}){fix}")
        if not math.isclose(c.optimizer.applied_decay(), CLOSED_APPLIED_DECAY, rel_tol=1e-9, abs_tol=0.0):
            raise HarnessError(f"closed {self.NAME}: the reference's scheduler applies a weight decay of "
                               f"{CLOSED_APPLIED_DECAY:g} on every step: set optimizer.applied_weight_decay="
                               f"{CLOSED_APPLIED_DECAY:g} (it applies {c.optimizer.applied_decay():g}){fix}")
        if not c.model.init_checkpoint:
            raise HarnessError(f"closed {self.NAME} continues pre-training from the MLCommons DeepSeek-V3 "
                               f"checkpoint: set model.init_checkpoint to its Hugging Face directory{fix}")

    def validate_model(self) -> None:
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

    def __init__(self, cfg, runtime) -> None:
        super().__init__(cfg, runtime)
        # Each training forward's routing counts [moe layers, experts], until the step's process_gradients
        # reads them: per thread (a mirrored runtime traces each replica in a thread of its own) and tagged
        # with their graph (a loss traced on its own leaves nothing for a later step's trace).
        self._counts = threading.local()

    def make_model(self) -> DeepseekV3:
        return DeepseekV3(self.runtime, self.cfg.seed, self.cfg.model, self.cfg.data.seq_length)

    def build(self) -> None:
        super().build()
        # read when the update is traced: the decay applied, whatever opt_adamw_weight_decay logs
        self.optimizer.weight_decay = self.cfg.optimizer.applied_decay()

    def expert_biases(self) -> list[tf.Variable]:
        """The MoE layers' expert biases, in layer order (the MTP layer's last)."""
        layers = self.model.layers + ([self.model.mtp.layer] if self.model.mtp is not None else [])
        return [layer.ffn.expert_bias for layer in layers if isinstance(layer.ffn, DeepseekMoE)]

    def _pending(self) -> list[tuple[Any, tf.Tensor]]:
        if not hasattr(self._counts, "pending"):
            self._counts.pending = []
        return self._counts.pending

    def process_gradients(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        """The clip, and the expert-bias update from the counts of this step's training forwards."""
        grads = super().process_gradients(grads)
        graph = tf.compat.v1.get_default_graph()
        counts = [c for g, c in self._pending() if within(graph, g)]
        self._pending().clear()
        rate = self.cfg.model.bias_update_rate
        if counts and rate:
            total = self.runtime.replica_all_sum(tf.add_n(counts), self.runtime.num_replicas)
            for bias, n in zip(self.expert_biases(), tf.unstack(total)):
                bias.assign_add(rate * tf.sign(tf.reduce_mean(n) - n))
        return grads

    def _xent(self, hidden: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
        scale = self.loss_budget_scale
        return token_cross_entropy(self.runtime, hidden, self.model.head(), targets,
                                   budget=max(1, int(cross_entropy.BLOCK_ELEMENTS * scale)),
                                   keep=int(cross_entropy.KEEP_ELEMENTS * scale))

    def token_losses(self, tokens: tf.Tensor):
        """The main head's cross-entropy per position [b, s] and weights (every position scored); the extras
        are (each layer's routing, then the MTP layer's; the MTP head's cross-entropy [b, s - 1] on the token
        after next, or None)."""
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        hidden, routings = self.model(inputs)
        xent = self._xent(hidden, targets)
        mtp_xent = None
        if self.model.mtp is not None:
            # Position i's next input token is targets[i]; its MTP target, targets[i + 1]. The last position
            # has none (the reference rolls in token 0 there and masks it: causal, so the rest agree).
            mtp_hidden, routing = self.model.mtp(hidden, targets)
            routings = list(routings) + [routing]
            mtp_xent = self._xent(mtp_hidden[:, :-1], targets[:, 1:])
        return xent, tf.ones_like(xent), (routings, mtp_xent)

    def extra_losses(self, extras) -> dict[str, LossTerm]:
        """The MTP loss (its weight x its mean over positions) and the sequence-level balance loss when their
        weights are on: each MoE layer's mean over rows, summed over the layers (MTP's too), times the
        coefficient. Keeps the routing counts for the bias update (training forwards alone reach here:
        eval_step does not)."""
        m = self.cfg.model
        routings, mtp_xent = extras
        moe = [r for r in routings if r is not None]
        terms = {}
        if mtp_xent is not None and m.mtp_loss_weight:
            terms["mtp"] = LossTerm(m.mtp_loss_weight * tf.reduce_sum(mtp_xent),
                                    tf.constant(float(mtp_xent.shape[0] * mtp_xent.shape[1])))
        if moe:
            self._pending().append((tf.compat.v1.get_default_graph(), tf.stack([r.counts for r in moe])))
        if m.seq_aux_loss_coef and moe:
            terms["seq_aux"] = LossTerm(m.seq_aux_loss_coef * tf.add_n([r.seq_aux for r in moe]),
                                        tf.constant(float(moe[0].rows)))
        return terms

    def extra_eval_sums(self, extras, mask: tf.Tensor) -> dict[str, tf.Tensor]:
        """Health metric (ST-MoE): expert assignments dropped for capacity (model.capacity_factor), real rows
        only, and the assignments routed, over the MoE layers (MTP's included)."""
        moe = [r for r in extras[0] if r is not None]
        if not moe:
            return {}
        per_row = float(self.cfg.data.seq_length * self.cfg.model.experts_per_token * len(moe))
        return {"dropped": tf.add_n([tf.reduce_sum(r.dropped * mask) for r in moe]),
                "assigned": per_row * tf.reduce_sum(mask)}

    def extra_eval_metrics(self, state: dict[str, float]) -> dict[str, float]:
        if "dropped" not in state:
            return {}
        return {DROPPED_METRIC: state["dropped"] / max(state["assigned"], 1.0)}

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
    the experts' devices and receives back, from the config (spec section 5.2's estimate)."""
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
