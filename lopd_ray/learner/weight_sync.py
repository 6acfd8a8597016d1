"""The WeightSync seam: learner rank 0 -> every rollout worker, versioned, verified, with a timeout per phase.

Callers only use `push(version)` and `push_to(workers, version)` (a replaced worker catching up). `object_store`
ships one checksummed safetensors blob through Ray's object store; `collective` broadcasts bucketed tensors over a
torch.distributed group of the learner and the receivers (gloo on CPU, nccl on GPU).
"""
from __future__ import annotations

import uuid

import ray

from lopd_ray.learner.weight_channel import Channel
from lopd_ray.config import SHARDING_ENGINES
from lopd_ray.utils.waiting import DeadlineError, wait_all


class WeightSyncError(DeadlineError):
    pass


class WeightSync:
    """Pushes the learners' weights to the rollout workers (an exact copy) and to `followers` (teachers whose
    weights track the student, live or as an EMA)."""

    def __init__(self, cfg, learners: list, workers: list, followers: list = ()):
        # `workers` and `followers` are the caller's lists: an actor replaced in them receives the next pushes.
        self.cfg, self.learners, self.workers, self.followers = cfg, learners, workers, followers
        self.timeout_s = cfg.sync.timeout_s
        self.learner_names = [f"PolicyLearner[{i}]" for i in range(len(learners))]
        self.version = -1  # the last version pushed

    def push(self, version: int) -> dict[str, float]:
        """The learners' weights of `version` to every rollout worker and follower."""
        self.push_to(self.workers, version, self.followers)
        self.version = version
        return {"sync/version": float(version)}

    def push_to(self, workers: list, version: int, followers: list = ()) -> None:
        raise NotImplementedError

    def receiver_names(self, workers: list, followers: list) -> list[str]:
        return ([f"RolloutWorker[{self.workers.index(w)}]" for w in workers]
                + [f"TeacherWorker[{i}]" for i in range(len(followers))])

    def check(self, names: list[str], results: list[dict], version: int) -> None:
        for name, result in zip(names, results):
            if result["corrupt"] or result["version"] != version:
                raise WeightSyncError(f"weight sync phase 'verify': {name} received corrupt tensors "
                                      f"{result['corrupt'][:5]} for version {version}")


class ObjectStoreSync(WeightSync):
    """Rank 0 puts one safetensors blob in the object store; each worker pulls it and checks every tensor."""

    def push_to(self, workers: list, version: int, followers: list = ()) -> None:
        exports = [learner.export_weights.remote() for learner in self.learners]
        wait_all(exports, self.timeout_s, "export", self.learner_names, error=WeightSyncError)
        loads = [worker.update_weights.remote(version, exports[0]) for worker in workers]
        loads += [follower.follow_student.remote(version, exports[0]) for follower in followers]
        names = self.receiver_names(workers, followers)
        self.check(names, wait_all(loads, self.timeout_s, "load", names, error=WeightSyncError), version)


class CollectiveSync(WeightSync):
    """Rank 0 broadcasts to every receiver at once over a channel (lopd_ray/learner/weight_channel.py): no copy
    through the object store, no per-tensor checksums (the sync probe checks the result). A channel is opened for
    a set of receivers and kept while it stays the same; a replaced actor gets a new one."""

    def __init__(self, cfg, learners: list, workers: list, followers: list = ()):
        super().__init__(cfg, learners, workers, followers)
        self.receivers: tuple = ()  # the actors of the open channel
        self.buckets: list = []
        self.channels_opened = 0
        # Channels meet under their name on learner rank 0's one store: another sync's must never match theirs.
        self.name_prefix = f"weights-{uuid.uuid4().hex[:12]}-"
        # NCCL wants a GPU of its own per rank: members that share one (fractional shares) go through gloo, their
        # tensors staged in host memory.
        shares = [cfg.learner.gpus_per_learner, cfg.rollout.gpus_per_worker] + [cfg.teacher.gpus_per_worker] * bool(
            followers)
        self.backend = "nccl" if all(share >= 1 for share in shares) else "gloo"
        ro = cfg.rollout
        self.ranks_per_worker = ro.tensor_parallel_size if ro.engine in SHARDING_ENGINES else 1

    def push_to(self, workers: list, version: int, followers: list = ()) -> None:
        names = self.receiver_names(workers, followers)
        try:
            self.open_channel(workers, followers, names)
            sends = [learner.broadcast_weights.remote() for learner in self.learners]
            loads = [worker.receive_weights.remote(version, self.buckets) for worker in workers]
            loads += [follower.follow_broadcast.remote(version, self.buckets) for follower in followers]
            results = wait_all(sends + loads, self.timeout_s, "broadcast", self.learner_names + names,
                               error=WeightSyncError)
        except Exception:
            self.receivers = ()  # a broadcast cut short leaves the channel unusable
            raise
        self.check(names, results[len(sends):], version)

    def open_channel(self, workers: list, followers: list, names: list[str]) -> None:
        receivers = tuple(actor._actor_id for actor in [*workers, *followers])
        if receivers == self.receivers:
            return
        host, port = ray.get(self.learners[0].weight_channel_address.remote())
        per_worker = self.ranks_per_worker
        channel = Channel(host, port, f"{self.name_prefix}{self.channels_opened}",
                          1 + per_worker * len(workers) + len(followers), self.backend, self.timeout_s).as_dict()
        self.channels_opened += 1
        joins = [self.learners[0].open_weight_channel.remote(channel, int(self.cfg.sync.bucket_mb * 2**20))]
        joins += [w.open_weight_channel.remote(channel, 1 + per_worker * i) for i, w in enumerate(workers)]
        joins += [f.open_weight_channel.remote(channel, 1 + per_worker * len(workers) + i)
                  for i, f in enumerate(followers)]
        self.buckets = wait_all(joins, self.timeout_s, "open channel", self.learner_names[:1] + names,
                                error=WeightSyncError)[0]
        self.receivers = receivers


WEIGHT_SYNCS = {"object_store": ObjectStoreSync, "collective": CollectiveSync}
