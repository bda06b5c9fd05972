"""MLPerf Training 6.1 qwen35_397b_grpo: RL post-training of Qwen3.5-397B-A17B (benchmarks/qwen35_397b_grpo/
model.py) by GRPO (grpo.py), rollouts sampled by the XLA generation engine (generate.py) and scored by an
environment (environment.py), to pass@4 > 0.69 on the held-out tasks.

One training step is one rollout batch (NeMo-RL@3fca04c9 nemo_rl/algorithms/grpo.py, synchronous form, trajectory
age 0): P = GBS / G tasks in order, G rollouts each at the training sampling settings with the current weights,
the environment's rewards, leave-one-out advantages per group, then ONE optimizer step on the GRPO loss. The
train step is the harness's (harness/train/loop.py CompiledSteps): `loss` returns the loss numerator and the
valid-token count as one LossTerm, which the loop sums over micro-batches and replicas before dividing: NeMo-RL's
global token normalisation. The generator reads the model's variables at every call, so the updated weights
are the next step's policy with no copy and no retrace (the reference broadcasts them to vLLM: "refit").

The harness's loop runs it with train blocks of rollout steps (`rollout.RolloutBlocks`); evaluation is the
harness's: pass@4, pass^4 and pass@1 over `eval_generations` rollouts of every held-out task at the validation
sampling settings, after step ceil(2.5 + 3840 / GBS) and every step after
(compliance_checker/training_6.1.0/closed_qwen35_397b_grpo.yaml in mlperf-logging 4.1.68); the run stops at the
first pass@4 above the target.

Only data.source=synthetic runs here: the in-process toy task (environment.KeyedAnswerTask), whose episode is
one generated token. The reference's tasks need R2E-Gym containers and an OpenHands agent, refused in one line.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from harness.errors import HarnessError
from harness.mlperf import Logged
from harness.nn import hf_checkpoint
from harness.nn.optim import AdamW
from harness.train.workload import EvalSchedule, LossTerm, Workload, sample_schedule

from benchmarks.qwen35_397b_grpo import config, generate, grpo, hf_names
from benchmarks.qwen35_397b_grpo.environment import KeyedAnswerTask
from benchmarks.qwen35_397b_grpo.model import Qwen35
from benchmarks.qwen35_397b_grpo.rules import (REFERENCE_TRAIN_TASKS, RULES, cadence, closed_clip_norm,
                                               closed_learning_rate)

PRECISION_NAMES = {"float32": "fp32", "bfloat16": "bfloat16", "float16": "fp16"}
SMOKE_LABEL = "qwen35_397b_grpo-smoke (toy verifiable task; not an MLPerf result)"
R2E_REFUSAL = ("qwen35_397b_grpo: data.source=r2e_gym needs the reference's R2E-Gym task containers and an "
               "OpenHands agent driving the generator, which this harness does not provide; data.source=synthetic "
               "runs the in-process toy task (a smoke)")


class QwenGrpoWorkload(Workload):
    NAME = "qwen35_397b_grpo"
    MLPERF_KEY = "qwen35_397b_grpo"
    RULESETS = ("6.1.0",)
    RULESET_NOTE = "qwen35_397b_grpo is a benchmark from MLPerf Training 6.1 on"
    SECTIONS = {"data": config.DataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig,
                "grpo": config.GrpoConfig}
    METRIC = "pass@k"  # k = grpo.eval_generations (the rules: 4)
    RULES = RULES
    # transformers' Qwen3_5MoeForCausalLM layout (hf_names.py); an export's max_position_embeddings is the
    # trajectory cap.
    HF_FORMAT = hf_checkpoint.Format(hf_names.layout, hf_names.config_problems, lambda cfg, dtype: hf_names.hf_config(
        cfg.model, cfg.section("grpo").max_trajectory_tokens, dtype))
    # Rollouts in the step's batch, those masked by the logprob-error rule, those seq-mask-tis drops, overlong ones.
    STEP_TOTALS = ("rollouts", "logprob_error_masked", "tis_dropped", "overlong")

    def __init__(self, cfg, runtime) -> None:
        super().__init__(cfg, runtime)
        self.model: Qwen35 | None = None
        self.generator: generate.Generator | None = None
        self.pending: dict[str, np.ndarray] | None = None  # the rollout batch the next train step reads

    # ------------------------------------------------------------------------------- facts of the run
    @property
    def env(self) -> KeyedAnswerTask:
        d = self.cfg.data
        try:
            return KeyedAnswerTask(self.cfg.model.vocab_size, d.synthetic_keys, d.eval_tasks, d.synthetic_seed)
        except ValueError as e:
            raise HarnessError(f"qwen35_397b_grpo toy task: {e}") from None

    @property
    def gcfg(self) -> config.GrpoConfig:
        return self.cfg.section("grpo")

    @property
    def group(self) -> int:
        return self.gcfg.num_generations_per_prompt

    @property
    def prompts_per_step(self) -> int:
        return self.cfg.schedule.global_batch_size // self.group

    @property
    def train_samples(self) -> int:
        """Rollouts in one pass over the training tasks (the reference logs 685 x 16)."""
        tasks = len(self.env.train_ids) if self.cfg.data.source == "synthetic" else REFERENCE_TRAIN_TASKS
        return tasks * self.group

    @property
    def eval_samples(self) -> int:
        """Validation TASKS (each scored over eval_generations rollouts), as the reference logs them."""
        return self.cfg.data.eval_tasks

    @property
    def row_length(self) -> int:
        return self.env.prompt_length + self.gcfg.max_new_tokens

    def eval_schedule(self) -> EvalSchedule:
        gbs = self.cfg.schedule.global_batch_size
        c = cadence(self.cfg, gbs)
        budget = self.gcfg.max_steps * gbs
        marks = [m for m in c.positions(budget)]
        if not marks or marks[-1] < budget:
            marks.append(budget)   # the budget's own eval, off the grid
        return sample_schedule(marks, self.train_samples, gbs, c.every)

    # ---------------------------------------------------------------------------------- validation
    def validate_config(self) -> None:
        c = self.cfg
        if c.data.source == "r2e_gym":
            raise HarnessError(R2E_REFUSAL)
        super().validate_config()
        if c.schedule.global_batch_size % self.group:
            raise HarnessError(f"schedule.global_batch_size={c.schedule.global_batch_size} is not a multiple of "
                               f"grpo.num_generations_per_prompt={self.group} (whole groups per step)")
        if self.gcfg.max_new_tokens != 1:
            raise HarnessError(f"the toy task's episode is one generated token: set grpo.max_new_tokens=1 (got "
                               f"{self.gcfg.max_new_tokens})")
        if c.schedule.gradient_accumulation_steps != 1:
            raise HarnessError("qwen35_397b_grpo takes one optimizer step per rollout batch in one pass: set "
                               "schedule.gradient_accumulation_steps=1")
        _ = self.env  # its own checks

    def validate(self) -> None:
        self.validate_config()
        if self.cfg.model.init_checkpoint:
            hf_checkpoint.check_config(self.cfg.model.init_checkpoint, self.HF_FORMAT, self.cfg.model)

    def dry_run_inputs(self) -> tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec], list[str]]:
        self.validate_config()
        s = self.row_length
        train = {"tokens": tf.TensorSpec([s], tf.int32), "generated": tf.TensorSpec([s], tf.float32),
                 "logprobs": tf.TensorSpec([s], tf.float32), "lengths": tf.TensorSpec([], tf.int32),
                 "advantages": tf.TensorSpec([], tf.float32)}
        evals = {"prompt": tf.TensorSpec([self.env.prompt_length], tf.int32), "target": tf.TensorSpec([], tf.int32),
                 "task": tf.TensorSpec([], tf.int64)}
        return train, evals, []

    # ---------------------------------------------------------------------------- model and inputs
    def build(self) -> None:
        c, o = self.cfg, self.cfg.optimizer
        gbs = c.schedule.global_batch_size
        self.model = Qwen35(self.runtime, c.seed, c.model, self.row_length)
        lr = o.base_learning_rate or closed_learning_rate(gbs)
        # Adam(W) at a constant rate, no warmup; the frozen router is no trainable variable, so neither the
        # optimizer nor the clip's norm sees it.
        self.optimizer = AdamW(self.runtime, self.runtime.variables(trainable=True), lambda step: tf.constant(lr),
                               weight_decay=o.weight_decay, exclude_from_decay=(), beta_1=o.beta_1,
                               beta_2=o.beta_2, epsilon=o.epsilon)
        self.optimizer.build()
        if c.model.init_checkpoint:
            hf_checkpoint.load_into(self.runtime, c.model.init_checkpoint, self.HF_FORMAT, c.model)
        # The generator compiles with XLA unless the config turns XLA off (runtime.jit_compile false).
        self.generator = generate.Generator(self.model, min(self.gcfg.generation_slots, gbs), self.env.prompt_length,
                                            self.gcfg.max_new_tokens, jit_compile=c.runtime.jit_compile is not False)
        self.pending = None

    def rollouts(self, step: int) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Training step `step`'s rollout batch (1-based): tasks [P (step-1), P step) of the fixed training
        order (cycled), G rollouts each at the training settings, seeded by (run seed, step); the rewards'
        mean and the fraction of groups whose rewards differ (the groups that train)."""
        env, g, p = self.env, self.gcfg, self.prompts_per_step
        order = env.train_ids
        tasks = [int(order[(p * (step - 1) + i) % len(order)]) for i in range(p)]
        rows = [t for t in tasks for _ in range(self.group)]
        sampling = generate.SamplingParams(g.train_temperature, g.train_top_p)
        out = self.generate([env.reset(t) for t in rows], sampling, seed=self.cfg.seed * 1_000_003 + step)
        rewards = np.array([env.step(t, out.tokens[r, out.lengths[r] - g.max_new_tokens:out.lengths[r]]).reward
                            for r, t in enumerate(rows)], np.float32)
        adv = grpo.leave_one_out_advantages(tf.constant(rewards), self.group).numpy()
        by_group = rewards.reshape(-1, self.group)
        facts = {"reward": float(rewards.mean()), "groups_with_signal": float(np.mean(by_group.std(1) > 0))}
        return {"tokens": out.tokens, "generated": out.generated, "logprobs": out.logprobs,
                "lengths": out.lengths.astype(np.int32), "advantages": adv.astype(np.float32)}, facts

    def generate(self, prompts: list[list[int]], sampling: generate.SamplingParams, seed: int) -> generate.Rollouts:
        """All `prompts` through the generator in calls of its slot count, each row keyed by its index."""
        parts, slots = [], self.generator.slots
        for start in range(0, len(prompts), slots):
            chunk = prompts[start:start + slots]
            parts.append(self.generator.generate(chunk, sampling, seed, keys=list(range(start, start + len(chunk)))))
        return generate.Rollouts(*(np.concatenate([getattr(r, f) for r in parts]) for f in
                                   ("tokens", "generated", "logprobs", "lengths", "stopped")))

    def train_dataset(self, ctx) -> tf.data.Dataset:
        """The rows of the pending rollout batch, repeated (`rollout.RolloutBlocks` sets it before each step and reads
        one global batch of a fresh dataset). Where nothing is pending (the harness's own loop: step cases,
        warm-up) the first iteration makes step 1's batch with the current weights."""
        train, _, _ = self.dry_run_inputs()

        def rows():
            if self.pending is None:
                self.pending, _ = self.rollouts(1)
            batch = self.pending
            while True:
                for i in range(len(batch["lengths"])):
                    yield {k: v[i] for k, v in batch.items()}

        return tf.data.Dataset.from_generator(rows, output_signature=train)

    def eval_records(self, ctx) -> tf.data.Dataset:
        env = self.env
        ids = env.eval_ids
        return tf.data.Dataset.from_tensor_slices({
            "prompt": np.array([env.reset(int(t)) for t in ids], np.int32),
            "target": np.array([env.target(int(t)) for t in ids], np.int32),
            "task": ids.astype(np.int64)})

    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        return dict(record)

    # ----------------------------------------------------------------------------------- computation
    def token_logprobs(self, tokens: tf.Tensor) -> tf.Tensor:
        """The trainer's log-probability [b, S-1] of each next token of rows [b, S] (float32 log-softmax:
        training samples at temperature 1 and top-p 1, where processed log-probs are the raw ones)."""
        hidden, _ = self.model(tokens)
        logits = self.model.logits(hidden)[:, :-1]
        return tf.gather(tf.nn.log_softmax(logits, -1), tokens[:, 1:], batch_dims=2)

    def loss(self, batch: dict[str, tf.Tensor], seed: tf.Tensor) -> Any:
        """GRPO on this replica's rollouts (grpo.py, in its order): overlong and logprob-error masks, then the
        loss numerator over the valid-token count, summed over replicas by the loop before it divides."""
        lp = self.token_logprobs(batch["tokens"])
        lp_gen = batch["logprobs"][:, 1:]
        token_mask = grpo.generated_token_mask(batch["generated"], batch["lengths"])
        overlong = grpo.overlong_sample_mask(batch["lengths"], self.gcfg.max_trajectory_tokens)
        # force_on_policy_ratio: the trainer's pre-update log-probs are this forward's (no second forward).
        sample_mask = grpo.logprob_error_keep(tf.stop_gradient(lp), lp_gen, token_mask, overlong)
        total = grpo.grpo_loss_sum(lp, lp_gen, batch["advantages"], token_mask, sample_mask)
        count = grpo.valid_token_count(token_mask, sample_mask)
        tis = grpo.seq_tis_keep(tf.stop_gradient(lp), lp_gen, token_mask)
        stats = {"rollouts": tf.cast(tf.shape(lp)[0], tf.float32),
                 "logprob_error_masked": tf.reduce_sum(overlong - sample_mask),
                 "tis_dropped": tf.reduce_sum(1.0 - tis), "overlong": tf.reduce_sum(1.0 - overlong)}
        return {"grpo": LossTerm(total, count, grpo.LOSS_EPS)}, stats

    def process_gradients(self, grads: list[tf.Tensor], stats: dict[str, tf.Tensor]) -> list[tf.Tensor]:
        clip = self.cfg.optimizer.clip_norm or closed_clip_norm(self.cfg.schedule.global_batch_size)
        grads, _ = tf.clip_by_global_norm(grads, clip)
        return grads

    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        """eval_generations rollouts of each held-out task at the validation settings and their rewards [b, k].
        A toy episode is one generated token, so a rollout is the generator's prefill and draw
        (generate.sample on the prompt's last logits, the engine's own function), keyed by (run seed,
        optimizer step) and (task, rollout): a fresh, reproducible draw at every eval."""
        g, k = self.gcfg, self.gcfg.eval_generations
        hidden, _ = self.model(batch["prompt"])
        last = self.model.logits(hidden[:, -1:])[:, 0]                                   # [b, vocab]
        # On a mesh everything from here on is whole (replicated), as in the generator (`_whole`): DTensor's
        # CPU expansion of the draw over rows split over `data` fails, and so does a tile-and-reshape of the
        # logits (a segmentation fault) or a result split over `data` (the layout it propagates back into the
        # draw mismatches its shapes), all measured. Row r * k + j is task r's rollout j.
        last = self.runtime.place(last, (None, None))
        target = self.runtime.place(batch["target"], (None,))
        b = last.shape[0]
        logits = tf.gather(last, tf.range(b * k) // k)
        rows = self.runtime.place(tf.reshape(batch["task"][:, None] * k + tf.range(k, dtype=tf.int64)[None], [-1]),
                                  (None,))
        mesh = self.runtime.laid_out  # map_fn unrolled (generate.per_row)
        seeds = generate.row_seeds(self.cfg.seed, rows, self.optimizer.step, unroll=mesh)
        drawn, _ = generate.sample(logits, tf.constant(g.eval_temperature, tf.float32),
                                   tf.constant(g.eval_top_p, tf.float32), seeds, unroll=mesh)
        rewards = tf.cast(tf.equal(tf.reshape(drawn, [b, k]), target[:, None]), tf.float32)
        return {"rewards": rewards}

    def eval_finalize(self, state: dict[str, Any]) -> dict[str, float]:
        return pass_metrics(np.concatenate(state["rewards"]))

    def train_block(self) -> Any:
        from benchmarks.qwen35_397b_grpo import rollout
        return rollout.RolloutBlocks(self)

    # ---------------------------------------------------------------------------------------- logging
    def mllog_hparams(self) -> dict[str, Any]:
        """The 6.1.0 checker's keys in the order it needs (num_prompts_per_step before
        num_generations_per_prompt, both after global_batch_size, which the run logs first) and the disclosure
        keys; a synthetic run's log also carries its smoke label (no MLPerf key)."""
        c, o, g, rt = self.cfg, self.cfg.optimizer, self.gcfg, self.runtime
        gbs = c.schedule.global_batch_size
        precision = PRECISION_NAMES[rt.precision]
        out: dict[str, Any] = {
            "max_steps": g.max_steps,
            "max_sequence_length": Logged(g.max_trajectory_tokens, {"unit": "tokens per trajectory"}),
            "init_checkpoint_step": 0,
            "opt_name": "adamw",
            "opt_base_learning_rate": o.base_learning_rate or closed_learning_rate(gbs),
            "opt_adamw_beta_1": o.beta_1,
            "opt_adamw_beta_2": o.beta_2,
            "opt_adamw_epsilon": o.epsilon,
            "opt_adamw_weight_decay": o.weight_decay,
            "opt_gradient_clip_norm": o.clip_norm or closed_clip_norm(gbs),
            "opt_learning_rate_warmup_steps": 0,
            "opt_learning_rate_decay_schedule": "constant",
            "tensor_parallelism": max(rt.shards("heads"), rt.shards("ff")),
            "pipeline_parallelism": 1,
            "context_parallelism": 1,
            "expert_parallelism": max(rt.shards("experts"), 1),
            "lowest_numerical_precision_in_linear": precision,
            "lowest_numerical_precision_in_attn": precision,
            "lowest_numerical_precision_in_comm": precision,
            "micro_batch_size": self.replica_batch,
            "config_filename": c.config_file or "unknown",
            "generation_training_rollout_temperature": g.train_temperature,
            "generation_training_rollout_top_p": g.train_top_p,
            "generation_validation_rollout_temperature": g.eval_temperature,
            "generation_validation_rollout_top_p": g.eval_top_p,
            "num_prompts_per_step": self.prompts_per_step,
            "num_generations_per_prompt": self.group,
            "target_accuracy": self.target,
        }
        if c.data.source == "synthetic":
            out["harness_smoke"] = SMOKE_LABEL
        return out


def pass_metrics(rewards: np.ndarray) -> dict[str, float]:
    """pass@k (a task counts when any of its k rewards is > 0), pass^k (all are) and pass@1 (their mean) over
    rewards [tasks, k] (NeMo-RL@3fca04c9 grpo.py _calculate_observed_pass_metrics)."""
    r = np.asarray(rewards, np.float64)
    return {"pass@k": float(np.mean(np.any(r > 0, 1))), "pass^k": float(np.mean(np.all(r > 0, 1))),
            "pass@1": float(np.mean(r))}
