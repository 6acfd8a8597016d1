"""Runs a study's training runs, each in its own process or Ray job (lopd_ray/study/launch.py), at most `parallel` at
once and, on a cluster, as many as its CPUs and GPUs hold (each run's ask counted as `--check` counts it). A run
whose last held-out evaluation is in (after its final update) is finished and never rerun; an interrupted one
resumes from its last checkpoint (`run.resume=auto`), so a study stopped at any point continues where it stopped.
When each run started and ended goes to <runs_dir>/schedule.json."""
from __future__ import annotations

import json
import os
import time

from lopd_ray.errors import ConfigError
from lopd_ray.study.spec import RunSpec
from lopd_ray.utils.metrics import read_rows

POLL_S = 2.0


def eval_rows(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "eval.jsonl")
    return read_rows(path) if os.path.exists(path) else []


def is_finished(run_dir: str, total_steps: int) -> bool:
    rows = eval_rows(run_dir)
    return bool(rows) and rows[-1]["updates"] == total_steps


def fits(ask: dict[str, float], running: list[dict[str, float]], capacity) -> bool:
    return capacity is None or all(ask[r] + sum(a[r] for a in running) <= capacity[r] + 1e-9 for r in ask)


def run_all(runs: list[RunSpec], runs_dir: str, total_steps: dict[str, int], launcher, parallel: int = 1,
            asks: dict[str, dict[str, float]] | None = None) -> list[str]:
    """Runs the unfinished runs; returns the ids of those that failed (their logs are <runs_dir>/<id>.log)."""
    os.makedirs(runs_dir, exist_ok=True)
    labels = {run.run_id: f"[{i}/{len(runs)}] {run.run_id}" for i, run in enumerate(runs, 1)}
    pending = []
    for run in runs:
        if is_finished(os.path.join(runs_dir, run.run_id), total_steps[run.run_id]):
            print(f"{labels[run.run_id]}: finished before, kept", flush=True)
        else:
            pending.append(run)
    asks = asks or {run.run_id: {"CPU": 0.0, "GPU": 0.0} for run in runs}
    capacity = launcher.capacity() if parallel > 1 else None
    for run in pending:
        if not fits(asks[run.run_id], [], capacity):
            raise ConfigError(f"study run {run.run_id} asks for {asks[run.run_id]}, more than the cluster at "
                              f"{launcher.where} has ({capacity})")
    failed, running, schedule = [], {}, {}
    while pending or running:
        while pending and len(running) < parallel and fits(asks[pending[0].run_id],
                                                          [asks[r] for r in running], capacity):
            run = pending.pop(0)
            log_path = os.path.join(runs_dir, f"{run.run_id}.log")
            running[run.run_id] = (run, launcher.start(run, log_path), log_path)
            schedule[run.run_id] = {"started": time.time()}
        for run_id, (run, handle, log_path) in list(running.items()):
            code = launcher.exit_code(handle, log_path)
            if code is None:
                continue
            del running[run_id]
            schedule[run_id]["ended"] = time.time()
            seconds = schedule[run_id]["ended"] - schedule[run_id]["started"]
            run_dir = os.path.join(runs_dir, run_id)
            if code != 0 or not is_finished(run_dir, total_steps[run_id]):
                failed.append(run_id)
                print(f"{labels[run_id]}: FAILED (exit {code}) after {seconds:.0f} s; see {log_path}", flush=True)
                continue
            rows = eval_rows(run_dir)
            print(f"{labels[run_id]}: {seconds:.0f} s, held-out reward {rows[0]['reward_mean']:.3f} -> "
                  f"{rows[-1]['reward_mean']:.3f}", flush=True)
        if running:
            time.sleep(POLL_S if parallel > 1 else 0.2)
    with open(os.path.join(runs_dir, "schedule.json"), "w") as f:
        json.dump(schedule, f, indent=1)
    return failed
