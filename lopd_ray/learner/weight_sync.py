"""The WeightSync seam: learner rank 0 -> every rollout worker, versioned, verified, with a timeout per phase.

Callers only use `push(version)` and `push_to(workers, version)` (a replaced worker catching up), on the run's
actor groups (utils/actor_group.py). `object_store`
ships one checksummed safetensors blob through Ray's object store; `collective` broadcasts bucketed tensors over a
torch.distributed group of the learner and the receivers (gloo on CPU, nccl on GPU).
"""
from __future__ import annotations

import uuid
from typing import Optional, Sequence

from lopd_ray.modeling.weight_channel import Channel
from lopd_ray.config import SHARDING_ENGINES
from lopd_ray.utils.actor_group import ActorGroup
from lopd_ray.utils.waiting import DeadlineError, wait_all


class WeightSyncError(DeadlineError):
    pass


class WeightSync:
    """Pushes the learners' weights to the rollout workers (an exact copy) and to `followers` (teachers whose
    weights track the student, live or as an EMA)."""

    def __init__(self, cfg, learners: ActorGroup, workers: ActorGroup, followers: Optional[ActorGroup] = None):
        # The caller's groups: an actor replaced in them receives the next pushes.
        self.cfg, self.learners, self.workers = cfg, learners, workers
        self.followers = followers if followers is not None else ActorGroup("TeacherWorker",
                                                                            transport=learners.transport)
        self.timeout_s = cfg.sync.timeout_s
        self.version = -1  # the last version pushed

    def push(self, version: int) -> dict[str, float]:
        """The learners' weights of `version` to every rollout worker and follower."""
        self.push_to(range(len(self.workers)), version, with_followers=True)
        self.version = version
        return {"sync/version": float(version)}

    def push_to(self, workers: Sequence[int], version: int, with_followers: bool = False) -> None:
        """The weights of `version` to the rollout workers at positions `workers` (and the followers)."""
        raise NotImplementedError

    def receivers(self, workers: Sequence[int], with_followers: bool) -> list[tuple[ActorGroup, list[int]]]:
        return [(self.workers, list(workers))] + [(self.followers, list(range(len(self.followers))))] * with_followers

    def wait(self, pending: list, phase: str):
        """Every call of `pending` within sync.timeout_s, the answers in order, in one deadline."""
        refs = [ref for calls in pending for ref in calls.answer_refs]
        names = [calls.group.names()[i] for calls in pending for i in calls.members]
        return wait_all(refs, self.timeout_s, phase, names, error=WeightSyncError, transport=self.learners.transport)

    def check(self, pending: list, results: list[dict], version: int) -> None:
        names = [calls.group.names()[i] for calls in pending for i in calls.members]
        for name, result in zip(names, results):
            if result["corrupt"] or result["version"] != version:
                raise WeightSyncError(f"weight sync phase 'verify': {name} received corrupt tensors "
                                      f"{result['corrupt'][:5]} for version {version}")


class ObjectStoreSync(WeightSync):
    """Rank 0 puts one safetensors blob in the object store; each worker pulls it and checks every tensor."""

    def push_to(self, workers: Sequence[int], version: int, with_followers: bool = False) -> None:
        exports = self.learners.start("export_weights")
        self.wait([exports], "export")
        export = exports.answer_refs[0]
        loads = [group.start({"RolloutWorker": "update_weights", "TeacherWorker": "follow_student"}[group.kind],
                             version, export, members=members)
                 for group, members in self.receivers(workers, with_followers)]
        self.check(loads, self.wait(loads, "load"), version)


class CollectiveSync(WeightSync):
    """Rank 0 broadcasts to every receiver at once over a channel (lopd_ray/modeling/weight_channel.py): no copy
    through the object store, no per-tensor checksums (the sync probe checks the result). A channel is opened for
    a set of receivers and kept while it stays the same; a replaced actor gets a new one."""

    def __init__(self, cfg, learners: ActorGroup, workers: ActorGroup, followers: Optional[ActorGroup] = None):
        super().__init__(cfg, learners, workers, followers)
        self.receivers_open: tuple = ()  # the actors of the open channel
        self.buckets: list = []
        self.channels_opened = 0
        # Channels meet under their name on learner rank 0's one store: another sync's must never match theirs.
        self.name_prefix = f"weights-{uuid.uuid4().hex[:12]}-"
        # NCCL wants a GPU of its own per rank: members that share one (fractional shares) go through gloo, their
        # tensors staged in host memory.
        shares = [cfg.learner.gpus_per_learner, cfg.rollout.gpus_per_worker] + [cfg.teacher.gpus_per_worker] * bool(
            self.followers)
        self.backend = "nccl" if all(share >= 1 for share in shares) else "gloo"
        ro = cfg.rollout
        self.ranks_per_worker = ro.tensor_parallel_size if ro.engine in SHARDING_ENGINES else 1

    def push_to(self, workers: Sequence[int], version: int, with_followers: bool = False) -> None:
        receivers = self.receivers(workers, with_followers)
        try:
            self.open_channel(receivers)
            sends = self.learners.start("broadcast_weights")
            loads = [group.start({"RolloutWorker": "receive_weights", "TeacherWorker": "follow_broadcast"}[group.kind],
                                 version, self.buckets, members=members) for group, members in receivers]
            results = self.wait([sends, *loads], "broadcast")
        except Exception:
            self.receivers_open = ()  # a broadcast cut short leaves the channel unusable
            raise
        self.check(loads, results[len(self.learners):], version)

    def open_channel(self, receivers: list[tuple[ActorGroup, list[int]]]) -> None:
        members = [(group, i) for group, indices in receivers for i in indices]
        opened_for = tuple(group.transport.actor_id(group[i]) for group, i in members)
        if opened_for == self.receivers_open:
            return
        host, port = self.learners.first("weight_channel_address")
        per_worker = self.ranks_per_worker
        workers = [i for group, i in members if group is self.workers]
        channel = Channel(host, port, f"{self.name_prefix}{self.channels_opened}",
                          1 + per_worker * len(workers) + len(members) - len(workers), self.backend,
                          self.timeout_s).as_dict()
        self.channels_opened += 1
        joins = [self.learners.start("open_weight_channel", channel, int(self.cfg.sync.bucket_mb * 2**20),
                                     members=[0])]
        first_rank = 1
        for group, indices in receivers:
            width = per_worker if group is self.workers else 1
            joins += [group.start("open_weight_channel", channel, first_rank + width * k, members=[i])
                      for k, i in enumerate(indices)]
            first_rank += width * len(indices)
        self.buckets = self.wait(joins, "open channel")[0]
        self.receivers_open = opened_for


WEIGHT_SYNCS = {"object_store": ObjectStoreSync, "collective": CollectiveSync}
