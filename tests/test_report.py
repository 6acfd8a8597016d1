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
    lines = table([str(tmp_path / "run")], ("rollout/reward_mean", "lopd/")).splitlines()
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


def write_rollouts(run_dir, step, gaps, **context):
    (run_dir / "rollouts").mkdir(exist_ok=True)
    record = {"task_id": f"letters/train/{step}", "reward": 0.5, "prompt": "Reply with 'a' <twice>",
              "response_tokens": ["Ġa" * (i + 1) for i in range(len(gaps))], "teacher_student_gap": gaps, **context}
    (run_dir / "rollouts" / f"step_{step}.jsonl").write_text(json.dumps(record) + "\n")


def test_png_and_html_reports_hold_the_panels_table_and_colored_rollouts(tmp_path):
    import matplotlib.image

    from lopd_ray.config import load_config, to_yaml

    run = tmp_path / "run"
    write_run(run, [{"rollout/reward_mean": 0.1 * i, "lopd/kl": 2.0 / (i + 1), "lopd/beta": 0.05 * i,
                     "timing_s/step": 0.5, "timing_s/learn": 0.2} for i in range(4)])
    (run / "config.yaml").write_text(to_yaml(load_config("recipes/lopd_letters_cpu.yaml")))
    for step in (0, 2, 3):
        write_rollouts(run, step, [1.5, -3.0], retrieved_texts=["Task: aa <done>", "Task: b"])
    assert main([str(run), "--html"]) == 0
    pngs = sorted(p.name for p in (run / "report").glob("*.png"))
    assert pngs == ["beta.png", "curves.png", "kl.png", "reward.png", "timing.png"]
    height, width, _ = matplotlib.image.imread(run / "report" / "curves.png").shape
    assert width > height  # the four panels as a 2 x 2 grid, each wider than tall
    page = (run / "report" / "index.html").read_text()
    assert "<td>rollout/reward_mean</td><td>0</td><td>0.15</td><td>0.15</td><td>0.3</td>" in page
    assert "rollouts of step 0" in page and "rollouts of step 3" in page and "rollouts of step 2" not in page
    assert 'style="background:rgba(0,114,178,0.45)" title="gap +1.500"> a</span>' in page  # 1.5 of 2 nats
    assert 'style="background:rgba(230,159,0,0.60)" title="gap -3.000"> a a</span>' in page  # saturated
    assert page.count("teacher likes it more") == 2  # the key, once per step shown
    assert "<li>Task: aa &lt;done&gt;</li><li>Task: b</li>" in page  # what the composer read, escaped
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
    _draw(ax, PANELS["reward"], {"run": panel_series(rows, PANELS["reward"])})
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


