"""qwen35_397b_grpo's cost for `mlperf-harness plan`, the dry run's useful FLOPs and the run's MFU: multiply-adds
per token of the weight matmuls of benchmarks/qwen35_397b_grpo/model.py (every layer's mixer projections, the
router, the k routed experts and the shared expert, the LM head; attention scores and the DeltaNet's chunked
rule not counted) times the tokens of one rollout. A rollout costs a generator forward (2 FLOPs per
multiply-add) and the trainer's forward and backward (6): 8 per multiply-add per token; an eval sample is
eval_generations rollouts' forwards. The rollout's tokens: prompt + generated for the toy task; for the
reference's agent trajectories the cap, 65,536, an upper bound (the mean length is not published; the RCP logs
give about 5.7k trained tokens per trajectory).
"""
from __future__ import annotations

from harness.plan.cost import CostModel, ModelCost

from benchmarks.qwen35_397b_grpo import rules
from benchmarks.qwen35_397b_grpo.environment import KeyedAnswerTask

CONVERGE_UNIT = "samples"
ADAM_BYTES = 28.0  # float32 weight, gradient, m, v read; weight, m, v written
EVAL_FIXED_SECONDS = 0.05  # the host's reward and pass@k over the rollouts (assumption; --calibrate measures it)


def token_macs_and_params(m) -> tuple[float, float, int]:
    """(multiply-adds per token, of which routed experts', parameters) of the model section `m`."""
    h = m.hidden_size
    macs, routed, params = 0.0, 0.0, 2 * m.vocab_size * h + h
    for layer in range(m.num_layers):
        if (layer + 1) % m.full_attention_interval == 0:
            q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
            mixer = h * 2 * q + 2 * h * kv + q * h
            params += mixer + 2 * m.head_dim
        else:
            key = m.linear_num_key_heads * m.linear_key_head_dim
            value = m.linear_num_value_heads * m.linear_value_head_dim
            conv = 2 * key + value
            mixer = h * (conv + value + 2 * m.linear_num_value_heads) + value * h
            params += mixer + conv * m.linear_conv_kernel_dim + 2 * m.linear_num_value_heads + m.linear_value_head_dim
        expert, shared = 3 * h * m.expert_hidden, 3 * h * m.shared_expert_hidden
        macs += mixer + h * m.num_experts + m.experts_per_token * expert + shared + h
        routed += m.experts_per_token * expert
        params += h * m.num_experts + m.num_experts * expert + shared + h + 2 * h
    macs += h * m.vocab_size
    return macs, routed, int(params)


def rollout_tokens(cfg) -> tuple[int, int]:
    """(tokens of one rollout, of its prompt)."""
    g, d = cfg.section("grpo"), cfg.data
    if d.source == "synthetic":
        prompt = KeyedAnswerTask(cfg.model.vocab_size, d.synthetic_keys, d.eval_tasks, d.synthetic_seed).prompt_length
        return prompt + g.max_new_tokens, prompt
    return g.max_trajectory_tokens, g.max_trajectory_tokens


def model_cost(cfg) -> ModelCost:
    macs, routed, params = token_macs_and_params(cfg.model)
    g, d = cfg.section("grpo"), cfg.data
    tokens, prompt = rollout_tokens(cfg)
    if d.source == "synthetic":
        task = KeyedAnswerTask(cfg.model.vocab_size, d.synthetic_keys, d.eval_tasks, d.synthetic_seed)
        train = len(task.train_ids) * g.num_generations_per_prompt
    else:
        train = rules.REFERENCE_TRAIN_TASKS * g.num_generations_per_prompt
    return ModelCost(
        workload="qwen35_397b_grpo", source="counted (benchmarks/qwen35_397b_grpo/cost.py: weight matmuls per token)",
        train_flops_per_sample=8.0 * macs * tokens, eval_flops_per_sample=2.0 * macs * prompt * g.eval_generations,
        params=params, gradient_bytes=4.0 * params, optimizer_bytes_per_param=ADAM_BYTES,
        train_samples=train, eval_samples=d.eval_tasks,
        sample_unit=f"rollout of up to {tokens} tokens (generated, scored, trained)",
        eval_fixed_seconds=EVAL_FIXED_SECONDS,
        notes=f"{macs:,.0f} multiply-adds per token, {routed:,.0f} of them in the routed experts")


def eval_positions(cfg, upto: float, global_batch: int) -> list[float]:
    """The run's eval positions (rules.cadence) through the first at or past `upto`."""
    return rules.cadence(cfg, global_batch).through(upto)


COST = CostModel(model_cost, eval_positions, CONVERGE_UNIT)
