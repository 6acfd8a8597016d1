"""The driver's side of the experience-bank actor. A bank actor that dies is replaced by a new one (up to
`bank.max_restarts` times a run) whose state is rebuilt from what the keeper holds: the last snapshot (or how the run
first filled the bank) and every entry added since, kept until the next snapshot. Everyone holds `keeper.handle`,
which always reaches the current actor; a call that finds the bank dead is answered once the new one is ready."""
from __future__ import annotations

import os
from typing import Callable, Optional, TypeVar

import ray
from ray.exceptions import RayActorError

from lopd_ray.bank.traces import BankEntry
from lopd_ray.errors import ActorLostError

T = TypeVar("T")


class CurrentBank:
    """Forwards `.method.remote(...)` to the keeper's current bank actor."""

    def __init__(self, keeper: "BankKeeper"):
        self._keeper = keeper

    def __getattr__(self, name: str):
        return getattr(self._keeper.actor, name)


class BankKeeper:
    def __init__(self, actor, new_actor: Callable[[], object], fill_initially: Callable[[object], None],
                 max_restarts: int):
        """`new_actor()` starts a replacement and waits until it is ready; `fill_initially(handle)` fills a bank
        as the run's step 0 did."""
        self.actor, self.new_actor, self.fill_initially = actor, new_actor, fill_initially
        self.max_restarts = max_restarts
        self.handle = CurrentBank(self)
        self.snapshot_dir: Optional[str] = None
        self.added_since: list[BankEntry] = []
        self.restarts = 0

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()`, which uses `handle`; if the bank died under it, again once a new bank holds the same state."""
        try:
            return fn()
        except RayActorError as exc:
            if getattr(exc, "actor_id", None) != self.actor._actor_id.hex():
                raise
            self.replace(str(exc).splitlines()[0][:200])
            return fn()

    def add(self, entries: list[BankEntry]) -> None:
        """Kept first, so that a replacement gets them too; a bank ignores an entry id it already holds."""
        self.added_since += entries
        self.call(lambda: ray.get(self.handle.add.remote(entries)))

    def snapshot(self, directory: str) -> None:
        self.call(lambda: ray.get(self.handle.snapshot.remote(directory)))

    def snapshot_kept(self, checkpoint_dir: str) -> None:
        """The checkpoint with the bank's snapshot is complete: the entries before it are safe there."""
        self.snapshot_dir, self.added_since = os.path.join(checkpoint_dir, "bank"), []

    def replace(self, why: str) -> None:
        if self.restarts >= self.max_restarts:
            raise ActorLostError(f"ExperienceBank died ({why}) after {self.restarts} replacements (bank.max_restarts="
                                 f"{self.max_restarts}); `run.resume=auto` continues from the last checkpoint")
        self.restarts += 1
        ray.kill(self.actor)
        self.actor = self.new_actor()
        if self.snapshot_dir is not None:
            ray.get(self.handle.restore.remote(self.snapshot_dir))
        else:
            self.fill_initially(self.handle)
        if self.added_since:
            ray.get(self.handle.add.remote(self.added_since))