def contrast(foreground: tuple, background: tuple) -> float:
    """WCAG 2's contrast ratio of two sRGB colours (0-255)."""
    def luminance(rgb):
        lin = [c / 255 / 12.92 if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    high, low = sorted((luminance(foreground), luminance(background)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_the_token_colours_keep_the_text_readable():
    from lopd_ray.reporting.page import GAP_ALPHA, GAP_COLOURS, TEXT_COLOUR

    text = tuple(int(TEXT_COLOUR[i:i + 2], 16) for i in (1, 3, 5))
    for colour in GAP_COLOURS.values():  # the strongest background, laid over the white page
        over_white = tuple(GAP_ALPHA * c + (1 - GAP_ALPHA) * 255 for c in colour)
        assert contrast(text, over_white) >= 4.5, colour


def test_runs_side_by_side_share_the_axes_the_table_and_the_page(tmp_path, capsys):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lopd_ray.config import load_config, to_yaml
    from lopd_ray.reporting.figures import PANELS, _draw, panel_series

    runs = {"grpo": [0.1, 0.2, 0.3], "opsd": [0.2, 0.5, 0.9]}
    for name, rewards in runs.items():
        write_run(tmp_path / name, [{"rollout/reward_mean": r, "eval/reward_mean": r / 2} for r in rewards])
        (tmp_path / name / "config.yaml").write_text(to_yaml(load_config(f"recipes/{name}_letters_cpu.yaml")))
        write_rollouts(tmp_path / name, 0, [0.5], teacher_context="The answer is aaaa")
    dirs = [str(tmp_path / name) for name in runs]
    assert main([*dirs, "rollout/reward_mean", "--table", "rollout/"]) == 0
    out = capsys.readouterr().out
    assert out.count("== ") == 2 and out.splitlines()[-2].split() == ["metric", "grpo", "opsd"]
    assert out.splitlines()[-1].split() == ["rollout/reward_mean", "0.2", "0.5333"]  # each run's last-5 mean

    fig, ax = plt.subplots()
    _draw(ax, PANELS["reward"], {name: panel_series([{"step": i, "rollout/reward_mean": r,
                                                       "eval/reward_mean": r / 2} for i, r in enumerate(rewards)],
                                                      PANELS["reward"]) for name, rewards in runs.items()})
    lines = {line.get_label(): line for line in ax.lines}
    assert sorted(lines) == ["grpo: eval/reward_mean", "grpo: rollout/reward_mean", "opsd: eval/reward_mean",
                             "opsd: rollout/reward_mean"]
    assert lines["grpo: rollout/reward_mean"].get_color() == lines["grpo: eval/reward_mean"].get_color() != \
        lines["opsd: rollout/reward_mean"].get_color()
    assert lines["opsd: eval/reward_mean"].get_linestyle() == "--" and ax.get_yscale() == "linear"
    assert ax.get_ylabel() == "mean reward per episode"
    plt.close(fig)

    page_path = tmp_path / "both.html"
    assert main([*dirs, "--html", str(page_path)]) == 0
    page = page_path.read_text()
    assert "<title>grpo vs opsd</title>" in page and "<th>setting</th><th>grpo</th><th>opsd</th>" in page
    assert "<td>algorithm.name</td><td>grpo</td><td>distill</td>" in page
    assert "<td>rollout/reward_mean</td><td>0.2</td><td>0.5333</td>" in page
    assert page.count("rollouts of step 0") == 2 and "grpo: rollouts of step 0" in page
    assert "Teacher's context:</b>\nThe answer is aaaa" in page


def test_a_narrow_kl_range_stays_on_a_linear_axis_and_a_wide_one_goes_log():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lopd_ray.reporting.figures import PANELS, _draw

    for values, scale in (([0.30, 0.25, 0.21], "linear"), ([2.0, 0.1, 0.001], "log")):
        fig, ax = plt.subplots()
        _draw(ax, PANELS["kl"], {"run": {"lopd/kl": ([0, 1, 2], values)}})
        assert ax.get_yscale() == scale and ax.get_ylabel() == "KL (nats per token)"
        plt.close(fig)


def test_one_runs_timing_is_its_stages_stacked_under_the_step():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lopd_ray.reporting.figures import PANELS, _draw

    fig, ax = plt.subplots()
    _draw(ax, PANELS["timing"], {"run": {"timing_s/rollout": ([0, 1], [0.5, 0.6]), "timing_s/learn": ([1], [0.2]),
                                         "timing_s/step": ([0, 1], [0.9, 0.9])}})
    assert len(ax.collections) == 2 and [line.get_label() for line in ax.lines] == ["timing_s/step"]
    top = ax.collections[1].get_paths()[0].vertices[:, 1].max()
    assert abs(top - 0.8) < 1e-9  # the stages stacked: 0.6 + 0.2 at step 1 (learn, not logged at step 0, is 0 there)
    plt.close(fig)
    fig, ax = plt.subplots()  # several runs: each run's step time alone
    _draw(ax, PANELS["timing"], {name: {"timing_s/rollout": ([0], [0.5]), "timing_s/step": ([0], [0.9])}
                                 for name in ("a", "b")})
    assert [line.get_label() for line in ax.lines] == ["a: timing_s/step", "b: timing_s/step"]
    plt.close(fig)
