"""Runs a study's training runs one after another, each in its own process. A run whose last held-out evaluation
is in (after its final update) is finished and never rerun; an interrupted one resumes from its last checkpoint
(`run.resume=auto`), so a study stopped at any point continues where it stopped."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from lopd_ray.study.spec import RunSpec
from lopd_ray.utils.metrics import read_rows


def eval_rows(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "eval.jsonl")
    return read_rows(path) if os.path.exists(path) else []


def is_finished(run_dir: str, total_steps: int) -> bool:
    rows = eval_rows(run_dir)
    return bool(rows) and rows[-1]["updates"] == total_steps


def run_all(runs: list[RunSpec], runs_dir: str, total_steps: dict[str, int]) -> list[str]:
    """Runs the unfinished runs; returns the ids of those that failed (their logs are <runs_dir>/<id>.log)."""
    failed = []
    for i, run in enumerate(runs, 1):
        run_dir = os.path.join(runs_dir, run.run_id)
        label = f"[{i}/{len(runs)}] {run.run_id}"
        if is_finished(run_dir, total_steps[run.run_id]):
            print(f"{label}: finished before, kept", flush=True)
            continue
        os.makedirs(runs_dir, exist_ok=True)
        log_path = os.path.join(runs_dir, f"{run.run_id}.log")
        started = time.perf_counter()
        with open(log_path, "a") as log:
            code = subprocess.run([sys.executable, *run.command], stdout=log, stderr=subprocess.STDOUT).returncode
        seconds = time.perf_counter() - started
        if code != 0 or not is_finished(run_dir, total_steps[run.run_id]):
            failed.append(run.run_id)
            print(f"{label}: FAILED (exit {code}) after {seconds:.0f} s; see {log_path}", flush=True)
            continue
        rows = eval_rows(run_dir)
        print(f"{label}: {seconds:.0f} s, held-out reward {rows[0]['reward_mean']:.3f} -> "
              f"{rows[-1]['reward_mean']:.3f}", flush=True)
    return failed
