"""A group of actors of one kind, the one way the driver holds and calls actors: where they sit (a placement group,
the node where data-parallel ranks meet), calls on every member (the same arguments, or shard i to member i),
answers in member order within a deadline, and how a lost member comes back (its `Restart`).

Calls go through a `Transport` (utils/waiting.py): Ray's in a run, an in-process one in the controller's tests."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, TypeVar

from lopd_ray.errors import RolloutError
from lopd_ray.utils.waiting import RAY, DeadlineError, Transport, wait_all
from lopd_ray.utils.watchdog import mark_progress

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Restart:
    """How a lost member comes back, at most `max_restarts` times (`setting`: the config key of that cap). Scope
    "actor": `renew(i)` puts a new actor at position i and only its share of the call runs again, at most
    `max_restarts` times a call (rollout workers); scope "group": `renew()` rebuilds every member and the whole call
    runs again, at most `max_restarts` times a run (the teacher's ranks, which share collectives; the bank, a group
    of one)."""
    scope: str
    renew: Callable
    max_restarts: int
    setting: str


class ActorGroup(list):
    """The members in rank (bundle) order; a list, so that everyone holding the group sees a member replaced."""

    def __init__(self, kind: str, actors: Sequence = (), *, placement=None, rendezvous_node: Optional[str] = None,
                 timeout_s: Optional[float] = None, timeout_setting: str = "", restart: Optional[Restart] = None,
                 transport: Transport = RAY):
        super().__init__(actors)
        self.kind, self.placement, self.rendezvous_node = kind, placement, rendezvous_node
        self.timeout_s, self.timeout_setting = timeout_s, timeout_setting
        self.restart, self.transport = restart, transport
        self.restarts = 0  # over the run

    def names(self) -> list[str]:
        return [f"{self.kind}[{i}]" for i in range(len(self))]

    # ---- calls -------------------------------------------------------------------------------------------------
    def start(self, method: str, *args, members: Optional[Sequence[int]] = None) -> "Pending":
        """`method(*args)` on every member (or on `members`), begun now."""
        return Pending(self, method, None, args, list(range(len(self))) if members is None else list(members))

    def scatter(self, method: str, shards: Sequence, *args) -> "Pending":
        """`method(shards[i], *args)` on member i, begun now."""
        return Pending(self, method, list(shards), args, list(range(len(shards))))

    def call(self, method: str, *args, timeout_s: Optional[float] = None) -> list:
        """`method(*args)` on every member; the answers in member order. A group whose restart scope is "group"
        comes back from a member lost in the call, and the call runs again."""
        return self.whole(method, lambda: self.start(method, *args).wait(timeout_s))

    def call_scattered(self, method: str, shards: Sequence, *args, timeout_s: Optional[float] = None) -> list:
        return self.whole(method, lambda: self.scatter(method, shards, *args).wait(timeout_s))

    def first(self, method: str, *args):
        """`method(*args)` on member 0 alone (the rank that holds what the group shares)."""
        return self.whole(method, lambda: self.start(method, *args, members=[0]).wait()[0])

    def whole(self, what: str, call: Callable[[], T]) -> T:
        """`call()`, made again on the group rebuilt if a member was lost in it (restart scope "group")."""
        if self.restart is None or self.restart.scope != "group":
            return call()
        return self.surviving(what, call, lambda exc: isinstance(exc, DeadlineError) or self.holds(exc))

    def spread(self, method: str, items: Sequence, what: str, *args, updates_per_member: int = 10) -> list:
        """`method(chunk, *args)` over `items` in chunks, each to whichever member is free, with a progress bar
        counting finished items (`what`); the answers in item order. For the commands that run many episodes at
        once (evaluation, bank build); chunks stay large enough for an engine to batch."""
        from tqdm import tqdm

        size = max(1, -(-len(items) // (len(self) * updates_per_member)))
        chunks = [range(start, min(start + size, len(items))) for start in range(0, len(items), size)]
        answers: list = [None] * len(items)
        free, calls = list(range(len(self))), {}
        with tqdm(total=len(items), desc=what, dynamic_ncols=True) as bar:
            while chunks or calls:
                while free and chunks:
                    i, chunk = free.pop(), chunks.pop(0)
                    calls[self.transport.submit(self[i], method, ([items[k] for k in chunk], *args))] = (i, chunk)
                ready, _ = self.transport.wait(list(calls), float("inf"))
                i, chunk = calls.pop(ready[0])
                for k, answer in zip(chunk, self.transport.get(ready[0])):
                    answers[k] = answer
                free.append(i)
                bar.update(len(chunk))
        return answers

    def settle(self, method: str, timeout_s: float) -> None:
        """`method()` on every member, waiting up to `timeout_s` for those that answer, failures ignored: the last
        call before `release()` (a member still busy is killed there)."""
        pending, deadline = list(self.start(method).answer_refs), time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            ready, pending = self.transport.wait(pending, max(0.0, deadline - time.monotonic()))
            for ref in ready:
                try:
                    self.transport.get(ref)
                except Exception:  # a dead member has nothing left to finish
                    pass

    def split(self, items: Sequence) -> list[list]:
        """Contiguous shards, one per member, in order (a member may get none)."""
        size = -(-len(items) // len(self)) if items else 0
        return [list(items[i * size:(i + 1) * size]) for i in range(len(self))]

    # ---- losing members ----------------------------------------------------------------------------------------
    def lost_members(self, timeout_s: float = 30.0) -> list[int]:
        """The members that died, each asked within `timeout_s` whether it answers (a busy one is not lost)."""
        return [i for i, dead in enumerate(self.transport.dead(list(self), timeout_s)) if dead]

    def holds(self, exc: BaseException) -> bool:
        """Whether `exc` says that one of the members died."""
        return self.transport.lost_actor(exc) in {self.transport.actor_id(a) for a in self}

    def surviving(self, what: str, call: Callable[[], T], lost_here: Optional[Callable[[BaseException], bool]] = None
                  ) -> T:
        """`call()`; when it fails because a member was lost (`lost_here(exc)`, by default: a member died or was
        late), the group comes back by its restart scope "group" and the call runs again."""
        lost_here = lost_here or (lambda exc: True)
        while True:
            try:
                return call()
            except Exception as exc:
                lost = self.transport.lost_actor(exc) is not None or isinstance(exc, DeadlineError)
                if not lost or not lost_here(exc) or self.restart is None or \
                        self.restarts >= self.restart.max_restarts:
                    raise  # the run ends naming the actor (Controller.run_or_name_the_lost_actor)
                self.restarts += 1
                log.warning("%s group lost during %s (%s); rebuilding it", self.kind, what,
                            str(exc).splitlines()[0][:200])
                self.restart.renew()

    def replace_member(self, i: int, why: str, this_call: int) -> None:
        """Member i, lost, comes back alone (restart scope "actor"), unless `this_call` replacements were made in
        the call already: then the step stops naming it."""
        if this_call >= self.restart.max_restarts:
            raise RolloutError(f"{self.kind}[{i}] {why}, after {this_call} replacements this step ({self.restart.setting}"
                               f"={self.restart.max_restarts}); `run.resume=auto` continues from the last checkpoint")
        self.restarts += 1
        self.transport.kill(self[i])
        self.restart.renew(i)

    # ---- the group's life --------------------------------------------------------------------------------------
    def take(self, other: "ActorGroup") -> None:
        """Becomes `other` (a rebuilt group) in place, for everyone holding this one."""
        self[:] = other
        self.placement, self.rendezvous_node = other.placement, other.rendezvous_node

    def release(self) -> None:
        """Kills the members and frees their placement group, if they have one."""
        for actor in self:
            self.transport.kill(actor)
        if self.placement is not None:
            self.transport.remove_placement(self.placement)


class Pending:
    """Calls begun on some members of a group. A method that returns two objects (`@ray.method(num_returns=2)`, the
    scorers of data/signals.py) is waited for by its first; `blobs` holds the second (None for a method that
    returns one)."""

    def __init__(self, group: ActorGroup, method: str, shards: Optional[list], args: tuple, members: list[int]):
        self.group, self.method, self.shards, self.args, self.members = group, method, shards, args, members
        self.refs = [self._submit(i) for i in members]

    def _submit(self, i: int):
        shard = () if self.shards is None else (self.shards[i],)
        return self.group.transport.submit(self.group[i], self.method, shard + self.args)

    @property
    def answer_refs(self) -> list:
        return [ref[0] if isinstance(ref, (tuple, list)) else ref for ref in self.refs]

    @property
    def blobs(self) -> list:
        return [ref[1] if isinstance(ref, (tuple, list)) else None for ref in self.refs]

    def wait(self, timeout_s: Optional[float] = None) -> list:
        """The answers in member order. With restart scope "actor", a member that dies or does not answer within
        the deadline is replaced and its share runs again; otherwise the first failure raises, and a deadline
        passed raises DeadlineError naming the late members."""
        group = self.group
        timeout_s = group.timeout_s if timeout_s is None else timeout_s
        if group.restart is not None and group.restart.scope == "actor":
            return self._wait_replacing(timeout_s)
        names = [group.names()[i] for i in self.members]
        return wait_all(self.answer_refs, float("inf") if timeout_s is None else timeout_s,
                        f"{group.kind} {self.method}", names, setting=group.timeout_setting,
                        transport=group.transport)

    def _wait_replacing(self, timeout_s: Optional[float]) -> list:
        group, transport = self.group, self.group.transport
        limit = float("inf") if timeout_s is None else timeout_s
        calls = {ref: slot for slot, ref in enumerate(self.answer_refs)}
        answers: list = [None] * len(self.members)
        deadline, replaced = time.monotonic() + limit, 0

        def again(slot: int, why: str) -> None:
            nonlocal deadline, replaced
            i = self.members[slot]
            group.replace_member(i, why, replaced)
            replaced += 1
            self.refs[slot] = self._submit(i)
            calls[self.answer_refs[slot]] = slot
            deadline = time.monotonic() + limit

        while calls:
            ready, _ = transport.wait(list(calls), max(0.0, deadline - time.monotonic()))
            if not ready:
                for ref, slot in list(calls.items()):
                    del calls[ref]
                    again(slot, f"did not answer within {group.timeout_setting}={limit:g}")
                continue
            slot = calls.pop(ready[0])
            mark_progress()
            try:
                answers[slot] = transport.get(ready[0])
            except Exception as exc:
                if transport.lost_actor(exc) is None:
                    raise
                again(slot, f"died ({str(exc).splitlines()[0][:200]})")
        return answers
