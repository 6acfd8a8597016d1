"""`python -m lopd_ray.report`: the curves and the table of a run, and one clear line for a missing run or a
metric the run never logged."""
from __future__ import annotations

import json

from lopd_ray.cli.report import main, table


def write_run(run_dir, rows):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": i, **r}) + "\n" for i, r in enumerate(rows)))


def test_the_table_holds_first_window_means_and_last(tmp_path):
    write_run(tmp_path / "run", [{"rollout/reward_mean": float(i), "lopd/kl": 10.0 - i} for i in range(12)])
    lines = table(str(tmp_path / "run"), ("rollout/reward_mean", "lopd/")).splitlines()
    assert lines[1].split() == ["rollout/reward_mean", "0", "2", "9", "11"]
    assert lines[2].split() == ["lopd/kl", "10", "8", "1", "-1"]


def test_a_missing_run_or_metric_is_one_line_naming_the_fix(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "no metrics.jsonl under" in capsys.readouterr().err
    write_run(tmp_path / "run", [{"rollout/reward_mean": 0.5, "lopd/kl": 1.0}])
    assert main([str(tmp_path / "run"), "rollout/reward_man"]) == 2
    err = capsys.readouterr().err
    assert "metric 'rollout/reward_man' is not in" in err and "did you mean rollout/reward_mean" in err
    assert len(err.strip().splitlines()) == 1
    assert main([str(tmp_path / "run"), "--table", "bank/"]) == 2
    assert main([str(tmp_path / "run"), "--table", "lopd/", "rollout/reward_mean"]) == 0


def write_rollouts(run_dir, step, gaps):
    (run_dir / "rollouts").mkdir(exist_ok=True)
    record = {"task_id": f"letters/train/{step}", "reward": 0.5, "prompt": "Reply with 'a' <twice>",
              "response_tokens": ["Ġa" * (i + 1) for i in range(len(gaps))], "teacher_student_gap": gaps}
    (run_dir / "rollouts" / f"step_{step}.jsonl").write_text(json.dumps(record) + "\n")


def test_png_and_html_reports_hold_the_panels_table_and_colored_rollouts(tmp_path):
    import matplotlib.image

    from lopd_ray.config import load_config, to_yaml

    run = tmp_path / "run"
    write_run(run, [{"rollout/reward_mean": 0.1 * i, "lopd/kl": 2.0 / (i + 1), "lopd/beta": 0.05 * i,
                     "timing_s/step": 0.5, "timing_s/learn": 0.2} for i in range(4)])
    (run / "config.yaml").write_text(to_yaml(load_config("recipes/lopd_letters_cpu.yaml")))
    for step in (0, 2, 3):
        write_rollouts(run, step, [1.5, -3.0])
    assert main([str(run), "--html"]) == 0
    pngs = sorted(p.name for p in (run / "report").glob("*.png"))
    assert pngs == ["beta.png", "curves.png", "kl.png", "reward.png", "timing.png"]
    height, width, _ = matplotlib.image.imread(run / "report" / "curves.png").shape
    assert width > height  # the four panels as a 2 x 2 grid, each wider than tall
    page = (run / "report" / "index.html").read_text()
    assert "<td>rollout/reward_mean</td><td>0</td><td>0.15</td><td>0.15</td><td>0.3</td>" in page
    assert "Rollouts of step 0" in page and "Rollouts of step 3" in page and "Rollouts of step 2" not in page
    assert 'style="background:rgba(0,160,0,0.75)" title="gap +1.500"> a</span>' in page
    assert 'style="background:rgba(220,0,0,1.00)" title="gap -3.000"> a a</span>' in page
    assert "Reply with &#x27;a&#x27; &lt;twice&gt;" in page  # escaped
    assert "<td>algorithm.name</td><td>lopd</td>" in page


def test_the_teachers_held_out_reward_is_drawn_dashed_in_the_students_colour():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lopd_ray.reporting.figures import PANELS, _draw, panel_series

    rows = [{"step": i, "rollout/reward_mean": 0.1 * i, "eval/reward_mean": 0.2 * i,
             "eval/teacher_reward_mean": 1.0 - 0.2 * i} for i in range(3)]
    fig, ax = plt.subplots()
    _draw(ax, PANELS["reward"], panel_series(rows, PANELS["reward"]))
    rollout, student, teacher = ax.lines
    assert teacher.get_label() == "teacher" and teacher.get_linestyle() == "--"
    assert teacher.get_color() == student.get_color() != rollout.get_color()
    assert student.get_linestyle() == "-" and list(teacher.get_ydata()) == [1.0, 0.8, 0.6]
    plt.close(fig)


def test_png_report_skips_panels_the_run_never_logged(tmp_path):
    run = tmp_path / "run"
    write_run(run, [{"rollout/reward_mean": 0.5}, {"rollout/reward_mean": 0.7}])
    assert main([str(run), "--png", str(tmp_path / "pics")]) == 0
    assert sorted(p.name for p in (tmp_path / "pics").glob("*.png")) == ["curves.png", "reward.png"]


def test_a_garbage_line_in_the_metrics_is_skipped_with_one_warning_naming_it(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run, [{"rollout/reward_mean": v} for v in (0.1, 0.2, 0.3, 0.4)])
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines[:2] + ["\x00{garbage]\n", "[1, 2]\n"] + lines[2:]))
    assert main([str(run), "rollout/reward_mean", "--table", "rollout/reward_mean"]) == 0
    out, err = capsys.readouterr()
    warnings = err.strip().splitlines()
    assert len(warnings) == 2, err  # one per bad line, though the report reads the file three times
    assert warnings[0].startswith(f"warning: {run}/metrics.jsonl line 3 is not JSON (") and warnings[0].endswith(
        "): skipped")
    assert warnings[1] == f"warning: {run}/metrics.jsonl line 4 is not a JSON object with 'step': skipped"
    assert [line.split()[1] for line in out.splitlines() if line.strip().startswith("step ")] == ["0", "1", "2", "3"]
    assert out.splitlines()[-1].split() == ["rollout/reward_mean", "0.1", "0.25", "0.25", "0.4"]
