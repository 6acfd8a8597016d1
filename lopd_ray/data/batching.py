"""Token-budget micro-batches, balanced across data-parallel ranks.

Every rank must run the same number of forward/backward passes, and the same number of output-head calls per
pass (ZeRO-3 gathers parameters collectively at each module call): ranks with less data get empty micro-batches,
which the learner runs as zero-weight dummies, and `longest[u][k]`, shared by all ranks, fixes the number of
log-prob chunks of micro-batch k.
"""
from __future__ import annotations

from dataclasses import dataclass

from lopd_ray.data.by_reference import ROLLOUT_ARRAYS, views_with
from lopd_ray.data.signals import LEARNER, read_by
from lopd_ray.data.trajectory import Trajectory

MicroBatch = list[Trajectory]
# The [R] arrays a learner reads (modeling/logprobs.collate and the algorithms' `complete_targets`).
LEARNER_READS = ROLLOUT_ARRAYS + read_by(LEARNER)


@dataclass
class UpdateNorm:
    """Totals over all ranks of one optimizer update: the denominators of the loss aggregation."""
    action_tokens: int
    trajectories: int


@dataclass
class RankPlan:
    # minibatches[u][k]: the k-th micro-batch of optimizer update u on this rank.
    minibatches: list[list[MicroBatch]]
    # longest[u][k]: the longest trajectory of the k-th micro-batches of update u over all ranks.
    longest: list[list[int]]

    def trajectories(self) -> list[Trajectory]:
        return [t for update in self.minibatches for micro in update for t in micro]

    def shipped(self) -> RankPlan:
        """The plan as the driver sends it: views of its trajectories with the [R] arrays a learner reads
        (lopd_ray/data/by_reference.py; the learner fetches the rest)."""
        return RankPlan([[views_with(micro, LEARNER_READS) for micro in update] for update in self.minibatches],
                        self.longest)


def padded_tokens(micro: MicroBatch) -> int:
    return len(micro) * max((t.num_tokens for t in micro), default=0)


def consecutive_groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Positions 0..n-1 in order, cut into consecutive groups whose padded size (members x longest) stays within
    `max_tokens` (a single longer item gets a group of its own)."""
    groups: list[list[int]] = []
    longest = 0
    for i, n in enumerate(lengths):
        if groups and max(longest, n) * (len(groups[-1]) + 1) <= max_tokens:
            groups[-1].append(i)
            longest = max(longest, n)
        else:
            groups.append([i])
            longest = n
    return groups


def split_across_ranks(trajs: list[Trajectory], num_ranks: int) -> list[list[Trajectory]]:
    """Greedy longest-first assignment to the rank with the fewest tokens (deterministic)."""
    shards: list[list[Trajectory]] = [[] for _ in range(num_ranks)]
    loads = [0] * num_ranks
    for traj in sorted(trajs, key=lambda t: -t.num_tokens):
        rank = min(range(num_ranks), key=lambda r: (loads[r], r))
        shards[rank].append(traj)
        loads[rank] += traj.num_tokens
    return shards


def pack_micro_batches(trajs: list[Trajectory], max_tokens: int) -> list[MicroBatch]:
    """Consecutive trajectories (sorted by length) while the padded size stays within `max_tokens`."""
    ordered = sorted(trajs, key=lambda t: t.num_tokens)
    for traj in ordered:
        if traj.num_tokens > max_tokens:
            raise ValueError(f"a trajectory of {traj.num_tokens} tokens exceeds learner.max_tokens_per_micro_batch="
                             f"{max_tokens}: raise it to at least rollout.max_model_len")
    return [[ordered[i] for i in group] for group in consecutive_groups([t.num_tokens for t in ordered], max_tokens)]


def plan_learner_batches(trajs: list[Trajectory], num_ranks: int, updates_per_step: int,
                         max_tokens: int) -> tuple[list[RankPlan], list[UpdateNorm]]:
    """Returns one plan per rank and, per update, the totals across all ranks."""
    chunk = -(-len(trajs) // updates_per_step) if trajs else 0
    updates = [trajs[i * chunk:(i + 1) * chunk] for i in range(updates_per_step)]
    plans = [RankPlan(minibatches=[], longest=[]) for _ in range(num_ranks)]
    norms = []
    for update in updates:
        norms.append(UpdateNorm(sum(t.num_action_tokens for t in update), len(update)))
        per_rank = [pack_micro_batches(shard, max_tokens) for shard in split_across_ranks(update, num_ranks)]
        depth = max((len(m) for m in per_rank), default=0)
        padded = [micros + [[] for _ in range(depth - len(micros))] for micros in per_rank]
        longest = [max((t.num_tokens for micros in padded for t in micros[k]), default=2) for k in range(depth)]
        for plan, micros in zip(plans, padded):
            plan.minibatches.append(micros)
            plan.longest.append(longest)
    return plans, norms
