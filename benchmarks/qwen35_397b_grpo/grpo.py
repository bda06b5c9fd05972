"""GRPO as the qwen35_397b_grpo reference runs it: NeMo-RL's ClippedPGLossFn with the recipe's settings.

Source: NVIDIA-NeMo/RL@3fca04c9b313d313302923a5bb6b0c8dc0340ed6 (the pin of mlcommons/training
llm_post_training), files nemo_rl/algorithms/{utils.py, advantage_estimator.py, grpo.py,
loss/loss_functions.py}, nemo_rl/experience/rollouts.py and the recipe
qwen_35/configs/grpo_qwen35_397b_swe_openhands_async.yaml. The recipe sets force_on_policy_ratio (so the PPO
ratio is exp(lp - sg(lp)): value 1, gradient of lp, the 0.2/0.28 clip a no-op), token_level_loss,
use_importance_sampling_correction with truncated_importance_sampling_type "seq-mask-tis" in [0.999, 1.002],
seq_logprob_error_threshold 2, overlong filtering, reference_policy_kl_penalty 0 (no KL term, no reference
model), no advantage clipping, no reward shaping or scaling.

One step, in order:
  1. sample_mask = overlong_sample_mask(lengths)            (0 for a trajectory that hit the length cap)
  2. token_mask  = generated_token_mask(generated, lengths)  (1 on tokens the generator sampled, else 0)
  3. sample_mask *= logprob_error_keep(lp_prev, lp_gen, ...) (lp_prev: a no-grad trainer forward)
  4. advantages  = leave_one_out_advantages(rewards, group)  (from every reward, masked or not)
  5. n_tok       = valid_token_count(...) summed over the WHOLE global batch (every micro-batch, every replica)
  6. loss        = grpo_loss(lp, lp_gen, advantages, token_mask, sample_mask, n_tok) per micro-batch; their sum
                   over micro-batches and replicas (an all-reduce SUM) is the loss of the global batch.
Per-token arrays are next-token aligned: column t is the log-probability of token t+1 of the row (NeMo-RL's
`[:, 1:]`). Everything is float32 and static-shaped, for use inside a compiled step.
"""
from __future__ import annotations

import tensorflow as tf

GROUP_SIZE = 16  # num_generations_per_prompt
ADVANTAGE_EPS = 1e-6  # GRPOAdvantageEstimator: (r - b) / (std + 1e-6)
LOGPROB_ERROR_THRESHOLD = 2.0  # grpo.seq_logprob_error_threshold
TIS_RATIO_MIN = 0.999  # loss_fn.truncated_importance_sampling_ratio_min
TIS_RATIO_MAX = 1.002  # loss_fn.truncated_importance_sampling_ratio
MAX_TRAJECTORY_TOKENS = 65536  # policy.max_total_sequence_length == vLLM max_model_len
LOSS_EPS = 1e-8  # masked_mean's normaliser guard


