"""CPU seconds of the trainer's processes on this machine, read from /proc (Linux): each actor with the processes
it started (vLLM's engine core, say), and the driver alone (its children are Ray's own daemons and workers)."""
from __future__ import annotations

import os
import sys

import ray

TICKS = os.sysconf("SC_CLK_TCK")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors cannot import this file


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # the fields after the command name, from the state on


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                kids.setdefault(int(_stat(int(name))[1]), []).append(int(name))
            except OSError:  # gone meanwhile
                pass
    return kids


def _cpu_seconds(pid: int) -> float:
    try:
        fields = _stat(pid)
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _tree(pid: int, kids: dict[int, list[int]]) -> list[int]:
    return [pid] + [p for kid in kids.get(pid, []) for p in _tree(kid, kids)]


class CpuClock:
    """CPU seconds per actor group since it was made: {"RolloutWorker": [actor, ...], ...} plus the driver."""

    def __init__(self, groups: dict[str, list]):
        self.pids = {name: ray.get([a.__ray_call__.remote(lambda _: os.getpid()) for a in actors])
                     for name, actors in groups.items() if actors}
        self.restart()

    def restart(self) -> None:
        self.start = self.read()

    def read(self) -> dict[str, float]:
        kids = _children()
        seconds = {name: sum(_cpu_seconds(p) for pid in pids for p in _tree(pid, kids))
                   for name, pids in self.pids.items()}
        return {**seconds, "driver": _cpu_seconds(os.getpid())}

    def per_step(self, steps: int) -> dict[str, float]:
        now = self.read()
        return {f"cpu_s_per_step/{name}": (now[name] - self.start[name]) / steps for name in now}
