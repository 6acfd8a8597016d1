"""Checkpoints: `checkpoints/step_N/` is written under a temporary name and renamed when complete; `latest`
is replaced last, so a crash at any point leaves the previous checkpoint intact and pointed to. Each checkpoint holds
a manifest with the size and SHA-256 of every file in it: a checkpoint damaged afterwards (a flipped byte, a
truncated or missing file) is refused, and `run.resume=auto` falls back to the newest intact one."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from typing import Callable, Optional

import torch

from lopd_ray.errors import ConfigError
from lopd_ray.utils.atomic import atomic_directory, write_file

CONTROLLER_STATE = "controller_state.pt"
MANIFEST = "MANIFEST.json"
log = logging.getLogger(__name__)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(root, name), directory)
                  for root, _, names in os.walk(directory) for name in names if name != MANIFEST)


def write_manifest(directory: str) -> None:
    manifest = {rel: {"bytes": os.path.getsize(os.path.join(directory, rel)), "sha256": _sha256(
        os.path.join(directory, rel))} for rel in _files(directory)}
    write_file(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1))


# Checkpoints found intact in this process, with the (name, size, mtime) of each file then: start-up checks the
# checkpoint it resumes from and the controller resolves it again; a second look hashes nothing unless a file changed.
_INTACT: set[tuple] = set()


def _signature(directory: str) -> tuple:
    return (directory, *((rel, (s := os.stat(os.path.join(directory, rel))).st_size, s.st_mtime_ns)
                         for rel in _files(directory)))


def damage(directory: str) -> Optional[str]:
    """What is wrong with a checkpoint directory (missing, no manifest, a file missing, truncated or changed), or
    None when every file matches its manifest."""
    if not os.path.isdir(directory):
        return f"{directory} does not exist"
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        return f"{directory} has no {MANIFEST} (partial, or not a checkpoint)"
    signature = _signature(directory)
    if signature in _INTACT:
        return None
    with open(path) as f:
        manifest = json.load(f)
    for rel, expected in manifest.items():
        file = os.path.join(directory, rel)
        if not os.path.isfile(file):
            return f"{file} is missing"
        if os.path.getsize(file) != expected["bytes"]:
            return f"{file} has {os.path.getsize(file)} bytes, not {expected['bytes']} (truncated or overwritten)"
        if _sha256(file) != expected["sha256"]:
            return f"{file} does not match its checksum (corrupted)"
    _INTACT.add(signature)
    return None


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Start-up resolves the checkpoint it resumes from, and the controller again: the fallback is said once."""
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning(message)


class CheckpointManager:
    def __init__(self, run_dir: str, keep: int = 0):
        self.root = os.path.join(run_dir, "checkpoints")
        self.keep = keep

    def save(self, step: int, write_parts: Callable[[str], None], controller_state: dict) -> str:
        """`write_parts(tmp_dir)` writes the actors' parts; then the controller state; then the renames. What an
        interrupted save left (its writers went on after it was removed, or the driver was killed) goes first."""
        final = os.path.join(self.root, f"step_{step}")
        for name in os.listdir(self.root) if os.path.isdir(self.root) else []:
            if name.startswith(".step_") and ".tmp-" in name:
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
        with atomic_directory(final) as tmp:
            write_parts(tmp)
            torch.save(controller_state, os.path.join(tmp, CONTROLLER_STATE))
            write_manifest(tmp)
        write_file(os.path.join(self.root, "latest"), json.dumps({"step": step, "dir": f"step_{step}"}))
        self._prune(keep_step=step)
        return final

    def _prune(self, keep_step: int) -> None:
        """Removes all but the newest `keep` complete checkpoints (0 keeps all); the one `latest` names stays."""
        if self.keep <= 0:
            return
        for step in sorted(self._steps())[:-self.keep]:
            if step != keep_step:
                shutil.rmtree(os.path.join(self.root, f"step_{step}"), ignore_errors=True)

    def resolve(self, resume: str) -> Optional[str]:
        """`run.resume` -> an intact checkpoint directory or None. A damaged one given by path is refused; with
        "auto", a damaged or missing `latest` falls back to the newest intact checkpoint (with a warning)."""
        if resume == "off":
            return None
        if resume != "auto":
            problem = damage(resume)
            if problem:
                raise ConfigError(f"run.resume={resume} is not an intact checkpoint: {problem}; give another "
                                  f"checkpoint directory or run.resume=auto to take the newest intact one")
            return resume
        latest = os.path.join(self.root, "latest")
        if not os.path.exists(latest):
            return None
        try:
            with open(latest) as f:
                named = os.path.join(self.root, json.load(f)["dir"])
        except (ValueError, KeyError, TypeError) as exc:  # a write of the pointer cut short, or overwritten
            named, problem = None, f"{latest} is torn ({type(exc).__name__}: {exc})"
        else:
            problem = damage(named)
            if problem is None:
                return named
            problem = f"checkpoint {named} is damaged ({problem})"
        for step in sorted(self._steps(), reverse=True):
            candidate = os.path.join(self.root, f"step_{step}")
            if candidate != named and damage(candidate) is None:
                warn_once(f"{problem}; resuming from {candidate}, the newest intact checkpoint")
                return candidate
        raise ConfigError(f"no intact checkpoint under {self.root}: {problem}; set run.resume=off to start over "
                          f"(or another run.name to keep this run's files)")

    def _steps(self) -> list[int]:
        return [int(name[len("step_"):]) for name in os.listdir(self.root)
                if name.startswith("step_") and name[len("step_"):].isdigit()]

    @staticmethod
    def step_of(directory: str) -> int:
        """The step a checkpoint directory (`.../step_N`) continues from."""
        return int(os.path.basename(os.path.normpath(directory))[len("step_"):])

    @staticmethod
    def load_controller_state(directory: str) -> dict:
        return torch.load(os.path.join(directory, CONTROLLER_STATE), weights_only=False)
