"""lopd_ray/data/batching.py: token-budget micro-batches balanced across data-parallel ranks."""
from __future__ import annotations

import random

import numpy as np
import pytest

from lopd_ray.data.batching import padded_tokens, plan_learner_batches
from lopd_ray.data.trajectory import Trajectory


def make_trajs(n: int, seed: int, max_prompt: int = 12, max_resp: int = 40) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, r = rng.randint(1, max_prompt), rng.randint(1, max_resp)
        mask = [1 if rng.random() < 0.8 else 0 for _ in range(r)]
        out.append(Trajectory(task_id=f"t{i}", group_id=i // 4, prompt_ids=[1] * p, response_ids=[2] * r,
                              loss_mask=mask, turn_spans=[(0, r)], rollout_logprobs=[0.0] * r, policy_version=0))
    return out


CASES = [(32, 2, 1, 64), (30, 3, 2, 80), (17, 4, 3, 52), (64, 2, 4, 200), (5, 4, 1, 60), (3, 2, 4, 60)]


@pytest.mark.parametrize("n,ranks,updates,budget", CASES)
def test_plan_invariants(n, ranks, updates, budget):
    trajs = make_trajs(n, seed=n * 31 + ranks)
    plans, norms = plan_learner_batches(trajs, ranks, updates, budget)
    assert len(plans) == ranks
    assert len(norms) == updates
    assert all(len(p.minibatches) == updates for p in plans)

    # Every trajectory exactly once, by identity.
    seen = [id(t) for p in plans for upd in p.minibatches for micro in upd for t in micro]
    assert sorted(seen) == sorted(id(t) for t in trajs)

    for u in range(updates):
        depths = {len(p.minibatches[u]) for p in plans}
        assert len(depths) == 1, f"update {u}: ranks run different numbers of micro-batches {depths}"
        in_update = [t for p in plans for micro in p.minibatches[u] for t in micro]
        # The norm is over all ranks of this update.
        assert norms[u].trajectories == len(in_update)
        assert norms[u].action_tokens == sum(t.num_action_tokens for t in in_update)
        loads = []
        for p in plans:
            for micro in p.minibatches[u]:
                assert padded_tokens(micro) <= budget
                if micro:
                    assert len(micro) * max(t.num_tokens for t in micro) <= budget
            loads.append(sum(t.num_tokens for micro in p.minibatches[u] for t in micro))
        if in_update:
            longest = max(t.num_tokens for t in in_update)
            assert max(loads) - min(loads) <= longest, (loads, longest)
    assert sum(nm.trajectories for nm in norms) == n
    assert sum(nm.action_tokens for nm in norms) == sum(t.num_action_tokens for t in trajs)


def _sized(name: str, prompt: int, resp: int) -> Trajectory:
    return Trajectory(task_id=name, group_id=0, prompt_ids=[1] * prompt, response_ids=[2] * resp,
                      loss_mask=[1] * resp, turn_spans=[(0, resp)], rollout_logprobs=[0.0] * resp, policy_version=0)


def test_padding_with_empty_micro_batches():
    # Longest-first greedy: the 100-token trajectory fills rank 0 alone (one micro-batch); rank 1 gets 50+4*10
    # tokens, which cannot share one padded micro-batch of <= 100 (5*50 = 250), so it needs two. Rank 0 is padded.
    trajs = [_sized("long", 10, 90), _sized("mid", 5, 45)] + [_sized(f"s{i}", 2, 8) for i in range(4)]
    plans, norms = plan_learner_batches(trajs, num_ranks=2, updates_per_step=1, max_tokens=100)
    r0, r1 = (p.minibatches[0] for p in plans)
    assert [[t.task_id for t in m] for m in r0] == [["long"], []]
    assert len(r1) == 2 and all(r1)
    assert sorted(t.task_id for m in r1 for t in m) == ["mid", "s0", "s1", "s2", "s3"]
    assert norms[0].trajectories == 6 and norms[0].action_tokens == 90 + 45 + 4 * 8


def test_more_ranks_than_trajectories():
    trajs = make_trajs(2, 5)
    plans, norms = plan_learner_batches(trajs, num_ranks=4, updates_per_step=1, max_tokens=200)
    assert [len(p.minibatches[0]) for p in plans] == [1, 1, 1, 1]
    assert sum(len(p.minibatches[0][0]) for p in plans) == 2
    assert norms[0].trajectories == 2


def test_over_budget_raises_naming_the_key():
    trajs = make_trajs(8, 3, max_prompt=5, max_resp=10)
    trajs[3].response_ids = np.full(60, 2)
    trajs[3].loss_mask, trajs[3].rollout_logprobs = np.ones(60, dtype=np.int32), np.zeros(60, dtype=np.float32)
    with pytest.raises(ValueError, match=r"learner\.max_tokens_per_micro_batch"):
        plan_learner_batches(trajs, num_ranks=2, updates_per_step=1, max_tokens=50)
    # Exactly at the budget is allowed.
    budget = trajs[3].num_tokens
    plans, _ = plan_learner_batches(trajs, num_ranks=2, updates_per_step=1, max_tokens=budget)
    assert any(trajs[3] in micro for p in plans for micro in p.minibatches[0])


def test_deterministic():
    trajs = make_trajs(40, 9)
    a, na = plan_learner_batches(trajs, 3, 2, 90)
    b, nb = plan_learner_batches(trajs, 3, 2, 90)
    key = lambda plans: [[[[t.task_id for t in m] for m in u] for u in p.minibatches] for p in plans]
    assert key(a) == key(b) and na == nb
