"""Per-token loss terms ([B, T] in, [B, T] out) and the aggregation into one scalar.

Terms never reduce; `token_weights` decides how tokens count (token mean over the global batch, or per-trajectory
mean then batch mean), so every algorithm aggregates the same way.
"""
from __future__ import annotations

import torch


def clipped_pg(logp_BT, old_logp_BT, adv_BT, eps_low: float, eps_high: float):
    """PPO-clip with asymmetric bounds (DAPO's eps_high). Returns (loss, clipped indicator)."""
    ratio = torch.exp(logp_BT - old_logp_BT)
    unclipped = -adv_BT * ratio
    clipped = -adv_BT * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def truncated_is_weights(target_logp_BT, behaviour_logp_BT, cap: float):
    """min(pi_target / pi_behaviour, cap) per token, no gradient: the off-policy correction for samples drawn with
    older weights (pi_old over the rollout's under train.mode=async; the student now over the student before this
    update for a distillation divergence)."""
    return torch.exp(target_logp_BT - behaviour_logp_BT).clamp(max=cap).detach()


def k3_kl(logp_BT, ref_logp_BT):
    """Schulman's k3 estimator of KL(pi || ref) on the sampled token: exp(ref - logp) - 1 - (ref - logp) >= 0."""
    log_ratio = ref_logp_BT - logp_BT
    return torch.exp(log_ratio) - 1.0 - log_ratio



# How per-token terms become one scalar: weights over the whole global batch of one update (all ranks), from the
# loss mask, the batch's action tokens and trajectories, and the constant token count of `seq_sum`.
LOSS_AGGREGATIONS = {
    # every action token of the batch weighs the same (DAPO; LOPD's code); the weights sum to 1
    "token_mean": lambda mask, tokens, trajectories, constant: mask / max(tokens, 1),
    # each trajectory weighs the same and its tokens share its weight (the GRPO paper; LOPD's paper); sum 1
    "seq_mean": lambda mask, tokens, trajectories, constant: (mask / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
                                                              / max(trajectories, 1)),
    # Dr.GRPO: each trajectory's token sum over a constant, so that no length changes a token's weight
    "seq_sum": lambda mask, tokens, trajectories, constant: mask / (max(trajectories, 1) * constant),
}


def token_weights(loss_mask_BT: torch.Tensor, mode: str, action_tokens: int, trajectories: int,
                  seq_sum_tokens: int = 1) -> torch.Tensor:
    return LOSS_AGGREGATIONS[mode](loss_mask_BT, action_tokens, trajectories, seq_sum_tokens)
