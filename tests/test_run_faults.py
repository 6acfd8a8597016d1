"""Faults of a running training run, each injected into the real command (a process with a Ray cluster of its own,
tests/faulty_train.py): the run ends in one line naming what happened and where `run.resume=auto` continues, with
no traceback on the console, the last complete checkpoint intact and every finished step's metrics row kept. A
learner killed mid-step or mid-checkpoint is named (not its peer's network error) and the resume completes the
run; a full disk at a checkpoint, and a resume on the still-full disk, are one line each; Ctrl-C stops within
seconds; a step without progress (no call answers, no actor computes) ends at run.step_timeout_s naming the stage
and the actors that do not answer, while a call that computes for longer goes on."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lopd_ray.faults import TORCH_WRITE_FAILED
from lopd_ray.utils.checkpoint import CheckpointManager, damage
from lopd_ray.utils.metrics import read_metrics

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.ray
RAY_FORWARDED = re.compile(r"^(\x1b\[\d+m)?\(")  # a line Ray forwards from an actor or the raylet: "(raylet) ..."


def train_args(run_dir: Path, *overrides: str) -> list[str]:
    return ["recipes/grpo_letters_cpu.yaml", f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}",
            "train.total_steps=3", "run.checkpoint_every_steps=1", "rollout.engine=hf", "rollout.num_workers=1",
            "run.progress_bar=false", "run.loggers=[]", "run.export_student=false", *overrides]


def command(args: list[str], **popen) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ADDRESS="")
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def run(args: list[str], timeout: float = 600) -> tuple[int, str, str]:
    proc = command(args)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def faulty(fault: str, run_dir: Path, *overrides: str) -> tuple[int, str, str]:
    return run(["tests/faulty_train.py", fault, *train_args(run_dir, *overrides)])


def the_one_line(code: int, out: str, err: str, expected_code: int, prefix: str) -> str:
    """The line the run ended with: the only one with its prefix, no traceback anywhere on the console, and none
    of the lines of stderr but Ray's forwarded actor lines and lopd_ray's waiting notices besides it."""
    console = out + err
    assert code == expected_code, f"exit {code}\n{console[-4000:]}"
    assert "Traceback" not in console and "Unhandled error" not in console, console[-4000:]
    own = [line for line in err.splitlines()
           if line.strip() and not RAY_FORWARDED.match(line) and not line.startswith("phase '")]
    assert len(own) == 1 and own[0].startswith(prefix + ": "), console[-4000:]
    return own[0][len(prefix) + 2:]


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(name for name in os.listdir(run_dir / "checkpoints") if name != "latest")


def last_line_of_the_console_in_a_file(fault: str, run_dir: Path, *overrides: str) -> str:
    """The run with its progress bar, stdout and stderr redirected to one file (`> file 2>&1`): its one fault line,
    which must be the file's last, alone on its line; no traceback before it."""
    path = run_dir.parent / "console.txt"
    with open(path, "w") as f:
        proc = subprocess.Popen([sys.executable, "tests/faulty_train.py", fault, *train_args(run_dir, *overrides),
                                 "run.progress_bar=true"], cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1",
                                                                              RAY_ADDRESS=""),
                                stdout=f, stderr=subprocess.STDOUT)
        assert proc.wait(timeout=600) == 1
    console = path.read_text()
    last = console.rstrip("\n").split("\n")[-1]
    assert "Traceback" not in console and console.count(last.partition(": ")[0] + ": ") == 1, console[-4000:]
    return last


def test_a_learner_killed_mid_step_is_named_not_its_peers_network_error(tmp_path):
    run_dir = tmp_path / "dead_learner"
    line = last_line_of_the_console_in_a_file("learner_1_killed_mid_step=1", run_dir)
    assert line.startswith("actor lost: "), line
    line = line[len("actor lost: "):]
    assert line.startswith("PolicyLearner[1] died (") and " at step 1, stage 'learn'; " in line, line
    assert line.endswith(f"`run.resume=auto` continues from {run_dir}/checkpoints/step_1, which is intact"), line
    assert "PolicyLearner[0]" not in line and "gloo" not in line.lower(), line
    assert [row["step"] for row in read_metrics(str(run_dir))] == [0]
    assert checkpoints(run_dir) == ["step_1"] and damage(str(run_dir / "checkpoints" / "step_1")) is None


def test_a_learner_killed_while_checkpointing_is_named_and_the_resume_completes_every_step(tmp_path):
    run_dir = tmp_path / "killed_at_checkpoint"
    line = the_one_line(*faulty("learner_1_killed_mid_checkpoint=1", run_dir), 1, "actor lost")
    assert line.startswith("PolicyLearner[1] died (") and " at step 1, stage 'checkpoint'; " in line, line
    assert line.endswith(f"`run.resume=auto` continues from {run_dir}/checkpoints/step_1, which is intact"), line
    assert checkpoints(run_dir) == ["step_1"] and damage(str(run_dir / "checkpoints" / "step_1")) is None
    assert [row["step"] for row in read_metrics(str(run_dir))] == [0, 1]  # step 1 was logged before its checkpoint
    code, out, err = run(["-m", "lopd_ray.train", *train_args(run_dir)])
    assert code == 0, (out + err)[-4000:]
    assert [row["step"] for row in read_metrics(str(run_dir))] == [0, 1, 2]
    assert CheckpointManager(str(run_dir)).resolve("auto") == str(run_dir / "checkpoints" / "step_3")


