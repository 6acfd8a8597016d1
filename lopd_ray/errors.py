"""Errors every layer may raise; this module imports nothing from the package."""


class ConfigError(ValueError):
    """A configuration problem, stated in one line with the key and the fix."""


def require(ok: bool, message: str) -> None:
    """A ConfigError with `message` unless `ok`."""
    if not ok:
        raise ConfigError(message)


class RolloutError(RuntimeError):
    """Too many episodes of a step failed (env or engine exceptions) to train on it; names the first error."""


class ActorLostError(RuntimeError):
    """An actor the run cannot replace (a learner, a teacher, the bank) died; names it and how to continue."""


class ActorStartError(RuntimeError):
    """An actor's constructor raised (a model its engine cannot run, a missing device); names it and the cause."""


class DiskFullError(RuntimeError):
    """A write found no space left (a checkpoint, the metrics); names what was lost, what is intact, and the fix."""


class StepStalledError(RuntimeError):
    """A training step made no progress for run.step_timeout_s; names the stage and the actors that do not answer."""


class NotLearningError(RuntimeError):
    """run.max_idle_updates steps in a row made no update; names the likeliest cause and the fix."""


class RunInterrupted(RuntimeError):
    """The run was stopped by the user (Ctrl-C); says where it stopped and how to continue."""
