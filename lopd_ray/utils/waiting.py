"""Waiting on actors with a deadline: progress lines while it lasts, an error naming who is late when it ends."""
from __future__ import annotations

import sys
import time
from typing import Optional, Protocol

import ray

from lopd_ray.utils.watchdog import mark_progress


class DeadlineError(RuntimeError):
    pass


class Transport(Protocol):
    """How the driver calls actors and waits for the answers."""

    def submit(self, actor, method: str, args: tuple): ...
    def wait(self, refs: list, timeout_s: float) -> tuple[list, list]: ...  # at most one ready, the others
    def get(self, refs): ...
    def kill(self, actor) -> None: ...
    def actor_id(self, actor) -> str: ...
    def lost_actor(self, exc: BaseException) -> Optional[str]: ...  # the id of the dead actor `exc` reports
    def dead(self, actors: list, timeout_s: float) -> list[bool]: ...  # which no longer answer, having died
    def remove_placement(self, placement) -> None: ...


class RayTransport:
    def submit(self, actor, method: str, args: tuple):
        return getattr(actor, method).remote(*args)

    def wait(self, refs: list, timeout_s: float) -> tuple[list, list]:
        return ray.wait(refs, num_returns=1, timeout=None if timeout_s == float("inf") else timeout_s)

    def get(self, refs):
        return ray.get(refs)

    def kill(self, actor) -> None:
        ray.kill(actor)

    def actor_id(self, actor) -> str:
        return actor._actor_id.hex()

    def lost_actor(self, exc: BaseException) -> Optional[str]:
        from ray.exceptions import RayActorError

        return (getattr(exc, "actor_id", None) or "?") if isinstance(exc, RayActorError) else None

    def dead(self, actors: list, timeout_s: float) -> list[bool]:
        from ray.exceptions import GetTimeoutError, RayActorError

        pings, answers = [actor.__ray_ready__.remote() for actor in actors], []
        deadline = time.monotonic() + timeout_s
        for ping in pings:  # one deadline for all; a busy actor answers late and is not dead
            try:
                ray.get(ping, timeout=max(0.0, deadline - time.monotonic()))
                answers.append(False)
            except RayActorError:
                answers.append(True)
            except GetTimeoutError:
                answers.append(False)
        return answers

    def remove_placement(self, placement) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(placement)


RAY = RayTransport()


def wait_all(refs: list, timeout_s: float, phase: str, peers: list[str], setting: str = "sync.timeout_s",
             error: type[DeadlineError] = DeadlineError, log_every_s: float = 60.0,
             transport: Transport = RAY) -> list:
    """The answer of every ref within `timeout_s`. Every `log_every_s` a line on stderr names the peers still owing
    an answer; past the deadline `error` names them and the `setting` that sets the deadline."""
    if not refs:
        return []
    start = time.monotonic()
    next_line = start + log_every_s
    pending = list(refs)
    while pending:
        now = time.monotonic()
        if now - start >= timeout_s:
            break
        # A progress line may fall due between the check below and here: never a negative timeout.
        ready, pending = transport.wait(pending, max(0.0, min(start + timeout_s, next_line) - now))
        transport.get(ready)  # a call that failed raises now, not once its peers (maybe waiting on it) time out
        if ready:
            mark_progress()
        now = time.monotonic()
        if pending and now >= next_line and now - start < timeout_s:
            print(f"phase '{phase}': still waiting for {_late(refs, pending, peers)} after "
                  f"{now - start:.0f}s of {timeout_s:g}s", file=sys.stderr, flush=True)
            next_line = now + log_every_s
    if pending:
        raise error(f"phase '{phase}' timed out after {timeout_s:g}s waiting for {_late(refs, pending, peers)}; "
                    f"raise {setting} if they are just slow, else look at those actors' logs")
    return transport.get(refs)


def _late(refs: list, pending: list, peers: list[str]) -> list[str]:
    return [peer for ref, peer in zip(refs, peers) if ref in pending]
