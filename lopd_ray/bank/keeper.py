"""What a replacement bank needs to hold the lost one's state: the last snapshot (or how the run first filled the
bank) and every entry added since, kept until the next snapshot. The bank group's restart (bank.max_restarts times
a run) calls `renew()`; every call on the group that finds the bank dead is answered by the new one."""
from __future__ import annotations

import os
from typing import Callable, Optional

from lopd_ray.bank.traces import BankEntry


class BankKeeper:
    def __init__(self, new_actor: Callable[[], object], fill_initially: Callable[[object], None]):
        """`new_actor()` starts a replacement actor and waits until it is ready; `fill_initially(bank)` fills the
        bank group as the run's step 0 did."""
        self.new_actor, self.fill_initially = new_actor, fill_initially
        self.bank = None  # the group, once built with `renew` as its restart
        self.snapshot_dir: Optional[str] = None
        self.added_since: list[BankEntry] = []

    def add(self, entries: list[BankEntry]) -> None:
        """Kept first, so that a replacement gets them too; a bank ignores an entry id it already holds."""
        self.added_since += entries
        self.bank.first("add", entries)

    def snapshot_kept(self, checkpoint_dir: str) -> None:
        """The checkpoint with the bank's snapshot is complete: the entries before it are safe there."""
        self.snapshot_dir, self.added_since = os.path.join(checkpoint_dir, "bank"), []

    def renew(self) -> None:
        bank = self.bank
        bank.transport.kill(bank[0])
        bank[0] = self.new_actor()
        if self.snapshot_dir is not None:
            bank.start("restore", self.snapshot_dir).wait()
        else:
            self.fill_initially(bank)
        if self.added_since:
            bank.start("add", self.added_since).wait()
