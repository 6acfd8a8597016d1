"""lopd_ray/data/sampler.py: epoch coverage, epoch boundaries, exact resume, per-sample seeds."""
from __future__ import annotations

import pytest

from lopd_ray.data.sampler import TaskSampler, sample_seed


def test_each_epoch_is_a_permutation():
    s = TaskSampler(num_tasks=12, prompts_per_step=4, seed=3)
    picks = [i for _ in range(9) for i in s.next()]  # exactly 3 epochs
    for e in range(3):
        assert sorted(picks[e * 12:(e + 1) * 12]) == list(range(12))
    assert picks[:12] != picks[12:24]  # a fresh permutation per epoch
    assert s.state_dict() == {"epoch": 3, "offset": 0, "num_tasks": 12}


def test_crosses_epoch_boundary():
    s = TaskSampler(num_tasks=10, prompts_per_step=4, seed=0)
    steps = [s.next() for _ in range(5)]  # 20 picks = 2 epochs
    assert all(len(b) == 4 for b in steps)
    flat = [i for b in steps for i in b]
    assert sorted(flat[:10]) == list(range(10))
    assert sorted(flat[10:]) == list(range(10))
    # The stream does not depend on the step size: epoch e is one fixed permutation, so step 3 is the last 2 of
    # epoch 0 followed by the first 2 of epoch 1.
    whole = TaskSampler(num_tasks=10, prompts_per_step=10, seed=0)
    epoch0, epoch1 = whole.next(), whole.next()
    assert steps[2] == epoch0[8:] + epoch1[:2]
    assert flat == epoch0 + epoch1
    assert s.state_dict() == {"epoch": 2, "offset": 0, "num_tasks": 10}
    # Same seed, same stream; another seed, another stream.
    t = TaskSampler(num_tasks=10, prompts_per_step=4, seed=0)
    assert [t.next() for _ in range(5)] == steps
    u = TaskSampler(num_tasks=10, prompts_per_step=4, seed=1)
    assert [u.next() for _ in range(5)] != steps


def test_more_prompts_than_tasks():
    s = TaskSampler(num_tasks=3, prompts_per_step=7, seed=5)
    batch = s.next()
    assert len(batch) == 7
    assert sorted(batch[:3]) == [0, 1, 2] and sorted(batch[3:6]) == [0, 1, 2]
    assert s.state_dict()["epoch"] == 2 and s.state_dict()["offset"] == 1


@pytest.mark.parametrize("steps_before", [1, 2, 3, 5, 7])
def test_resume_gives_identical_next_batches(steps_before):
    # 10 tasks, 4 per step: after 5 steps the state is exactly on an epoch boundary (epoch 2, offset 0),
    # after 1, 2, 3, 7 steps it is mid-epoch.
    a = TaskSampler(num_tasks=10, prompts_per_step=4, seed=42)
    for _ in range(steps_before):
        a.next()
    state = a.state_dict()
    b = TaskSampler(num_tasks=10, prompts_per_step=4, seed=42)
    b.load_state_dict(dict(state))
    assert b.state_dict() == state
    assert [b.next() for _ in range(6)] == [a.next() for _ in range(6)]


def test_resume_at_epoch_boundary_state():
    a = TaskSampler(num_tasks=8, prompts_per_step=4, seed=1)
    a.next(), a.next()
    assert a.state_dict() == {"epoch": 1, "offset": 0, "num_tasks": 8}
    b = TaskSampler(num_tasks=8, prompts_per_step=4, seed=1)
    b.load_state_dict(a.state_dict())
    nxt = b.next()
    assert nxt == a.next()
    whole = TaskSampler(num_tasks=8, prompts_per_step=8, seed=1)
    epoch0, epoch1 = whole.next(), whole.next()
    assert epoch0 != epoch1
    assert nxt == epoch1[:4]  # continues with epoch 1, does not restart epoch 0


def test_mismatched_num_tasks_raises():
    a = TaskSampler(num_tasks=10, prompts_per_step=4, seed=0)
    a.next()
    b = TaskSampler(num_tasks=12, prompts_per_step=4, seed=0)
    with pytest.raises(ValueError, match="10"):
        b.load_state_dict(a.state_dict())


def test_empty_split_raises():
    with pytest.raises(ValueError):
        TaskSampler(num_tasks=0, prompts_per_step=4, seed=0)


def test_sample_seed_deterministic_and_distinct():
    seeds = [sample_seed(1234, 3, slot) for slot in range(512)]
    assert seeds == [sample_seed(1234, 3, slot) for slot in range(512)]
    assert len(set(seeds)) == 512
    assert all(isinstance(s, int) and 0 <= s < 2**31 - 1 for s in seeds)
    assert sample_seed(1234, 3, 0) != sample_seed(1234, 4, 0)
    assert sample_seed(1234, 3, 0) != sample_seed(1235, 3, 0)
    # Distinct across (step, slot) pairs too.
    grid = {sample_seed(7, step, slot) for step in range(20) for slot in range(20)}
    assert len(grid) == 400
