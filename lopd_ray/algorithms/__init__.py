"""Algorithm registry: `algorithm.name` -> Algorithm class.

grpo is GRPO and its options (DAPO, Dr.GRPO, RLOO); distill is on-policy distillation from a teacher with a privileged
context, of which OPSD, OP2SD, SDFT, SDPO, Skill-SD, H2SD, DualOPSD, DOPD and OPD are recipes; lopd and usd add a
hook of their own to it (LOPD's composer step, USD's multiplier); reward_weighted is CONTRIBUTING.md's worked
example. H2SD, USD, DualOPSD and DOPD are built from their
abstracts only: their mechanisms are this project's reading of them, not their papers' or official code's."""
from lopd_ray.algorithms.base import Algorithm
from lopd_ray.algorithms.distill import Distill
from lopd_ray.algorithms.grpo import GRPO
from lopd_ray.algorithms.lopd import LOPD
from lopd_ray.algorithms.reward_weighted import RewardWeighted
from lopd_ray.algorithms.usd import USD

ALGORITHMS: dict[str, type[Algorithm]] = {"grpo": GRPO, "distill": Distill, "lopd": LOPD, "usd": USD,
                                          "reward_weighted": RewardWeighted}


def make_algorithm(cfg) -> Algorithm:
    return ALGORITHMS[cfg.name](cfg)


__all__ = ["ALGORITHMS", "Algorithm", "make_algorithm"]
