"""Algorithm registry: `algorithm.name` -> Algorithm class."""
from lopd_ray.algorithms.base import Algorithm
from lopd_ray.algorithms.distill import Distill
from lopd_ray.algorithms.grpo import GRPO
from lopd_ray.algorithms.lopd import LOPD
from lopd_ray.algorithms.usd import USD

ALGORITHMS: dict[str, type[Algorithm]] = {"grpo": GRPO, "distill": Distill, "lopd": LOPD, "usd": USD}


def make_algorithm(cfg) -> Algorithm:
    return ALGORITHMS[cfg.name](cfg)


__all__ = ["ALGORITHMS", "Algorithm", "make_algorithm"]
