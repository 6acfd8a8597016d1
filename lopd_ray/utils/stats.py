from __future__ import annotations

import numpy as np

from lopd_ray.data.trajectory import Trajectory


def rollout_metrics(trajs: list[Trajectory], step: int) -> dict[str, float]:
    rewards = np.asarray([t.reward for t in trajs], dtype=np.float64)
    lengths = np.asarray([t.num_action_tokens for t in trajs], dtype=np.float64)
    return {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()),
        "rollout/reward_max": float(rewards.max()),
        "rollout/response_tokens_mean": float(lengths.mean()),
        "rollout/truncated_frac": float(np.mean([t.truncated for t in trajs])),
        "rollout/context_full_frac": float(np.mean([t.context_full for t in trajs])),
        "rollout/observations_cut": float(sum(t.observations_cut for t in trajs)),
        "rollout/stale_samples": float(sum(t.policy_version != step for t in trajs)),
    }


def token_weighted_mean(results: list[dict[str, float]], weight_key: str) -> dict[str, float]:
    """Combines per-rank metric dicts, each a mean over that rank's `weight_key` tokens."""
    total = sum(r[weight_key] for r in results)
    out = {weight_key: total}
    for key in results[0]:
        if key != weight_key:
            out[key] = sum(r[key] * r[weight_key] for r in results) / max(total, 1.0)
    return out
