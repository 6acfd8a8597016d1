"""Checkpoints: `checkpoints/step_N/` is written under a temporary name and renamed when complete; `latest`
is replaced last, so a crash at any point leaves the previous checkpoint intact and pointed to."""
from __future__ import annotations

import json
import os
import shutil
from typing import Callable, Optional

import torch

from lopd_ray.utils.atomic import atomic_directory, write_file

CONTROLLER_STATE = "controller_state.pt"


class CheckpointManager:
    def __init__(self, run_dir: str, keep: int = 0):
        self.root = os.path.join(run_dir, "checkpoints")
        self.keep = keep

    def save(self, step: int, write_parts: Callable[[str], None], controller_state: dict) -> str:
        """`write_parts(tmp_dir)` writes the actors' parts; then the controller state; then the renames."""
        final = os.path.join(self.root, f"step_{step}")
        with atomic_directory(final) as tmp:
            write_parts(tmp)
            torch.save(controller_state, os.path.join(tmp, CONTROLLER_STATE))
        write_file(os.path.join(self.root, "latest"), json.dumps({"step": step, "dir": f"step_{step}"}))
        self._prune(keep_step=step)
        return final

    def _prune(self, keep_step: int) -> None:
        """Removes all but the newest `keep` complete checkpoints (0 keeps all); the one `latest` names stays."""
        if self.keep <= 0:
            return
        steps = sorted(int(name[len("step_"):]) for name in os.listdir(self.root)
                       if name.startswith("step_") and name[len("step_"):].isdigit())
        for step in steps[:-self.keep]:
            if step != keep_step:
                shutil.rmtree(os.path.join(self.root, f"step_{step}"), ignore_errors=True)

    def resolve(self, resume: str) -> Optional[str]:
        """`run.resume` -> a checkpoint directory or None."""
        if resume == "off":
            return None
        if resume != "auto":
            return resume
        latest = os.path.join(self.root, "latest")
        if not os.path.exists(latest):
            return None
        with open(latest) as f:
            return os.path.join(self.root, json.load(f)["dir"])

    @staticmethod
    def step_of(directory: str) -> int:
        """The step a checkpoint directory (`.../step_N`) continues from."""
        return int(os.path.basename(os.path.normpath(directory))[len("step_"):])

    @staticmethod
    def load_controller_state(directory: str) -> dict:
        return torch.load(os.path.join(directory, CONTROLLER_STATE), weights_only=False)
