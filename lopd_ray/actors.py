"""Creating the actor groups: resources from the config, the runtime environment, readiness with a deadline."""
from __future__ import annotations

import socket

import ray

from lopd_ray.learner.weight_sync import WeightSyncError, wait_all
from lopd_ray.utils.runtime import actor_runtime_env


def _accelerator(num_gpus: float) -> str:
    return "gpu" if num_gpus > 0 else "cpu"


@ray.remote
def _node_address() -> tuple[str, int]:
    """An address and a free port on the node this task lands on (the rendezvous for rank 0)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return ray.util.get_node_ip_address(), s.getsockname()[1]


def _wait_ready(refs, timeout_s: float, what: str, names: list[str]) -> None:
    try:
        wait_all(refs, timeout_s, f"startup of {what}", names)
    except WeightSyncError as exc:
        raise RuntimeError(f"{exc}. Check `ray status` for pending resources.") from None


def build_learners(cfg, model_path: str) -> list:
    from lopd_ray.learner.policy_learner import PolicyLearner

    le = cfg.learner
    cls = ray.remote(PolicyLearner).options(num_cpus=le.cpus_per_learner, num_gpus=le.gpus_per_learner,
                                            runtime_env=actor_runtime_env(_accelerator(le.gpus_per_learner)))
    # Learners rendezvous at rank 0; a placement group would pin the address to rank 0's node on a cluster.
    addr, port = ray.get(_node_address.options(num_cpus=0).remote())
    learners = [cls.remote(cfg, model_path, rank, le.num_learners, addr, port) for rank in range(le.num_learners)]
    _wait_ready([a.__ray_ready__.remote() for a in learners], cfg.ray.startup_timeout_s, "PolicyLearners",
                [f"PolicyLearner[{i}]" for i in range(len(learners))])
    return learners


def build_rollout_workers(cfg, model_path: str) -> list:
    from lopd_ray.rollout.worker import RolloutWorker

    ro = cfg.rollout
    cls = ray.remote(RolloutWorker).options(num_cpus=ro.cpus_per_worker, num_gpus=ro.gpus_per_worker,
                                            runtime_env=actor_runtime_env(_accelerator(ro.gpus_per_worker)))
    workers = [cls.remote(cfg, model_path) for _ in range(ro.num_workers)]
    _wait_ready([w.__ray_ready__.remote() for w in workers], cfg.ray.startup_timeout_s, "RolloutWorkers",
                [f"RolloutWorker[{i}]" for i in range(len(workers))])
    return workers
