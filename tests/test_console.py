"""What a run's last lines say (lopd_ray/reporting/console.py): sentences with its steps, time, headline metrics at
both ends, held-out result, checkpoints and the report command, the numbers worked out here by hand."""
from __future__ import annotations

import json

from lopd_ray.reporting.console import check_result, duration, resources, run_summary

REWARDS = [0.5, 0.4, 0.6, 0.5, 0.5, 0.4, 0.5, 0.45, 0.4, 0.5]
KL = [3.0, 2.0, 2.0, 1.0, 2.0, 0.5, 0.5, 0.5, 0.25, 0.25]


def write_run(run_dir, steps: int) -> None:
    run_dir.mkdir()
    rows = [{"step": s, "rollout/reward_mean": REWARDS[s], "rollout/reward_std": 0.4, "lopd/kl": KL[s],
             "distill/student_kl": 9.0, "timing_s/wall": 2.0} for s in range(steps)]
    rows[0]["eval/reward_mean"], rows[-1]["eval/reward_mean"] = 0.2, 0.6
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_run_ends_with_sentences_on_its_metrics_files_and_the_next_command(tmp_path):
    run = tmp_path / "lopd_letters_cpu"
    write_run(run, 10)
    text = run_summary(str(run), 65.0, 32, checkpoint=f"{run}/checkpoints/step_10", exported=f"{run}/export")
    # 10 steps of 2 s; first 5 rewards sum to 2.5, last 5 to 2.25; the KL's to 10 and 2; a mean over 5 steps of 32
    # samples with a spread of 0.4 is uncertain by 0.4 / sqrt(160) = 0.0316.
    assert text.splitlines() == [
        f"The run trained 10 steps (20 s of steps; this command took 1 min 05 s, start-up included). Its files are "
        f"in {run}.",
        "  Reward (rollout/reward_mean): 0.5 over the first 5 steps, 0.45 over the last 5; each mean is uncertain by "
        "about ±0.032 from sampling alone.",
        "  KL to the teacher (lopd/kl): 2 over the first 5 steps, 0.4 over the last 5.",
        "  Held-out reward of the student alone (eval/reward_mean): 0.2 at the first evaluation, 0.6 at the last "
        "(eval.jsonl).",
        f"  Checkpoints: {run}/checkpoints/step_10 is the latest.",
        f"  The trained student: {run}/export.",
        f"Next: python -m lopd_ray.report {run}"]
    assert "{" not in text


def test_a_short_run_gives_its_first_and_last_step_and_a_run_without_checkpoints_says_so(tmp_path):
    run = tmp_path / "short"
    write_run(run, 3)
    lines = run_summary(str(run), 5.0, 32).splitlines()
    # One step's mean of 32 samples with a spread of 0.4: 0.4 / sqrt(32) = 0.0707.
    assert lines[1] == ("  Reward (rollout/reward_mean): 0.5 at step 0, 0.6 at step 2; each step's mean is uncertain "
                        "by about ±0.071 from sampling alone.")
    assert lines[2] == "  KL to the teacher (lopd/kl): 3 at step 0, 2 at step 2."
    assert "  No checkpoint was written (run.checkpoint_every_steps=0)." in lines
    assert not any("student" in line and "export" in line for line in lines)
    assert not any("made no update" in line for line in lines)  # these rows hold no learner metrics


def test_the_summary_counts_the_steps_that_made_no_update(tmp_path):
    run = tmp_path / "idle"
    write_run(run, 4)
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row, (skipped, norm) in zip(rows, [(1.0, None), (0.0, 0.5), (0.0, float("nan")), (0.0, 0.2)]):
        row.update({"actor/skipped_update": skipped, **({} if norm is None else {"actor/grad_norm": norm})})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert "  2 of the 4 steps made no update (actor/skipped_update, actor/grad_norm)." in run_summary(
        str(run), 5.0, 32).splitlines()


def test_durations_resources_and_the_check_sentence():
    assert [duration(s) for s in (42.4, 185, 7620)] == ["42 s", "3 min 05 s", "2 h 07 min"]
    assert resources({"CPU": 1.7, "GPU": 5.0}) == "1.7 CPUs and 5 GPUs"
    assert check_result("/abs/runs/x", {"CPU": 1.2}, ["builtin:smollm2-135m-instruct"]) == (
        "The config checks out: a run would write to /abs/runs/x and ask Ray for 1.2 CPUs and 0 GPUs. It would first "
        "build builtin:smollm2-135m-instruct, not built yet (`python -m lopd_ray.build_model "
        "model.path=builtin:smollm2-135m-instruct` builds it now).")


def test_a_resumed_run_says_how_many_steps_this_command_trained(tmp_path):
    run = tmp_path / "resumed"
    write_run(run, 10)
    first = run_summary(str(run), 5.0, 32, resumed_at=6).splitlines()[0]
    assert first.startswith("This command trained 4 steps, 6 to 9 (the run resumed at step 6 and has 10)")
    assert run_summary(str(run), 5.0, 32).splitlines()[0].startswith("The run trained 10 steps")
