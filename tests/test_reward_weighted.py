"""CONTRIBUTING.md's first worked example: reward-weighted self-distillation's weights against hand-computed ones."""
import numpy as np

from lopd_ray.algorithms import make_algorithm
from lopd_ray.config import AlgorithmConfig, RewardWeightedConfig
from lopd_ray.data.trajectory import TeacherContext, Trajectory


def scored(reward: float) -> Trajectory:
    t = Trajectory("t", 0, np.array([1]), np.array([2, 3, 4]), np.array([1, 1, 0]), [(0, 2)],
                   np.array([-1.0, -1.0, 0.0]), 0, reward=reward)
    t.teacher_context = TeacherContext("the solution", "user_suffix")
    t.teacher_logprobs, t.teacher_entropy = np.array([-0.5, -0.5, 0.0]), np.array([1.0, 1.0, 0.0])
    return t


def test_a_failure_distills_in_full_a_success_at_the_floor_and_a_partial_one_between():
    algo = make_algorithm(AlgorithmConfig(name="reward_weighted", reward_weighted=RewardWeightedConfig(floor=0.1)))
    kept, stats = algo.prepare([scored(0.0), scored(1.0), scored(0.25)])
    assert [list(t.distill_weights) for t in kept] == [[1.0, 1.0, 0.0], [0.1, 0.1, 0.0], [0.75, 0.75, 0.0]]
    assert abs(stats["reward_weighted/weight_mean"] - (1.0 + 0.1 + 0.75) / 3) < 1e-12
