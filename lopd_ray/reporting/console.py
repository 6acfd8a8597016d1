"""What the commands say on the console, in sentences: where a run is, what it asks for, how it went and what to run
next. The numbers themselves stay in the run's files (metrics.jsonl, eval.jsonl, summary.json)."""
from __future__ import annotations

import math
import os
from typing import Optional

from lopd_ray.idle_updates import made_update
from lopd_ray.utils.metrics import read_metrics

# The metrics a run's last lines sum up, when it logged them: the reward first, then the student's distance to its
# teacher (distillation) or to its reference (GRPO with a KL term).
HEADLINE_METRICS = (("reward", "rollout/reward_mean"), ("KL to the teacher", "lopd/kl"),
                    ("KL to the teacher", "distill/student_kl"), ("KL to the reference", "actor/kl"))
HELD_OUT_METRIC = "eval/reward_mean"
# Steps averaged at each end of a run.
WINDOW = 5


def duration(seconds: float) -> str:
    """"42 s", "3 min 05 s", "2 h 07 min"."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def resources(amounts: dict[str, float]) -> str:
    """{"CPU": 1.7, "GPU": 5.0} -> "1.7 CPUs and 5 GPUs"."""
    return " and ".join(f"{amounts.get(name, 0.0):g} {name}s" for name in ("CPU", "GPU"))


def as_typed(path: str) -> str:
    """`path` as a user would type it from here: relative when it is under the working directory."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def metric_line(label: str, name: str, rows: list[dict], samples_per_step: int) -> Optional[str]:
    """How `name` went: the means of the first and last WINDOW steps, or, in a run too short for two windows, its
    first and last values. The reward adds how much of a difference sampling alone makes."""
    points = [(r["step"], r[name]) for r in rows if name in r]
    if not points:
        return None
    values = [v for _, v in points]
    if len(points) < 2 * WINDOW:
        return (f"{label} ({name}): {values[0]:.3g} at step {points[0][0]}, {values[-1]:.3g} at step "
                f"{points[-1][0]}{noise(name, rows, 1, samples_per_step)}")
    head, tail = values[:WINDOW], values[-WINDOW:]
    return (f"{label} ({name}): {sum(head) / WINDOW:.3g} over the first {WINDOW} steps, {sum(tail) / WINDOW:.3g} "
            f"over the last {WINDOW}{noise(name, rows[-WINDOW:], WINDOW, samples_per_step)}")


def noise(name: str, rows: list[dict], steps: int, samples_per_step: int) -> str:
    """For the mean reward: the standard error of a mean over `steps` steps of `samples_per_step` samples (the
    rewards' spread within a step, rollout/reward_std, over the square root of the samples)."""
    spread = [r["rollout/reward_std"] for r in rows if "rollout/reward_std" in r]
    if name != "rollout/reward_mean" or not spread or samples_per_step < 1:
        return ""
    error = sum(spread) / len(spread) / math.sqrt(steps * samples_per_step)
    span = "each step's mean" if steps == 1 else "each mean"
    return f"; {span} is uncertain by about ±{error:.2g} from sampling alone"


def run_summary(run_dir: str, seconds: float, samples_per_step: int, checkpoint: Optional[str] = None,
                exported: Optional[str] = None, kept_at: Optional[str] = None, resumed_at: int = 0) -> str:
    """The last lines of a training run (`resumed_at`: the step this command started from)."""
    rows = read_metrics(run_dir) if os.path.exists(os.path.join(run_dir, "metrics.jsonl")) else []
    steps = rows[-1]["step"] + 1 if rows else 0
    trained = sum(r.get("timing_s/wall", 0.0) for r in rows)
    idle = sum(not made_update(r) for r in rows if "actor/skipped_update" in r)
    done = (f"The run trained {steps} steps" if not resumed_at else
            f"This command trained {steps - resumed_at} steps, {resumed_at} to {steps - 1} (the run resumed at step "
            f"{resumed_at} and has {steps})")
    lines = [f"{done} ({duration(trained)} of steps; this command took {duration(seconds)}, "
             f"start-up included). Its files are in {as_typed(run_dir)}"
             + (f", kept at {kept_at}." if kept_at else ".")]
    if idle:
        lines.append(f"  {idle} of the {steps} steps made no update (actor/skipped_update, actor/grad_norm).")
    shown = set()
    for label, name in HEADLINE_METRICS:
        line = metric_line(label, name, rows, samples_per_step) if label not in shown else None
        if line:
            lines.append(f"  {line[0].upper()}{line[1:]}.")
            shown.add(label)
    held_out = [r[HELD_OUT_METRIC] for r in rows if HELD_OUT_METRIC in r]
    if held_out:
        lines.append(f"  Held-out reward of the student alone ({HELD_OUT_METRIC}): {held_out[0]:.3g} at the first "
                     f"evaluation, {held_out[-1]:.3g} at the last (eval.jsonl).")
    lines.append(f"  Checkpoints: {as_typed(checkpoint)} is the latest." if checkpoint else
                 "  No checkpoint was written (run.checkpoint_every_steps=0).")
    if exported:
        lines.append(f"  The trained student: {as_typed(exported)}.")
    lines.append(f"Next: python -m lopd_ray.report {as_typed(run_dir)}")
    return "\n".join(lines)


def run_start(run_dir: str, amounts: dict[str, float], kept_at: Optional[str] = None) -> str:
    return (f"The run writes to {as_typed(run_dir)}" + (f" (kept at {kept_at})" if kept_at else "")
            + f" and asks Ray for {resources(amounts)}.")


def check_result(run_dir: str, amounts: dict[str, float], to_build: list[str], kept_at: Optional[str] = None) -> str:
    """What `--check` found: where a run would write, what it would ask for and build first."""
    line = (f"The config checks out: a run would write to {as_typed(run_dir)}" + (f" (kept at {kept_at})" if kept_at
                                                                                   else "")
            + f" and ask Ray for {resources(amounts)}.")
    if to_build:
        line += (f" It would first build {' and '.join(to_build)}, not built yet "
                 f"(`python -m lopd_ray.build_model model.path={to_build[0]}` builds it now).")
    return line
