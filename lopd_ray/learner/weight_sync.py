"""The WeightSync seam: learner rank 0 -> every rollout worker, versioned, verified, with a timeout per phase.

Callers only use `push(version)`; `cuda_ipc` (colocated) and `nccl` (disaggregated) register here too.
"""
from __future__ import annotations

from lopd_ray.utils.waiting import DeadlineError, wait_all


class WeightSyncError(DeadlineError):
    pass


class WeightSync:
    """Pushes the learners' weights to the rollout workers (`update_weights`: an exact copy) and to `followers`
    (`follow_student`: teachers whose weights track the student, live or as an EMA)."""

    def __init__(self, learners: list, workers: list, timeout_s: float, followers: list = ()):
        # `workers` and `followers` are the caller's lists: an actor replaced in them receives the next pushes.
        self.learners, self.workers, self.followers, self.timeout_s = learners, workers, followers, timeout_s
        self.learner_names = [f"PolicyLearner[{i}]" for i in range(len(learners))]
        self.version = -1  # the last version pushed

    def push(self, version: int) -> dict[str, float]:
        """The learners' weights of `version` to every rollout worker and follower."""
        self.push_to(self.workers, version, self.followers)
        self.version = version
        return {"sync/version": float(version)}

    def push_to(self, workers: list, version: int, followers: list = ()) -> None:
        raise NotImplementedError


class ObjectStoreSync(WeightSync):
    """Rank 0 puts one safetensors blob in the object store; each worker pulls it and checks every tensor."""

    def push_to(self, workers: list, version: int, followers: list = ()) -> None:
        exports = [learner.export_weights.remote() for learner in self.learners]
        wait_all(exports, self.timeout_s, "export", self.learner_names, error=WeightSyncError)
        loads = [worker.update_weights.remote(version, exports[0]) for worker in workers]
        loads += [follower.follow_student.remote(version, exports[0]) for follower in followers]
        names = ([f"RolloutWorker[{self.workers.index(w)}]" for w in workers]
                 + [f"TeacherWorker[{i}]" for i in range(len(followers))])
        results = wait_all(loads, self.timeout_s, "load", names, error=WeightSyncError)
        for name, result in zip(names, results):
            if result["corrupt"] or result["version"] != version:
                raise WeightSyncError(f"weight sync phase 'verify': {name} received corrupt tensors "
                                      f"{result['corrupt'][:5]} for version {version}")


WEIGHT_SYNCS = {"object_store": ObjectStoreSync}
