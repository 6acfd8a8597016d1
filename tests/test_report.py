"""`python -m lopd_ray.report`: the curves and the table of a run, and one clear line for a missing run or a
metric the run never logged."""
from __future__ import annotations

import json

from lopd_ray.report import main, table


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
