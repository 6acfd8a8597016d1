"""Per-token arrays go from the actor that makes them to the actor that uses them by object reference: the driver's
trajectories never hold the wide ones, the driver sends no rollout array twice, the user gets exactly what the
makers made, and the arrays outlive their makers."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import ray
from conftest import kill

from lopd_ray.data.by_reference import attach_ref, fetch_arrays, views_with
from lopd_ray.data.signals import SIGNALS, ship
from lopd_ray.data.trajectory import Trajectory

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def trajectories(count: int) -> list[Trajectory]:
    out = []
    for uid in range(count):
        t = Trajectory("t", 0, [1, 2], list(range(3 + uid)), [1] * (3 + uid), [(0, 3 + uid)], [-0.5] * (3 + uid), 0)
        t.uid = uid
        out.append(t)
    return out


def wide(t: Trajectory, salt: int) -> np.ndarray:
    return np.arange(len(t.response_ids) * 4, dtype=np.float32).reshape(-1, 4) + 100 * t.uid + salt


class Roller:
    """A rollout-worker-like actor: returns trajectories, arrays and all."""

    def rollout(self, count: int):
        return trajectories(count)


class Maker:
    """A teacher-like actor: per trajectory an [R] signal for the driver and [R, 4] arrays in a blob."""

    @ray.method(num_returns=2)
    def score(self, trajs):
        return ship({t.uid: {"teacher_logprobs": np.full(len(t.response_ids), -1.0, dtype=np.float32),
                             "teacher_topm_logprobs": wide(t, 1)} for t in trajs})


class User:
    """A learner-like actor: fetches what its trajectories' references hold."""

    def read(self, trajs):
        fetch_arrays(trajs)
        return [(t.uid, None if t.teacher_topm_logprobs is None else t.teacher_topm_logprobs.copy(),
                 None if t.student_topm_logprobs is None else t.student_topm_logprobs.copy(),
                 t.response_ids.copy(), t.rollout_logprobs.copy()) for t in trajs]


def test_wide_arrays_reach_the_user_by_reference_and_outlive_their_maker(ray_cluster):
    roller = ray.remote(Roller).remote()
    rolled = roller.rollout.remote(5)
    trajs = ray.get(rolled)
    for position, t in enumerate(trajs):
        t.rollout_ref = (rolled, position)
    makers = [ray.remote(Maker).remote() for _ in range(2)]
    shards = [trajs[:3], trajs[3:]]
    calls = [maker.score.remote(shard) for maker, shard in zip(makers, shards)]
    assert [{uid: list(row) for uid, row in light.items()} for light in ray.get([light for light, _ in calls])] == [
        {0: ["teacher_logprobs"], 1: ["teacher_logprobs"], 2: ["teacher_logprobs"]},
        {3: ["teacher_logprobs"], 4: ["teacher_logprobs"]}]  # the wide ones are not in what the driver reads
    for shard, (_, blob) in zip(shards, calls):
        attach_ref(shard, blob)
    assert all(t.teacher_topm_logprobs is None for t in trajs)  # the driver never fetched them
    # a second blob for some of them, from the driver's own put (a learner's answer)
    attach_ref(trajs[1:4], ray.put(ship({t.uid: {"student_topm_logprobs": wide(t, 2)} for t in trajs[1:4]})[1]))
    for maker in makers + [roller]:
        kill(maker)  # the driver owns the blobs: they outlive the actors that made them
    views = views_with(trajs[::-1], ("response_ids", "rollout_logprobs"))
    assert all(v.response_ids is None and v.rollout_logprobs is None for v in views)  # shipped by the rollout
    got = ray.get(ray.remote(User).remote().read.remote(views))
    assert [uid for uid, *_ in got] == [4, 3, 2, 1, 0]
    for (uid, teacher, student, response, rollout_logprobs), t in zip(got, trajs[::-1]):
        np.testing.assert_array_equal(response, t.response_ids)
        np.testing.assert_array_equal(rollout_logprobs, t.rollout_logprobs)
        np.testing.assert_array_equal(teacher, wide(t, 1))
        if uid in (1, 2, 3):
            np.testing.assert_array_equal(student, wide(t, 2))
        else:
            assert student is None


def test_only_wide_signals_travel_by_reference_and_views_carry_only_the_fields_asked_for():
    t = trajectories(1)[0]
    with pytest.raises(ValueError, match="teacher_logprob_typo"):
        ship({0: {"teacher_logprob_typo": np.zeros(3)}})
    held, blob = ship({0: {"teacher_logprobs": np.zeros(3), "teacher_hidden": np.zeros((3, 2))}, 1: {}})
    assert list(held[0]) == ["teacher_logprobs"] and list(blob[0]) == ["teacher_hidden"] and 1 not in held
    # every declared signal is a field of the trajectory, converted to its dtype
    filled = Trajectory("t", 0, [1], [2], [1], [(0, 1)], [0.0], 0, **{name: [0] for name in SIGNALS})
    assert {name: getattr(filled, name).dtype for name in SIGNALS} == {name: s.dtype for name, s in SIGNALS.items()}
    t.teacher_logprobs = np.zeros(3, dtype=np.float32)
    (view,) = views_with([t], ("response_ids", "loss_mask"))  # a trajectory the rollout did not ship
    assert view.rollout_logprobs is None and view.teacher_logprobs is None and view.prompt_ids is None
    assert view.response_ids is t.response_ids and view.uid == t.uid and t.rollout_logprobs is not None
