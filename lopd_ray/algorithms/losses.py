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


def k3_kl(logp_BT, ref_logp_BT):
    """Schulman's k3 estimator of KL(pi || ref) on the sampled token: exp(ref - logp) - 1 - (ref - logp) >= 0."""
    log_ratio = ref_logp_BT - logp_BT
    return torch.exp(log_ratio) - 1.0 - log_ratio



def token_weights(loss_mask_BT: torch.Tensor, mode: str, action_tokens: int, trajectories: int) -> torch.Tensor:
    """Weights that sum to 1 over the whole global batch of one update (over all ranks)."""
    if mode == "token_mean":
        return loss_mask_BT / max(action_tokens, 1)
    per_traj = loss_mask_BT.sum(dim=1, keepdim=True).clamp(min=1.0)
    return loss_mask_BT / per_traj / max(trajectories, 1)
