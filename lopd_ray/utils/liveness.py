"""Which of a run's actors are dead, which do not answer, and which still work: after a call failed, the actor that
died is the one to name, not a peer that failed because of it; when a step makes no progress, an actor whose call
still uses CPU is working (a long rollout), one that does not is stuck."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import ray
from ray.exceptions import RayActorError, RayError

PING_TIMEOUT_S = 10.0


@dataclass
class Liveness:
    dead: dict[str, str]  # name -> the first line of why it died
    busy: list[str]       # names of the actors that did not answer within the ping's timeout

    def describe(self) -> str:
        """For a stall: found when no actor computes, so the ones in a call wait on something."""
        parts = [f"{name} died ({why})" for name, why in self.dead.items()]
        if self.busy:
            one = len(self.busy) == 1
            parts.append(f"{', '.join(self.busy)} {'does' if one else 'do'} not answer and use{'s' if one else ''} "
                         f"no CPU")
        return ", ".join(parts) or "every actor answers (the driver itself was held up)"


def ping(groups: dict[str, list], timeout_s: float = PING_TIMEOUT_S) -> Liveness:
    """`groups`: name -> actors (named `name[i]`). An actor runs one call at a time, so one that does not answer
    within `timeout_s` is still in a call."""
    refs = {actor.__ray_ready__.remote(): f"{name}[{i}]" for name, actors in groups.items()
            for i, actor in enumerate(actors)}
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    dead = {}
    for ref in ready:
        try:
            ray.get(ref)
        except RayActorError as exc:
            dead[refs[ref]] = first_line(exc)
    return Liveness(dead, [refs[ref] for ref in pending])


def first_line(exc: BaseException, limit: int = 300) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:limit]



@ray.remote(num_cpus=0)
def _cpu_used(pids: list[int], window_s: float) -> list[Optional[float]]:
    """CPU seconds each process of this node used over `window_s`, every thread and its children (an engine's own
    processes) included; None for one that is gone."""
    import psutil

    def seconds(pid: int) -> Optional[float]:
        try:
            process = psutil.Process(pid)
            family = [process, *process.children(recursive=True)]
        except psutil.Error:
            return None
        total = 0.0
        for member in family:
            try:
                times = member.cpu_times()
            except psutil.Error:  # a child that just ended
                continue
            total += times.user + times.system
        return total

    before = [seconds(pid) for pid in pids]
    time.sleep(window_s)
    return [None if a is None or b is None else b - a for a, b in zip(before, (seconds(pid) for pid in pids))]


def working(groups: dict[str, list], window_s: float = 2.0, min_cpu_share: float = 0.05) -> list[str]:
    """The actors of `groups` whose processes used at least `min_cpu_share` of a CPU over `window_s`: busy in a
    call that computes, not waiting on something that never comes. Measured on each actor's node from outside (a
    busy actor answers no call), by the process id the cluster keeps for it."""
    from ray._private import state  # the cluster's actor table: node and process id, no dashboard needed
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    by_node: dict[str, list[tuple[str, int]]] = {}
    for name, actors in groups.items():
        for i, actor in enumerate(actors):
            try:
                info = state.actors(actor._actor_id.hex())
            except Exception:  # not in the table (yet): no sign of work
                continue
            if info.get("State") == "ALIVE" and info.get("Pid"):
                by_node.setdefault(info["Address"]["NodeID"], []).append((f"{name}[{i}]", info["Pid"]))
    calls = {_cpu_used.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
        [pid for _, pid in members], window_s): members for node, members in by_node.items()}
    ready, _ = ray.wait(list(calls), num_returns=len(calls), timeout=window_s + PING_TIMEOUT_S) if calls else ([], [])
    busy = []
    for ref in ready:
        try:
            used = ray.get(ref)
        except RayError:
            continue
        busy += [name for (name, _), seconds in zip(calls[ref], used)
                 if seconds is not None and seconds >= min_cpu_share * window_s]
    return busy
