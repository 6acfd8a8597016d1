"""Creating the actor groups: resources from the config, the runtime environment, readiness with a deadline."""
from __future__ import annotations

import socket

import ray

from lopd_ray.utils.runtime import actor_runtime_env
from lopd_ray.utils.waiting import DeadlineError, wait_all


@ray.remote
def _node_address() -> tuple[str, int]:
    """An address and a free port on the node this task lands on (the rendezvous for rank 0)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return ray.util.get_node_ip_address(), s.getsockname()[1]


def _group(cls, name: str, num_cpus: float, num_gpus: float, args_per_actor: list[tuple], timeout_s: float) -> list:
    remote = ray.remote(cls).options(num_cpus=num_cpus, num_gpus=num_gpus,
                                     runtime_env=actor_runtime_env("gpu" if num_gpus > 0 else "cpu"))
    actors = [remote.remote(*args) for args in args_per_actor]
    names = [f"{name}[{i}]" for i in range(len(actors))]
    try:
        wait_all([a.__ray_ready__.remote() for a in actors], timeout_s, f"startup of {name}s", names,
                 setting="ray.startup_timeout_s", log_every_s=30.0)
    except DeadlineError as exc:
        raise RuntimeError(f"{exc}. Check `ray status` for pending resources.") from None
    return actors


def _data_parallel_group(cls, cfg, model_path: str, size: int, num_cpus: float, num_gpus: float) -> list:
    """Ranks of one torch.distributed group; they rendezvous at a free port on the driver's node (a placement
    group would pin it to rank 0's node on a cluster)."""
    addr, port = ray.get(_node_address.options(num_cpus=0).remote())
    args = [(cfg, model_path, rank, size, addr, port) for rank in range(size)]
    return _group(cls, cls.__name__, num_cpus, num_gpus, args, cfg.ray.startup_timeout_s)


def build_learners(cfg, model_path: str) -> list:
    from lopd_ray.learner.policy_learner import PolicyLearner

    le = cfg.learner
    return _data_parallel_group(PolicyLearner, cfg, model_path, le.num_learners, le.cpus_per_learner,
                                le.gpus_per_learner)


def build_rollout_workers(cfg, model_path: str) -> list:
    from lopd_ray.rollout.worker import RolloutWorker

    ro = cfg.rollout
    return _group(RolloutWorker, "RolloutWorker", ro.cpus_per_worker, ro.gpus_per_worker,
                  [(cfg, model_path)] * ro.num_workers, cfg.ray.startup_timeout_s)


def build_teachers(cfg, model_path: str) -> list:
    from lopd_ray.teacher.worker import TeacherWorker

    te = cfg.teacher
    return _data_parallel_group(TeacherWorker, cfg, model_path, te.num_workers, te.cpus_per_worker,
                                te.gpus_per_worker)


def build_bank(cfg):
    from lopd_ray.bank.bank import ExperienceBank

    bc = cfg.bank
    return _group(ExperienceBank, "ExperienceBank", bc.cpus, bc.gpus, [(bc,)], cfg.ray.startup_timeout_s)[0]