def test_a_full_disk_at_a_checkpoint_keeps_the_last_one_and_a_resume_on_it_fails_fast(tmp_path):
    """The learners' checkpoint writes fail as torch's writer fails on a full disk: a RuntimeError without an errno
    (test_faults.py reads it so on a real full tmpfs)."""
    run_dir = tmp_path / "full_disk"
    line = the_one_line(*faulty("torch_disk_full_at_checkpoint=1", run_dir), 1, "disk full")
    assert line.startswith(f"no space left on the device of {run_dir} at step 1, stage 'checkpoint' "
                           f"({TORCH_WRITE_FAILED}); a checkpoint being written was removed whole, and "), line
    assert line.endswith(f"`run.resume=auto` continues from {run_dir}/checkpoints/step_1, which is intact: free "
                         f"space there (or lower run.keep_checkpoints), then run again"), line
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["latest", "step_1"]  # the partial one removed whole
    assert CheckpointManager(str(run_dir)).resolve("auto") == str(run_dir / "checkpoints" / "step_1")
    assert damage(str(run_dir / "checkpoints" / "step_1")) is None
    assert [row["step"] for row in read_metrics(str(run_dir))] == [0, 1]
    # the disk is still full: the resume stops in its checks, before Ray starts
    started = time.monotonic()
    line = the_one_line(*faulty("disk_stays_full", run_dir), 2, "config error")
    assert time.monotonic() - started < 60
    size = sum(f.stat().st_size for f in (run_dir / "checkpoints" / "step_1").rglob("*") if f.is_file())
    assert line == (f"the disk of {run_dir} has 0.0 MiB free, less than one checkpoint of this run takes "
                    f"({size / 2**20:.1f} MiB, step_1): free space there (or lower run.keep_checkpoints), or give a "
                    f"run.output_dir on another disk")
    assert [row["step"] for row in read_metrics(str(run_dir))] == [0, 1]


def test_ctrl_c_mid_step_stops_within_seconds_saying_how_to_resume(tmp_path):
    run_dir = tmp_path / "ctrl_c"
    # its own session: Ctrl-C reaches the whole foreground process group, the local cluster's processes included
    proc = command(["-m", "lopd_ray.train", *train_args(run_dir, "train.total_steps=1000")], start_new_session=True)
    for line in proc.stdout:
        if line.startswith("step 2 "):
            break
    time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    pressed = time.monotonic()
    out, err = proc.communicate(timeout=120)
    assert time.monotonic() - pressed < 20
    line = the_one_line(proc.returncode, out, err, 130, "interrupted")
    stopped = int(re.match(r"stopped by Ctrl-C at step (\d+), stage '", line).group(1))
    latest = CheckpointManager(str(run_dir)).resolve("auto")
    assert line.endswith(f"metrics.jsonl keeps every finished step; `run.resume=auto` continues from {latest}, which "
                         f"is intact"), line
    logged = [row["step"] for row in read_metrics(str(run_dir))]  # a step's row is written before its checkpoint
    assert stopped >= 2 and logged == list(range(stopped + line.startswith(f"stopped by Ctrl-C at step {stopped}, "
                                                                            f"stage 'checkpoint'"))), (line, logged)
    assert latest == str(run_dir / "checkpoints" / f"step_{stopped}")  # a checkpoint after every step


def test_a_step_without_progress_ends_at_the_step_timeout_naming_the_stage_and_the_stuck_actors(tmp_path):
    run_dir = tmp_path / "stalled"
    started = time.monotonic()
    # step 0: learner 0 computes for 20 s before its part, twice run.step_timeout_s, and the step goes through;
    # step 1: it sleeps instead, and learner 1 waits for it in the step's collective
    line = the_one_line(*faulty("learner_0_computes=0,learner_0_hangs=1", run_dir, "run.step_timeout_s=10"), 1,
                        "step stalled")
    assert time.monotonic() - started < 300  # the start-up, steps 0 and 1: never learner.comm_timeout_s=600
    assert line == (f"no progress for run.step_timeout_s=10s at step 1, stage 'learn': PolicyLearner[0], "
                    f"PolicyLearner[1] do not answer and use no CPU; raise run.step_timeout_s if that stage is just "
                    f"slow, else see the actors' logs under {run_dir}/logs; `run.resume=auto` continues from "
                    f"{run_dir}/checkpoints/step_1, which is intact")
    assert [row["step"] for row in read_metrics(str(run_dir))] == [0]
