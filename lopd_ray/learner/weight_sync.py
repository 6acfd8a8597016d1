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
        self.learners, self.workers, self.followers, self.timeout_s = learners, workers, list(followers), timeout_s
        self.learner_names = [f"PolicyLearner[{i}]" for i in range(len(learners))]
        self.receiver_names = ([f"RolloutWorker[{i}]" for i in range(len(workers))]
                               + [f"TeacherWorker[{i}]" for i in range(len(self.followers))])

    def push(self, version: int) -> dict[str, float]:
        raise NotImplementedError


class ObjectStoreSync(WeightSync):
    """Rank 0 puts one safetensors blob in the object store; each worker pulls it and checks every tensor."""

    def push(self, version: int) -> dict[str, float]:
        exports = [learner.export_weights.remote() for learner in self.learners]
        wait_all(exports, self.timeout_s, "export", self.learner_names, error=WeightSyncError)
        loads = [worker.update_weights.remote(version, exports[0]) for worker in self.workers]
        loads += [follower.follow_student.remote(version, exports[0]) for follower in self.followers]
        results = wait_all(loads, self.timeout_s, "load", self.receiver_names, error=WeightSyncError)
        for name, result in zip(self.receiver_names, results):
            if result["corrupt"] or result["version"] != version:
                raise WeightSyncError(f"weight sync phase 'verify': {name} received corrupt tensors "
                                      f"{result['corrupt'][:5]} for version {version}")
        return {"sync/version": float(version)}


WEIGHT_SYNCS = {"object_store": ObjectStoreSync}
