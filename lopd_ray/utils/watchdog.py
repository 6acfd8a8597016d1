"""The step-progress watchdog of a run's driver. Progress is a stage of a step starting or ending, a call the driver
waits on answering (`mark_progress()`, from the stage timer and the waiting helpers), or an actor whose call still
computes (`working`). When none comes for `timeout_s`, the main thread is interrupted, so that the run ends naming
the stage it was stuck in instead of waiting on a per-call deadline of half an hour; a driver that does not take
the interrupt is ended with one line after `grace_s`."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Callable, Optional

_active: Optional["StepWatchdog"] = None  # the watchdog of the run this process drives, if one is watching


def mark_progress(stage: Optional[str] = None, step: Optional[int] = None) -> None:
    """Marks progress for the active watchdog; `stage` and `step` also say what the driver is doing from now on."""
    if _active is not None:
        _active.beat(stage, step)


class StepWatchdog:
    """`working()` (optional) names the actors whose calls still compute: when progress is due, any such actor
    counts as progress (a long rollout is not a stall)."""

    def __init__(self, timeout_s: float, working: Optional[Callable[[], list[str]]] = None, grace_s: float = 60.0,
                 poll_s: float = 1.0):
        self.timeout_s, self.working, self.grace_s, self.poll_s = timeout_s, working, grace_s, poll_s
        self.step: Optional[int] = None
        self.stage = "start"
        self.fired = False  # it interrupted the main thread
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._sigint = None  # the SIGINT handler found on entry, when it had to be replaced

    def beat(self, stage: Optional[str] = None, step: Optional[int] = None) -> None:
        if step is not None:
            self.step, self.stage = step, "start of the step"
        if stage is not None:
            self.stage = stage
        self._last = time.monotonic()

    def where(self) -> str:
        step = f"step {self.step}" if self.step is not None else "the run's start"
        return f"{step}, stage '{self.stage}'"

    def __enter__(self) -> "StepWatchdog":
        global _active
        self.beat()
        _active = self
        on_main = threading.current_thread() is threading.main_thread()
        if on_main and not callable(signal.getsignal(signal.SIGINT)):  # ignored (a background job): listen anyway
            self._sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Thread(target=self._watch, name="step-watchdog", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        global _active
        self._stopped.set()
        if _active is self:
            _active = None
        if self._sigint is not None:
            signal.signal(signal.SIGINT, self._sigint)

    def _watch(self) -> None:
        while not self._stopped.wait(self.poll_s):
            if time.monotonic() - self._last > self.timeout_s:
                if self.working is not None and self.working():
                    self.beat()
                    continue
                self.fired = True
                where = self.where()
                # A real signal: a main thread blocked in a system call wakes to raise KeyboardInterrupt.
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                if not self._stopped.wait(self.grace_s):
                    print(f"step stalled: no progress for run.step_timeout_s={self.timeout_s:g}s at {where}, and "
                          f"the driver did not stop within {self.grace_s:g}s of its interrupt; the actors' logs are "
                          f"under the run's logs/", file=sys.stderr, flush=True)
                    os._exit(1)
                return
