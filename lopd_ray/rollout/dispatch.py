"""Running shards of work on the rollout workers so that one worker's death or hang costs a restart, not the run:
a worker whose call raises RayActorError (it died) or does not answer within the deadline is replaced by
`replace(i)` (a new actor holding the current weights) and its shard runs again there."""
from __future__ import annotations

import time
from typing import Callable

import ray
from ray.exceptions import RayActorError

from lopd_ray.errors import RolloutError
from lopd_ray.utils.watchdog import mark_progress


class WorkerCalls:
    """`workers[i].method(shards[i])` for every i, started now; `finish()` waits for the answers (worker order) and
    says how many workers were replaced (`answer_refs`: the object reference of each answer). `replace(i)` puts a
    new actor at workers[i]; past `max_restarts` replacements the step stops with a RolloutError naming the
    worker."""

    def __init__(self, workers: list, method: str, shards: list[list], replace: Callable[[int], None],
                 timeout_s: float, max_restarts: int):
        self.workers, self.method, self.shards, self.replace = workers, method, shards, replace
        self.timeout_s, self.max_restarts = timeout_s, max_restarts
        self.calls = {getattr(w, method).remote(shard): i for i, (w, shard) in enumerate(zip(workers, shards))}
        self.deadline = time.monotonic() + timeout_s
        self.restarts = 0
        self.answer_refs: list = [None] * len(workers)

    def _restart(self, i: int, why: str) -> None:
        if self.restarts >= self.max_restarts:
            raise RolloutError(f"RolloutWorker[{i}] {why}, after {self.restarts} replacements this step (rollout."
                               f"max_worker_restarts={self.max_restarts}); `run.resume=auto` continues from the last "
                               f"checkpoint")
        self.restarts += 1
        ray.kill(self.workers[i])
        self.replace(i)
        self.calls[getattr(self.workers[i], self.method).remote(self.shards[i])] = i
        self.deadline = time.monotonic() + self.timeout_s

    def finish(self) -> tuple[list, int]:
        answers: list = [None] * len(self.workers)
        while self.calls:
            ready, _ = ray.wait(list(self.calls), num_returns=1, timeout=max(0.0, self.deadline - time.monotonic()))
            if not ready:
                for ref, i in list(self.calls.items()):
                    del self.calls[ref]
                    self._restart(i, f"did not answer within rollout.worker_timeout_s={self.timeout_s:g}")
                continue
            i = self.calls.pop(ready[0])
            mark_progress()
            try:
                answers[i], self.answer_refs[i] = ray.get(ready[0]), ready[0]
            except RayActorError as exc:
                self._restart(i, f"died ({str(exc).splitlines()[0][:200]})")
        return answers, self.restarts


def run_on_workers(workers: list, method: str, shards: list[list], replace: Callable[[int], None], timeout_s: float,
                   max_restarts: int) -> tuple[list[list], int]:
    """WorkerCalls started and finished: the answers in worker order and how many workers were replaced."""
    return WorkerCalls(workers, method, shards, replace, timeout_s, max_restarts).finish()


def run_counted(workers: list, method: str, requests: list, what: str, *args, updates_per_worker: int = 10) -> list:
    """`method(chunk, *args)` over `requests` in chunks, each to whichever worker is free, with a progress bar
    counting finished requests (`what`); the answers in request order. For the commands that run many episodes at
    once (evaluation, bank build); chunks stay large enough for the engine to batch."""
    from tqdm import tqdm

    size = max(1, -(-len(requests) // (len(workers) * updates_per_worker)))
    chunks = [range(start, min(start + size, len(requests))) for start in range(0, len(requests), size)]
    answers: list = [None] * len(requests)
    free, calls = list(workers), {}
    with tqdm(total=len(requests), desc=what, dynamic_ncols=True) as bar:
        while chunks or calls:
            while free and chunks:
                worker, chunk = free.pop(), chunks.pop(0)
                calls[getattr(worker, method).remote([requests[i] for i in chunk], *args)] = (worker, chunk)
            ready, _ = ray.wait(list(calls), num_returns=1)
            worker, chunk = calls.pop(ready[0])
            for i, answer in zip(chunk, ray.get(ready[0])):
                answers[i] = answer
            free.append(worker)
            bar.update(len(chunk))
    return answers
