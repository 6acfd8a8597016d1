"""How a run that ends early says so. Each way it can stop becomes one error line saying where it stopped and where
`run.resume=auto` continues from (the driver's log file keeps the traceback): an actor that died and cannot be
replaced mid-run (a learner, a teacher, the bank), also when the call that failed was a live peer's (a learner whose
collective lost its partner), an ActorLostError naming the dead one; no space left on the disk, a DiskFullError;
Ctrl-C, RunInterrupted; a step without progress for run.step_timeout_s, a StepStalledError naming the stage and the
actors that do not answer."""
from __future__ import annotations

import errno
import os
from typing import Callable, Optional

from ray.exceptions import RayError

from lopd_ray.errors import ActorLostError, ConfigError, DiskFullError, RunInterrupted, StepStalledError
from lopd_ray.utils.actor_group import ActorGroup
from lopd_ray.utils.checkpoint import CheckpointManager
from lopd_ray.utils.liveness import first_line, ping, working
from lopd_ray.utils.logs import to_log_file
from lopd_ray.utils.waiting import DeadlineError
from lopd_ray.utils.watchdog import StepWatchdog


# torch's stream writer reports a full disk as a RuntimeError without an errno: "[enforce fail at
# inline_container.cc:...] . unexpected pos N vs M" (torch 2.13 on a full tmpfs), or "... file write failed".
TORCH_WRITER = "inline_container.cc"
TORCH_WRITE_FAILED = "No space left on device, as torch's writer found it (a write that stopped short)"


def no_space_left(exc: Optional[BaseException]) -> Optional[OSError]:
    """The "no space left on device" (or quota) error behind `exc`, raised here or in an actor, if that is what it
    is."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return exc
        if isinstance(exc, RuntimeError) and TORCH_WRITER in str(exc) and (
                "unexpected pos" in str(exc) or "write failed" in str(exc)):
            return OSError(errno.ENOSPC, TORCH_WRITE_FAILED)
        exc = getattr(exc, "cause", None) or exc.__cause__ or exc.__context__  # a RayTaskError holds its cause
    return None


class RunFaults:
    """Names a run's faults from its actor groups (`groups()`: by kind, the ones a run cannot replace first) and
    its checkpoints. `interrupted`: the run was stopped by Ctrl-C or the watchdog (its actors are then killed, not
    waited for)."""

    def __init__(self, run_dir: str, checkpoints: CheckpointManager, groups: Callable[[], dict[str, ActorGroup]],
                 learners: ActorGroup):
        self.run_dir, self.checkpoints, self.groups, self.learners = run_dir, checkpoints, groups, learners
        self.interrupted = False

    def watch(self, run: Callable[[], None], step_timeout_s: float) -> None:
        """`run()` watched for progress; an early end raises its one-line error."""
        with StepWatchdog(step_timeout_s, lambda: working(self.groups())) as watchdog:
            try:
                run()
            except KeyboardInterrupt as exc:
                self.interrupted = True
                to_log_file(f"stopped at {watchdog.where()}", exc)
                if watchdog.fired:
                    raise self.stalled(watchdog) from None
                raise RunInterrupted(f"stopped by Ctrl-C at {watchdog.where()}; metrics.jsonl keeps every finished "
                                     f"step; {self.resume_hint()}") from None
            except (RayError, OSError, DeadlineError) as exc:
                to_log_file(f"the run failed at {watchdog.where()}", exc)
                fault = self.named(exc, watchdog)
                if fault is None:
                    raise
                raise fault from None

    def stalled(self, watchdog: StepWatchdog) -> StepStalledError:
        """Names the actors still in a call (one that waits on a dead peer or never returns) and the dead ones."""
        return StepStalledError(f"no progress for run.step_timeout_s={watchdog.timeout_s:g}s at {watchdog.where()}: "
                                f"{ping(self.groups()).describe()}; raise run.step_timeout_s if that stage is "
                                f"just slow, else see the actors' logs under {self.run_dir}/logs; "
                                f"{self.resume_hint()}")

    def named(self, exc: BaseException, watchdog: StepWatchdog) -> Optional[Exception]:
        """The one-line error for a failed or late call (None: a fault without one, left as it is): no space left on
        the disk; the actors found dead, the one whose call failed first; a deadline passed."""
        full = no_space_left(exc)
        if full is not None:
            file = str(full.filename or self.run_dir)
            place = self.run_dir if file == self.run_dir or file.startswith(self.run_dir + os.sep) else file
            removed = "a checkpoint being written was removed whole, and " if watchdog.stage == "checkpoint" else ""
            return DiskFullError(f"no space left on the device of {place} at {watchdog.where()} ({full.strerror}); "
                                 f"{removed}{self.resume_hint()}: free space there (or lower run.keep_checkpoints), "
                                 f"then run again")
        groups = self.groups()
        dead = ping(groups).dead
        names = {group.transport.actor_id(actor): name
                 for group in groups.values() for name, actor in zip(group.names(), group)}
        own = names.get(self.learners.transport.lost_actor(exc) or "")
        if own is not None:
            dead = {own: first_line(exc), **{name: why for name, why in dead.items() if name != own}}
        if not dead:
            return StepStalledError(f"{exc}; {self.resume_hint()}") if isinstance(exc, DeadlineError) else None
        lost = ", ".join(f"{name} died ({why})" for name, why in dead.items())
        return ActorLostError(f"{lost} at {watchdog.where()}; {self.resume_hint()}")

    def resume_hint(self) -> str:
        try:
            latest = self.checkpoints.resolve("auto")
        except ConfigError as exc:
            return str(exc)
        return (f"`run.resume=auto` continues from {latest}, which is intact" if latest else
                "no checkpoint was written yet: the run starts over")