def leave_one_out_advantages(rewards: tf.Tensor, group_size: int = GROUP_SIZE,
                             eps: float = ADVANTAGE_EPS) -> tf.Tensor:
    """Per-trajectory advantages [N] from rewards [N], groups taken positionally (rows [g*n, g*n+n)).

    b_i = mean of the OTHER n-1 rewards of i's group, s_i = their std with ddof 1, and
    A_i = (r_i - b_i) / (s_i + eps) if s_i > 0 else r_i - b_i (utils.calculate_baseline_and_std_per_prompt with
    leave_one_out_baseline, advantage_estimator.GRPOAdvantageEstimator). All-equal rewards give A = 0 for the
    whole group. A group of 2 has no spread among the one other (std 0, NeMo-RL's nan_to_num), so
    A_i = r_i - r_j. A group of 1 has no other: NeMo-RL sets b = r, so A = 0. Computed in float64 so that
    equal rewards give no spurious spread.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    r = tf.reshape(tf.cast(rewards, tf.float64), [-1, group_size])
    if group_size == 1:
        return tf.zeros_like(tf.cast(rewards, tf.float32))
    others = group_size - 1
    baseline = (tf.reduce_sum(r, axis=1, keepdims=True) - r) / others
    if group_size == 2:
        std = tf.zeros_like(r)
    else:
        # Sum of squared deviations of the others from their own mean: every member's minus i's own term.
        dev = r[:, None, :] - baseline[:, :, None]  # [G, i, j]
        ss = tf.reduce_sum(tf.square(dev), axis=2) - tf.square(r - baseline)
        std = tf.sqrt(tf.maximum(ss, 0.0) / (others - 1))
    centred = r - baseline
    adv = tf.where(std > 0, centred / (std + eps), centred)
    return tf.cast(tf.reshape(adv, tf.shape(rewards)), tf.float32)


def overlong_sample_mask(lengths: tf.Tensor, max_tokens: int = MAX_TRAJECTORY_TOKENS) -> tf.Tensor:
    """sample_mask [B] from total trajectory lengths [B]: 0 where the trajectory reached the cap (vLLM stops it
    there, so truncated means length == max_tokens; rollouts.py sets loss_multiplier 0), else 1."""
    return tf.cast(tf.cast(lengths, tf.int64) < max_tokens, tf.float32)


def generated_token_mask(generated: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
    """token_mask [B, S-1], next-token aligned, from per-position flags generated [B, S] (1 where the generator
    sampled the token: assistant turns; 0 for system, user and tool-output tokens) and row lengths [B].

    Column t trains the prediction of token t+1 when that token was generated and lies inside the row
    (grpo.add_grpo_token_loss_masks_and_generation_logprobs, then the loss's token_mask[:, 1:]).
    """
    generated = tf.cast(generated, tf.float32)
    positions = tf.range(1, tf.shape(generated)[1])
    inside = tf.cast(positions[None, :] < tf.cast(lengths, tf.int32)[:, None], tf.float32)
    return generated[:, 1:] * inside


def logprob_error_keep(lp_prev: tf.Tensor, lp_gen: tf.Tensor, token_mask: tf.Tensor, sample_mask: tf.Tensor,
                       threshold: float = LOGPROB_ERROR_THRESHOLD) -> tf.Tensor:
    """The new sample_mask [B]: sample_mask times 1[err_i <= threshold], err_i = mean over the row's masked tokens
    of exp(|lp_gen - lp_prev|) (grpo.compute_and_apply_seq_logprob_error_masking; a row without a valid token
    has err 0 and stays as it was)."""
    mask = token_mask * sample_mask[:, None]
    err = tf.reduce_sum(tf.exp(tf.abs(lp_gen - lp_prev) * mask) * mask, axis=1)
    err = err / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
    return sample_mask * tf.cast(err <= threshold, tf.float32)


def seq_tis_keep(lp_prev: tf.Tensor, lp_gen: tf.Tensor, token_mask: tf.Tensor,
                 ratio_min: float = TIS_RATIO_MIN, ratio_max: float = TIS_RATIO_MAX) -> tf.Tensor:
    """seq-mask-tis keep [B]: 1 where ratio_min <= exp(mean_t (lp_prev - lp_gen)) <= ratio_max, both bounds
    included, the mean over token_mask only (not sample_mask) and non-finite differences counted as 0
    (loss_functions.ClippedPGLossFn, truncated_importance_sampling_type "seq-mask-tis")."""
    log_ratio = _finite_or_zero(lp_prev - lp_gen)
    mean = tf.reduce_sum(log_ratio * token_mask, axis=1) / (tf.reduce_sum(token_mask, axis=1) + LOSS_EPS)
    ratio = tf.exp(mean)
    return tf.cast(tf.logical_and(ratio >= ratio_min, ratio <= ratio_max), tf.float32)


def token_importance_weights(lp_prev: tf.Tensor, lp_gen: tf.Tensor) -> tf.Tensor:
    """exp(lp_prev - lp_gen) per token, not truncated, non-finite values 0, no gradient (ClippedPGLossFn's
    token-level actor_importance_weights)."""
    return tf.stop_gradient(_finite_or_zero(tf.exp(lp_prev - lp_gen)))


def valid_token_count(token_mask: tf.Tensor, sample_mask: tf.Tensor) -> tf.Tensor:
    """This shard's count of trained tokens, sum of token_mask * sample_mask. Sum it over every micro-batch and
    replica of the global batch (NeMo-RL's global_valid_toks) and pass the total to grpo_loss. Sequences dropped
    by seq-mask-tis still count; those with sample_mask 0 do not."""
    return tf.reduce_sum(token_mask * sample_mask[:, None])


def grpo_loss(lp: tf.Tensor, lp_gen: tf.Tensor, advantages: tf.Tensor, token_mask: tf.Tensor,
              sample_mask: tf.Tensor, global_valid_tokens: tf.Tensor,
              ratio_min: float = TIS_RATIO_MIN, ratio_max: float = TIS_RATIO_MAX) -> tf.Tensor:
    """This shard's share of the global-batch loss: sum_t M_t w_t (-A_i ratio_t) / (global_valid_tokens + 1e-8).

    lp: the trainer's log-probs of the taken tokens [B, T] (carries the gradient); lp_gen: the generator's;
    advantages [B]; M = token_mask * sample_mask; ratio = exp(lp - sg(lp)) (force_on_policy_ratio: prev_logprobs
    inside the loss is sg(lp)); w = exp(sg(lp) - lp_gen) * seq_tis_keep(sg(lp), lp_gen). Summing the shares of
    all micro-batches and replicas gives the token mean over the global batch, whatever the split; the gradient
    is -(1/N) sum M w A grad(lp).
    """
    total = grpo_loss_sum(lp, lp_gen, advantages, token_mask, sample_mask, ratio_min, ratio_max)
    return total / (tf.cast(global_valid_tokens, tf.float32) + LOSS_EPS)


def grpo_loss_sum(lp: tf.Tensor, lp_gen: tf.Tensor, advantages: tf.Tensor, token_mask: tf.Tensor,
                  sample_mask: tf.Tensor, ratio_min: float = TIS_RATIO_MIN, ratio_max: float = TIS_RATIO_MAX
                  ) -> tf.Tensor:
    """grpo_loss's numerator, sum_t M_t w_t (-A_i ratio_t) over this shard: what a loop that sums numerators and
    token counts over micro-batches and replicas before dividing (harness LossTerm) takes."""
    lp_sg = tf.stop_gradient(lp)
    ratio = tf.exp(lp - lp_sg)
    per_token = -advantages[:, None] * ratio
    keep = seq_tis_keep(lp_sg, lp_gen, token_mask, ratio_min, ratio_max)
    weights = token_importance_weights(lp_sg, lp_gen) * keep[:, None]
    mask = token_mask * sample_mask[:, None]
    return tf.reduce_sum(weights * per_token * mask)


def _finite_or_zero(x: tf.Tensor) -> tf.Tensor:
    """torch.nan_to_num(x, nan=0, posinf=0, neginf=0)."""
    return tf.where(tf.math.is_finite(x), x, tf.zeros_like(x))
