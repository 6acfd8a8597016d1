"""Creating the actor groups (utils/actor_group.py): resources from the config, the runtime environment, readiness
with a deadline, each kind's deadline for a call and how a lost member comes back."""
from __future__ import annotations

import functools
import os
import socket
from typing import Optional

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from lopd_ray.errors import ActorStartError
from lopd_ray.utils.actor_group import ActorGroup, Restart
from lopd_ray.utils.lean_imports import preload_transformers
from lopd_ray.utils.logs import setup_actor_process
from lopd_ray.utils.runtime import runtime_env_vars
from lopd_ray.utils.waiting import DeadlineError, wait_all


@ray.remote
def _node_address() -> tuple[str, int, str]:
    """An address, a free port and the id of the node this task lands on (the rendezvous for rank 0)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return ray.util.get_node_ip_address(), s.getsockname()[1], ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=0)
def _worker_env(keys: list[str]) -> dict[str, Optional[str]]:
    return {key: os.environ.get(key) for key in keys}


@functools.lru_cache(maxsize=4)
def _actor_runtime_env(cluster: str, wanted: tuple[tuple[str, str], ...]) -> Optional[dict]:
    """None where every node's workers already carry the settings (a cluster started by lopd_ray or by
    cluster/*.sh): an actor with a runtime environment cannot take a pooled worker and starts about 2 s slower."""
    keys = [key for key, _ in wanted]
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    found = ray.get([_worker_env.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                     .remote(keys) for node in nodes])
    return None if all(env == dict(wanted) for env in found) else {"env_vars": dict(wanted)}


def actor_runtime_env() -> Optional[dict]:
    return _actor_runtime_env(ray.get_runtime_context().get_job_id(), tuple(sorted(runtime_env_vars().items())))


def _set_up_first(cls, cfg) -> type:
    """`cls` whose process first sets up the run's logging (utils/logs.py) and imports transformers lean."""
    run_dir, level = cfg.run_dir, cfg.run.log_level

    def __init__(self, *args, **kwargs):
        setup_actor_process(run_dir, level, cls.__name__)
        preload_transformers()
        cls.__init__(self, *args, **kwargs)
    return type(cls.__name__, (cls,), {"__init__": __init__, "__qualname__": cls.__qualname__})


def _group(cls, cfg, num_cpus: float, num_gpus: float, args_per_actor: list[tuple], wait: bool = True,
           placements: Optional[list] = None) -> list:
    """Starts the actors (actor i with scheduling strategy `placements[i]` where given); with `wait`, returns once
    they are all ready."""
    remote = ray.remote(_set_up_first(cls, cfg))
    options = {"num_cpus": num_cpus, "num_gpus": num_gpus, "runtime_env": actor_runtime_env()}
    actors = [remote.options(**options, **({"scheduling_strategy": placements[i]} if placements else {})).remote(*args)
              for i, args in enumerate(args_per_actor)]
    if wait:
        wait_ready([ActorGroup(cls.__name__, actors)], cfg.ray.startup_timeout_s)
    return actors


def wait_ready(groups: list[list], timeout_s: float) -> None:
    """Waits for groups started with `wait=False`, so that several groups start side by side."""
    actors = [actor for group in groups for actor in group]
    names = [name for group in groups for name in group.names()]
    transport = groups[0].transport
    try:
        wait_all([transport.submit(a, "__ray_ready__", ()) for a in actors], timeout_s, "actor start-up", names,
                 setting="ray.startup_timeout_s", log_every_s=30.0, transport=transport)
    except DeadlineError as exc:
        raise RuntimeError(f"{exc}. Check `ray status` for pending resources.") from None
    except RayActorError as exc:  # a constructor raised: its last line says why, the actor's log has the traceback
        by_id = {actor._actor_id.hex(): name for actor, name in zip(actors, names)}
        who = by_id.get(getattr(exc, "actor_id", None) or "", "an actor")
        raise ActorStartError(f"{who} failed to start: {str(exc).strip().splitlines()[-1].strip()}") from None


def _placement(name: str, cfg, size: int, num_cpus: float, num_gpus: float, strategy: str):
    """A placement group of `size` bundles (one per actor) and the scheduling strategy into each bundle."""
    bundles = [{"CPU": num_cpus, "GPU": num_gpus} for _ in range(size)]
    group = placement_group(bundles, strategy=strategy)
    try:
        wait_all([group.ready()], cfg.ray.startup_timeout_s, "placement", [f"{name} placement group"],
                 setting="ray.startup_timeout_s")
    except DeadlineError as exc:
        raise RuntimeError(f"{exc}: the cluster cannot hold {size} x {bundles[0]} ({strategy}). "
                           f"Check `ray status`.") from None
    return group, [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i) for i in range(size)]


def _data_parallel_group(kind: str, cls, cfg, model_path: str, size: int, num_cpus: float, num_gpus: float,
                         wait: bool, renew=None) -> ActorGroup:
    """Ranks of one torch.distributed group, rank i in bundle i of a placement group packed onto as few nodes as
    possible; they rendezvous at a free port on the node of rank 0's bundle."""
    group, in_bundle = _placement(kind, cfg, size, num_cpus, num_gpus, "PACK")
    addr, port, node = ray.get(_node_address.options(num_cpus=0, scheduling_strategy=in_bundle[0]).remote())
    args = [(cfg, model_path, rank, size, addr, port) for rank in range(size)]
    return ActorGroup(kind, _group(cls, cfg, num_cpus, num_gpus, args, wait, placements=in_bundle),
                      placement=group, rendezvous_node=node, **group_settings(kind, cfg, renew))


def group_settings(kind: str, cfg, renew=None) -> dict:
    """Each kind's deadline for a call and, given `renew`, how a lost member comes back (learners do not: their
    optimizer state and collectives are the run's)."""
    ro, te, bc = cfg.rollout, cfg.teacher, cfg.bank
    settings = {
        "PolicyLearner": ({"timeout_s": None, "timeout_setting": "sync.timeout_s"}, None),
        "RolloutWorker": ({"timeout_s": ro.worker_timeout_s, "timeout_setting": "rollout.worker_timeout_s"},
                          ("actor", ro.max_worker_restarts, "rollout.max_worker_restarts")),
        "TeacherWorker": ({"timeout_s": te.timeout_s, "timeout_setting": "teacher.timeout_s"},
                          ("group", te.max_restarts, "teacher.max_restarts")),
        "ExperienceBank": ({"timeout_s": None, "timeout_setting": ""}, ("group", bc.max_restarts, "bank.max_restarts")),
    }
    deadline, restart = settings[kind]
    if renew is None or restart is None:
        return deadline
    scope, cap, setting = restart
    return {**deadline, "restart": Restart(scope, renew, cap, setting)}


def build_learners(cfg, model_path: str, wait: bool = True) -> ActorGroup:
    """The learners get teacher.model_path resolved (a built-in name built), for the teacher head they load."""
    import dataclasses

    from lopd_ray.learner.policy_learner import PolicyLearner
    from lopd_ray.models import resolve_model_path

    if cfg.teacher.model_path:
        cfg = dataclasses.replace(cfg, teacher=dataclasses.replace(
            cfg.teacher, model_path=resolve_model_path(cfg.teacher.model_path)))
    le = cfg.learner
    return _data_parallel_group("PolicyLearner", PolicyLearner, cfg, model_path, le.num_learners,
                                le.cpus_per_learner, le.gpus_per_learner, wait)


def rollout_placement(cfg):
    """The rollout workers' placement group (a bundle of rollout.cpus_per_worker CPUs and rollout.gpus_per_worker
    GPUs each, on one node) and the scheduling strategy into each bundle."""
    ro = cfg.rollout
    return _placement("RolloutWorker", cfg, ro.num_workers, ro.cpus_per_worker, ro.gpus_per_worker,
                      ro.placement.upper())


def build_rollout_workers(cfg, model_path: str, wait: bool = True, renew=None) -> ActorGroup:
    """rollout.num_workers workers, one bundle each (`rollout.placement`: packed onto few nodes or spread);
    `renew(i)` replaces a lost one."""
    from lopd_ray.rollout.worker import RolloutWorker

    ro = cfg.rollout
    group, in_bundle = rollout_placement(cfg)
    return ActorGroup("RolloutWorker", _group(RolloutWorker, cfg, ro.cpus_per_worker, ro.gpus_per_worker,
                                              [(cfg, model_path)] * ro.num_workers, wait, placements=in_bundle),
                      placement=group, **group_settings("RolloutWorker", cfg, renew))


def replace_rollout_worker(cfg, model_path: str, workers: ActorGroup, i: int) -> None:
    """A new worker in bundle i, in place of worker i (killed: its bundle is free again)."""
    from lopd_ray.rollout.worker import RolloutWorker

    ro = cfg.rollout
    strategy = PlacementGroupSchedulingStrategy(workers.placement, placement_group_bundle_index=i)
    workers[i] = _group(RolloutWorker, cfg, ro.cpus_per_worker, ro.gpus_per_worker, [(cfg, model_path)],
                        placements=[strategy])[0]


def build_teachers(cfg, model_path: str, wait: bool = True, renew=None) -> ActorGroup:
    """Teachers whose context is latent carry the composer; `renew()` rebuilds a lost group."""
    from lopd_ray.teacher.contexts import CONTEXTS

    if CONTEXTS[cfg.context.name].uses_latents:
        from lopd_ray.teacher.latent_worker import LatentTeacherWorker as worker
    else:
        from lopd_ray.teacher.worker import TeacherWorker as worker
    te = cfg.teacher
    return _data_parallel_group("TeacherWorker", worker, cfg, model_path, te.num_workers, te.cpus_per_worker,
                                te.gpus_per_worker, wait, renew)


def build_bank(cfg, wait: bool = True, renew=None) -> ActorGroup:
    """The experience bank, a group of one; `renew()` replaces a lost one."""
    from lopd_ray.bank.bank import ExperienceBank

    bc = cfg.bank
    return ActorGroup("ExperienceBank", _group(ExperienceBank, cfg, bc.cpus, bc.gpus, [(bc,)], wait),
                      **group_settings("ExperienceBank", cfg, renew))
