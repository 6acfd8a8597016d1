"""Quiet consoles, full log files. Other libraries reach the console at `run.log_level` (warning by default), less
the messages known to be harmless here; every process also writes everything at INFO and above to its own file under
<run>/logs/. lopd_ray's own phase lines (`phase`) always reach stdout."""
from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator, Optional

# Messages that say nothing wrong about a lopd_ray run; each is still written to the log file.
KNOWN_HARMLESS = (
    # vLLM reloads weights layer by layer and has none to load into the rotary embedding; the sync probe checks
    # that the engine's weights equal the learner's.
    "RotaryEmbedding: Failed to load weights",
    # vLLM's CPU backend and DeepSpeed on a CPU-only machine: the settings lopd_ray chose on purpose.
    "doesn't allow to use `torch.set_num_threads`",
    "is not found in LD_PRELOAD",
    "Triton is not installed",
    "Model Runner V2 requires Triton",
    "Enforce eager set",
    "Inductor compilation was disabled",
    "The global random seed is set",
    "does not officially support disabling chunked prefill",
    "Setting accelerator to CPU",
    "Triton not available",
)
# Loggers whose library re-installs its own handlers (torch on every `set_logs`): the filter sits on the logger.
FILTERED_AT_SOURCE = ("torch._library.triton", "DeepSpeed")
# Libraries that print through handlers of their own; their records are routed to ours instead.
SELF_HANDLED = ("DeepSpeed", "transformers", "ray")
OWN = "lopd_ray"
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class DropKnownHarmless(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in KNOWN_HARMLESS)


class NotOwn(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(OWN)


class AboveProgressBars(logging.StreamHandler):
    """Writes each line above a progress bar being drawn (tqdm clears the bar and draws it again below), never onto
    it."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm = getattr(sys.modules.get("tqdm"), "tqdm", None)
        if tqdm is None or not getattr(tqdm, "_instances", None):
            super().emit(record)
            return
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # as a handler must: a record that cannot be written is not the program's end
            self.handleError(record)


def configure(log_file: Optional[str], console_level: str = "warning") -> None:
    """Idempotent: replaces the handlers an earlier call installed."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in [h for h in root.handlers if getattr(h, "lopd_ray", False)]:
        root.removeHandler(handler)
        handler.close()
    console = AboveProgressBars(sys.stderr)
    console.setLevel(console_level.upper())
    console.addFilter(DropKnownHarmless())
    console.addFilter(NotOwn())
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handlers = [console]
    if log_file:
        os.makedirs(os.path.dirname(log_file), exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
        handlers[-1].setFormatter(logging.Formatter(FILE_FORMAT))
    for handler in handlers:
        handler.lopd_ray = True
        root.addHandler(handler)
    own = logging.getLogger(OWN)
    if not any(getattr(h, "lopd_ray", False) for h in own.handlers):
        stdout = AboveProgressBars(sys.stdout)
        stdout.setFormatter(logging.Formatter("%(message)s"))
        stdout.lopd_ray = True
        own.addHandler(stdout)
    own.setLevel(logging.INFO)
    for name in FILTERED_AT_SOURCE:
        source = logging.getLogger(name)
        if not any(isinstance(f, DropKnownHarmless) for f in source.filters):
            source.addFilter(DropKnownHarmless())
    adopt_library_loggers()
    logging.captureWarnings(True)


def adopt_library_loggers() -> None:
    """Sends the records of libraries that print through their own handlers to the root's (call again after
    importing one: they install their handlers on import)."""
    for name in SELF_HANDLED:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def process_log_file(run_dir: str, role: str) -> str:
    return os.path.join(run_dir, "logs", f"{role}-{os.getpid()}.log")


def setup_actor_process(run_dir: str, console_level: str, role: str) -> None:
    """The first thing an actor does, before its libraries log anything."""
    configure(process_log_file(run_dir, role), console_level)


def to_log_file(message: str, exc: BaseException) -> None:
    """`message` with `exc`'s traceback into this process's log file only: the console gets a one-line error."""
    record = logging.LogRecord(OWN, logging.ERROR, __file__, 0, message, None, (type(exc), exc, exc.__traceback__))
    for handler in logging.getLogger().handlers:
        if getattr(handler, "lopd_ray", False) and isinstance(handler, logging.FileHandler):
            handler.handle(record)


def console_off() -> None:
    """After a command's one-line error: what libraries log next (Ray reporting the failed calls once more as they
    are released) goes to the log file only."""
    for handler in logging.getLogger().handlers:
        if getattr(handler, "lopd_ray", False) and not isinstance(handler, logging.FileHandler):
            handler.setLevel(logging.CRITICAL + 1)


def say(message: str) -> None:
    """A line for the person watching (stdout), also written to the log file."""
    logging.getLogger(OWN).info(message)


@contextmanager
def phase(what: str) -> Iterator[None]:
    """`what ...` when a long phase starts and `what: done in N s` when it ends."""
    start = time.perf_counter()
    say(f"{what} ...")
    yield
    say(f"{what}: done in {time.perf_counter() - start:.0f} s")
