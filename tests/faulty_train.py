"""`python tests/faulty_train.py FAULT=STEP[,FAULT=STEP ...] [train arguments ...]`: the train command, in a process
of its own with a Ray cluster of its own, with faults of FAULTS injected into the real actors at step STEP (a
checkpoint fault: at the checkpoint that STEP's end writes). Exits with the command's exit code."""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections import namedtuple

import ray

from lopd_ray.cli import train
from lopd_ray.controller import Controller


# ---- run inside a learner actor (functions of __main__ travel by value) ---------------------------------------
def kill_myself_in_the_optimizer_step(learner) -> None:
    """The learner dies mid-step, as under `kill -9`, after its backward pass: its peer waits in the step's
    collective for it."""
    learner.engine.step = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)


def kill_myself_at_the_first_checkpoint_write(learner) -> None:
    import torch

    torch.save = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)


def find_the_disk_full_as_torch_says_it(learner) -> None:
    """torch's stream writer on a full disk: a RuntimeError without an errno (as measured on a 1 MiB tmpfs)."""
    import torch

    def save(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    torch.save = save


def hang(learner) -> None:
    time.sleep(3600)


def compute(learner) -> None:
    """A call that takes long but works: 20 s of CPU."""
    end = time.monotonic() + 20
    while time.monotonic() < end:
        pass


# ---- where the driver injects them --------------------------------------------------------------------------
def before_learning(step: int, rank: int, inject) -> None:
    real, seen = Controller.learn, []

    def learn(self, trajs):
        seen.append(None)
        if len(seen) == step + 1 - self.start_step:
            call = self.learners[rank].__ray_call__.remote(inject)
            if inject not in IN_THE_WAY:
                ray.get(call)
        return real(self, trajs)
    Controller.learn = learn


def before_checkpoint(step: int, rank, inject) -> None:
    real = Controller.save_checkpoint

    def save_checkpoint(self, next_step):
        if next_step == step + 1:
            ranks = range(len(self.learners)) if rank is None else [rank]
            ray.get([self.learners[r].__ray_call__.remote(inject) for r in ranks])
        return real(self, next_step)
    Controller.save_checkpoint = save_checkpoint


def disk_stays_full(step, rank, inject) -> None:
    """The driver finds 4 KiB free on every disk (as the disk a checkpoint write filled)."""
    usage = shutil.disk_usage
    shutil.disk_usage = lambda path: usage(path)._replace(free=4096)


IN_THE_WAY = (hang, compute)  # run before the step's own call on that learner, not waited for
Fault = namedtuple("Fault", "where rank inject")
FAULTS = {
    "learner_1_killed_mid_step": Fault(before_learning, 1, kill_myself_in_the_optimizer_step),
    "learner_1_killed_mid_checkpoint": Fault(before_checkpoint, 1, kill_myself_at_the_first_checkpoint_write),
    "torch_disk_full_at_checkpoint": Fault(before_checkpoint, None, find_the_disk_full_as_torch_says_it),
    "learner_0_hangs": Fault(before_learning, 0, hang),
    "learner_0_computes": Fault(before_learning, 0, compute),
    "disk_stays_full": Fault(disk_stays_full, None, None),
}


if __name__ == "__main__":
    for spec in sys.argv[1].split(","):
        name, _, step = spec.partition("=")
        fault = FAULTS[name]
        fault.where(int(step or 0), fault.rank, fault.inject)
    sys.exit(train.main(sys.argv[2:]))
