"""The evaluation command's pieces that need no model: argument parsing, benchmark configs, the aggregate."""
from __future__ import annotations

import os

import pytest

from lopd_ray.config import load_config
from lopd_ray.errors import ConfigError
from lopd_ray.cli.eval import BENCHMARKS, eval_overrides, parse_args, summarize


def test_arguments_mix_flags_and_overrides():
    args = parse_args(["--model", "m", "--bench", "envscaler", "env.envscaler.max_turns=4", "--n", "3"])
    assert (args.model, args.bench, args.n, args.temperature) == ("m", "envscaler", 3, 0.0)
    assert args.overrides == ["env.envscaler.max_turns=4"]
    with pytest.raises(SystemExit):
        parse_args(["--model", "m"])


def test_a_bench_that_names_an_env_runs_it_on_its_test_split_and_an_unknown_one_is_refused():
    from lopd_ray.preflight import check_registries

    cfg = load_config(None, eval_overrides(parse_args(["--model", "m", "--bench", "rules_tool", "env.split=train"])))
    assert (cfg.env.name, cfg.env.split) == ("rules_tool", "train")  # the user's override wins
    assert cfg.run_dir == os.path.abspath(os.path.join("runs", "eval", "rules_tool"))
    assert summarize("rules_tool", [], 0.0)["aggregate_name"] == "rules_tool mean reward x 100"
    with pytest.raises(ConfigError, match="env.name='nope' is not registered"):
        check_registries(load_config(None, eval_overrides(parse_args(["--model", "m", "--bench", "nope"]))))


@pytest.mark.parametrize("bench", sorted(BENCHMARKS))
def test_benchmark_overrides_make_a_valid_config(bench):
    args = parse_args(["--model", "builtin:tiny-qwen3", "--bench", bench, "env.limit=3"])
    cfg = load_config(None, eval_overrides(args))
    assert cfg.env.name in ("bfcl_multiturn", "envscaler", "code", "letters", "rules") and cfg.env.limit == 3
    assert cfg.rollout.max_model_len == 0  # the model's own context, whatever model is evaluated
    assert cfg.run_dir == os.path.abspath(os.path.join("runs", "eval", bench))  # its logs beside its results


def test_aggregate_is_mean_reward_times_100():
    rows = [{"reward": 1.0, "error": None}, {"reward": 0.5, "error": None},
            {"reward": 0.0, "error": "env step: KeyError: 'x'"}, {"reward": 1.0, "error": None}]
    summary = summarize("envscaler", rows, 1.0)
    assert summary["aggregate"] == pytest.approx(62.5)
    assert summary["solved"] == 2 and summary["tasks"] == 4 and summary["failed"] == 1
    assert summary["aggregate_name"] == BENCHMARKS["envscaler"].aggregate


def test_the_summary_says_all_tasks_only_when_every_task_of_the_split_ran():
    from lopd_ray.cli.eval import result_line, subset

    assert [subset(10, 10, 0), subset(4, 10, 0), subset(6, 6, 6), subset(3, 6, 6)] == [
        "all", "first 4 of 10", "first 6 (env.limit=6)", "first 3 of 6 (env.limit=6)"]
    summary = {"model": "m", "bench": "bfcl", "aggregate_name": "x", "aggregate": 0.0, "solved": 0, "tasks": 6,
               "failed": 0, "seconds": 1.0, "subset": subset(6, 6, 6)}
    assert "on bfcl (the first 6 (env.limit=6) tasks)" not in result_line(summary, "out")
    assert "on bfcl (its first 6 tasks (env.limit=6))" in result_line(summary, "out")
