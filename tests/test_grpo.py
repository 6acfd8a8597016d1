"""lopd_ray/algorithms/grpo.py: group advantages, zero-variance filtering, per-token advantages, the KL term."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lopd_ray.algorithms import make_algorithm
from lopd_ray.algorithms.grpo import GRPO, group_advantages, overlong_penalty
from lopd_ray.algorithms.losses import clipped_pg, k3_kl
from lopd_ray.config import AlgorithmConfig, GRPOConfig
from lopd_ray.data.groups import refill_groups
from lopd_ray.data.trajectory import Trajectory


def traj(group_id: int, reward: float, loss_mask: list[int], task: str = "t", prompt_len: int = 3) -> Trajectory:
    n = len(loss_mask)
    return Trajectory(task_id=task, group_id=group_id, prompt_ids=list(range(10, 10 + prompt_len)),
                      response_ids=list(range(100, 100 + n)), loss_mask=list(loss_mask), turn_spans=[(0, n)],
                      rollout_logprobs=[-1.0 if m else 0.0 for m in loss_mask], policy_version=0, reward=reward)


def test_group_advantages_mean_only():
    adv = group_advantages([1.0, 0.0, 0.5, 0.5], normalize_by_std=False)
    np.testing.assert_allclose(adv, [0.5, -0.5, 0.0, 0.0], atol=1e-12)


def test_group_advantages_std_normalized():
    rewards = [1.0, 0.0, 0.5, 0.5]
    adv = group_advantages(rewards, normalize_by_std=True)
    std = np.sqrt((0.25 + 0.25 + 0 + 0) / 3)  # unbiased (Bessel's correction), as verl and TRL
    np.testing.assert_allclose(adv, [0.5 / (std + 1e-6), -0.5 / (std + 1e-6), 0.0, 0.0], rtol=1e-12)
    assert adv[0] == pytest.approx(1.224744, abs=1e-5)  # the population std would give 1.414214
    rng = np.random.default_rng(0)
    r = rng.random(7)
    np.testing.assert_allclose(group_advantages(r.tolist(), True), (r - r.mean()) / (r.std(ddof=1) + 1e-6),
                               rtol=1e-12)
    assert abs(sum(group_advantages(r.tolist(), True))) < 1e-9
    assert np.std(group_advantages(r.tolist(), True), ddof=1) == pytest.approx(1.0, abs=1e-4)


def test_group_advantages_constant_group_is_zero_not_nan():
    adv = group_advantages([0.3, 0.3, 0.3], normalize_by_std=True)
    assert adv == [0.0, 0.0, 0.0]


def test_prepare_drops_and_counts_zero_variance_groups():
    algo = make_algorithm(AlgorithmConfig(grpo=GRPOConfig(normalize_adv_by_std=False)))
    assert isinstance(algo, GRPO)
    trajs = [
        traj(0, 1.0, [1, 1, 1]), traj(0, 0.0, [1, 1]),        # signal
        traj(1, 0.5, [1, 1]), traj(1, 0.5, [1, 1, 1, 1]),     # all equal: dropped
        traj(2, 0.2, [1, 0, 0, 1, 1]), traj(2, 0.8, [1]), traj(2, 0.2, [0, 1]),  # signal, multi-turn masks
        traj(3, 0.0, [1]), traj(3, 0.0, [1]),                 # all zero: dropped
    ]
    kept, metrics = algo.prepare(trajs)
    assert metrics["grpo/zero_variance_groups"] == 2.0
    assert metrics["grpo/groups"] == 4.0
    assert metrics["grpo/trained_samples"] == 5.0
    assert len(kept) == 5
    assert sorted(t.group_id for t in kept) == [0, 0, 2, 2, 2]
    assert all(t.advantages is None for t in trajs if t.group_id in (1, 3))


def test_prepare_sets_advantages_only_on_action_tokens():
    algo = GRPO(AlgorithmConfig(grpo=GRPOConfig(normalize_adv_by_std=True)))
    masks = [[1, 0, 0, 1, 1], [0, 1], [1, 1, 1, 0]]
    rewards = [0.2, 0.8, 0.5]
    trajs = [traj(7, r, m) for r, m in zip(rewards, masks)]
    kept, _ = algo.prepare(trajs)
    assert len(kept) == 3
    r = np.asarray(rewards)
    expected = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    for t, a in zip(trajs, expected):
        assert len(t.advantages) == len(t.response_ids)
        for value, m in zip(t.advantages, t.loss_mask):
            if m:
                assert value == pytest.approx(a)
            else:
                assert value == 0.0
    # The best trajectory is pushed up, the worst down.
    assert trajs[1].advantages[1] > 0 > trajs[0].advantages[0]


def test_groups_are_normalized_separately():
    algo = GRPO(AlgorithmConfig(grpo=GRPOConfig(normalize_adv_by_std=False)))
    a, b, c, d = traj(0, 1.0, [1]), traj(0, 0.0, [1]), traj(1, 10.0, [1]), traj(1, 6.0, [1])
    algo.prepare([a, c, b, d])  # interleaved on purpose
    assert a.advantages.tolist() == [pytest.approx(0.5)] and b.advantages.tolist() == [pytest.approx(-0.5)]
    assert c.advantages.tolist() == [pytest.approx(2.0)] and d.advantages.tolist() == [pytest.approx(-2.0)]


def _batch():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(2, 6, generator=g, dtype=torch.float64) * 2
    old = logp + (torch.rand(2, 6, generator=g, dtype=torch.float64) - 0.5) * 0.8  # some ratios outside the clip
    ref = logp + (torch.rand(2, 6, generator=g, dtype=torch.float64) - 0.5)
    adv = torch.randn(2, 6, generator=g, dtype=torch.float64)
    return {"advantages": adv}, logp, old, ref


def test_token_loss_without_reference():
    cfg = AlgorithmConfig(grpo=GRPOConfig(eps_low=0.2, eps_high=0.28, kl_coef=0.0))
    batch, logp, old, _ = _batch()
    loss, metrics = GRPO(cfg).token_loss(batch, logp, old, None)
    pg, clipped = clipped_pg(logp, old, batch["advantages"], 0.2, 0.28)
    torch.testing.assert_close(loss, pg)
    assert "actor/ref_kl" not in metrics
    torch.testing.assert_close(metrics["actor/clipfrac"], clipped)
    torch.testing.assert_close(metrics["actor/ratio"], (logp - old).exp())
    assert 0 < clipped.sum() < clipped.numel()  # the batch exercises both regimes


def test_token_loss_adds_kl_coef_times_k3():
    cfg = AlgorithmConfig(grpo=GRPOConfig(eps_low=0.2, eps_high=0.28, kl_coef=0.1))
    algo = GRPO(cfg)
    assert algo.needs_reference
    batch, logp, old, ref = _batch()
    loss, metrics = algo.token_loss(batch, logp, old, ref)
    pg, _ = clipped_pg(logp, old, batch["advantages"], 0.2, 0.28)
    kl = k3_kl(logp, ref)
    assert torch.all(kl > 0)
    torch.testing.assert_close(loss, pg + 0.1 * kl)
    torch.testing.assert_close(metrics["actor/ref_kl"], kl)
    assert not GRPO(AlgorithmConfig(grpo=GRPOConfig(kl_coef=0.0))).needs_reference


def test_leave_one_out_baseline_is_the_mean_of_the_other_samples():
    adv = group_advantages([1.0, 0.0, 0.5, 0.5], normalize_by_std=False, baseline="leave_one_out")
    # 1 - (0 + .5 + .5)/3, 0 - (1 + .5 + .5)/3, .5 - (1 + 0 + .5)/3 twice
    np.testing.assert_allclose(adv, [2 / 3, -2 / 3, 0.0, 0.0], atol=1e-12)
    assert group_advantages([0.3], normalize_by_std=False, baseline="leave_one_out") == [0.3]
    # RLOO's advantage has no std: the schema's default normalize_adv_by_std=true leaves it as it is (divided by
    # this group's std, 0.408, it would be 1.633 and -1.633)
    np.testing.assert_allclose(group_advantages([1.0, 0.0, 0.5, 0.5], normalize_by_std=True, baseline="leave_one_out"),
                               [2 / 3, -2 / 3, 0.0, 0.0], atol=1e-12)


def overlong(group_id: int, reward: float, turn_lengths: list[int], cap: int) -> Trajectory:
    """A trajectory whose model turns have the given lengths, sampled with a per-turn cap of `cap` tokens."""
    spans, start = [], 0
    for n in turn_lengths:
        spans.append((start, start + n))
        start += n
    t = traj(group_id, reward, [1] * start)
    t.turn_spans, t.max_turn_tokens = spans, cap
    return t


def test_overlong_penalty_is_zero_then_linear_over_the_buffer_then_full():
    # cap 12, buffer 4: free up to 8 tokens, -penalty/4 per token after, -penalty at the cap.
    assert [overlong_penalty(overlong(0, 1.0, [n], 12), 4, 0.5) for n in (3, 8, 9, 10, 12)] == \
        [0.0, 0.0, -0.125, -0.25, -0.5]
    assert overlong_penalty(overlong(0, 1.0, [2, 11, 5], 12), 4, 1.0) == -0.75  # the longest turn counts
    assert overlong_penalty(overlong(0, 1.0, [12], 12), 0, 1.0) == 0.0          # buffer 0: off


def test_overlong_shaping_gives_an_all_correct_group_a_signal():
    algo = GRPO(AlgorithmConfig(grpo=GRPOConfig(normalize_adv_by_std=False, overlong_buffer=4)))
    short, long_ = overlong(0, 1.0, [5], 12), overlong(0, 1.0, [12], 12)
    kept, metrics = algo.prepare([short, long_])
    assert kept == [short, long_]
    # shaped rewards 1.0 and 0.0: advantages +0.5 and -0.5 on every action token
    np.testing.assert_allclose(short.advantages, 0.5)
    np.testing.assert_allclose(long_.advantages, -0.5)
    assert metrics["grpo/overlong_penalty_mean"] == -0.5
    assert GRPO(AlgorithmConfig(grpo=GRPOConfig())).prepare([overlong(0, 1.0, [5], 12),
                                                             overlong(0, 1.0, [12], 12)])[0] == []


def test_refill_groups_replaces_uninformative_groups_from_more_rounds():
    informative = lambda rewards: max(rewards) > min(rewards)  # noqa: E731
    rounds = {1: [[1, 1], [0, 1]], 2: [[0, 0], [1, 0], [0, 1]]}
    drawn_rounds = []

    def roll_more(round_):
        drawn_rounds.append(round_)
        return rounds[round_]

    first = [[0, 0], [1, 0], [1, 1]]
    groups, drawn = refill_groups(first, informative, roll_more, needed=3, rounds=5)
    assert (groups, drawn, drawn_rounds) == ([[1, 0], [0, 1], [1, 0]], 2, [1, 2])
    # rounds run out: uninformative groups fill the rest, in the order they came
    groups, drawn = refill_groups(first, informative, lambda r: [[1, 1]], needed=3, rounds=1)
    assert (groups, drawn) == ([[1, 0], [0, 0], [1, 1]], 1)
    # no rounds (the default): the first groups exactly as rolled out
    assert refill_groups(first, informative, roll_more, needed=3, rounds=0) == (first, 0)
    assert refill_groups([[0, 1]] * 3, informative, roll_more, needed=3, rounds=4) == ([[0, 1]] * 3, 0)
