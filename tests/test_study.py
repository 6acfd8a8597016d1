"""`python -m lopd_ray.study`: the spec is checked before any run (arms, equal generation budgets, the held-out
evaluation), the grid expands as written, the summaries are the hand-computed means, and a 2-step 2-run grid writes
its files and is not rerun once finished."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import head_address
from lopd_ray.errors import ConfigError
from lopd_ray.study.plots import plot_title, write_plots
from lopd_ray.study.results import arm_summary, budget_to_reach, markdown_table
from lopd_ray.study.spec import check_runs, load_spec, plan_runs

REPO = Path(__file__).resolve().parent.parent
GRPO = str(REPO / "recipes" / "grpo_letters_cpu.yaml")
LOPD = str(REPO / "recipes" / "lopd_letters_cpu.yaml")


def write_spec(tmp_path, **fields) -> str:
    spec = {"name": "t", "common": ["train.total_steps=2", "eval.every_steps=1", "eval.tasks=4", "env.name=rules"],
            "methods": {"grpo": {"recipe": GRPO}, "lopd": {"recipe": LOPD}}, "seeds": [1, 2],
            "ablations": {"lopd_j1": {"method": "lopd", "overrides": ["bank.top_j=1"]}}, "gate": {"enabled": False},
            **fields}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_the_grid_is_methods_by_seeds_then_ablations_by_their_seeds_with_the_run_settings_last(tmp_path):
    spec = load_spec(write_spec(tmp_path, ablation_seeds=[3], quick={"arms": ["lopd_j1"], "seeds": [5],
                                                                     "overrides": ["train.total_steps=1"]}))
    runs = plan_runs(spec, str(tmp_path / "runs"))
    assert [r.run_id for r in runs] == ["grpo-s1", "grpo-s2", "lopd-s1", "lopd-s2", "lopd_j1-s3"]
    ablation = runs[-1]
    assert ablation.recipe == LOPD and ablation.kind == "ablation"
    # a method with a teacher watches it (eval.teacher) unless the spec's overrides say otherwise; GRPO has none
    assert ablation.overrides[:6] == ("eval.teacher=true", "train.total_steps=2", "eval.every_steps=1",
                                      "eval.tasks=4", "env.name=rules", "bank.top_j=1")
    assert ablation.overrides[6:8] == ("train.seed=3", f"run.output_dir={tmp_path / 'runs'}")
    assert not any(o.startswith("eval.teacher") for o in runs[0].overrides)
    quick = plan_runs(spec, str(tmp_path / "runs"), quick=True)
    assert [r.run_id for r in quick] == ["lopd_j1-s5"] and "train.total_steps=1" in quick[0].overrides


def test_three_lines_compare_methods_on_ones_own_env(tmp_path, monkeypatch):
    """Methods named in a list are their shipped recipes on one budget, the user's env set once."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "docs" / "examples"))
    (tmp_path / "compare.yaml").write_text("name: reverse\ncommon: [env.name=reverse_words:ENV]\n"
                                           "methods: [grpo, opsd, lopd]\n")
    runs = plan_runs(load_spec(str(tmp_path / "compare.yaml")), str(tmp_path / "runs"))
    assert [r.run_id for r in runs] == [f"{m}-s{s}" for m in ("grpo", "opsd", "lopd") for s in (1, 2, 3)]
    assert [os.path.basename(r.recipe) for r in runs[::3]] == ["grpo_letters_cpu.yaml", "opsd_letters_cpu.yaml",
                                                                "lopd_letters_cpu.yaml"]
    budget, steps = check_runs(runs)  # the letters recipes' own budgets differ: the schema's is every run's
    assert budget == {"episodes": 12 * 8 * 4, "max_new_tokens": 16, "refill_rounds": 0}
    assert "env.name=reverse_words:ENV" in runs[0].overrides and "eval.every_steps=10" in runs[0].overrides
    (tmp_path / "bad.yaml").write_text("name: x\nmethods: [grpo, gpro]\n")
    with pytest.raises(ConfigError, match=r"methods \['gpro'\] have no shipped recipe: choose among"):
        load_spec(str(tmp_path / "bad.yaml"))


def test_a_spec_may_leave_a_methods_teacher_unwatched(tmp_path):
    from lopd_ray.config import load_config

    spec = load_spec(write_spec(tmp_path, methods={"lopd": {"recipe": LOPD, "overrides": ["eval.teacher=false"]}},
                                ablations={}))
    assert [load_config(r.recipe, list(r.overrides)).eval.teacher for r in plan_runs(spec, str(tmp_path))] == [
        False, False]


@pytest.mark.parametrize("fields, expected", [
    ({"ablations": {"x": {"method": "ppo"}}}, "arm 'x' extends method 'ppo'"),
    ({"quick": {"arms": ["dpo"]}}, "quick.arms ['dpo'] are neither methods, ablations nor controls"),
    ({"seed": [1]}, "study spec"),
])
def test_a_bad_spec_is_one_config_error(tmp_path, fields, expected):
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        load_spec(write_spec(tmp_path, **fields))


@pytest.mark.parametrize("method_overrides, expected", [
    (["train.samples_per_prompt=8"], "do not share one generation budget"),
    (["eval.every_steps=0"], "eval.every_steps=0, so it would write no held-out curve"),
    (["bank.top_j=2"], "study run grpo-s1: bank.top_j=2 is never read"),
])
def test_every_run_is_checked_before_the_first_starts(tmp_path, method_overrides, expected):
    spec = load_spec(write_spec(tmp_path, methods={"grpo": {"recipe": GRPO, "overrides": method_overrides},
                                                   "lopd": {"recipe": LOPD}}))
    with pytest.raises(ConfigError, match=expected):
        check_runs(plan_runs(spec, str(tmp_path / "runs")))


def curve(rewards, solved):
    return [{"updates": i, "episodes": 32 * i, "tokens": 300 * i, "train_seconds": 2.0 * i, "reward_mean": r,
             "solved": s, "tasks": 4, "failed": 0.0} for i, (r, s) in enumerate(zip(rewards, solved))]


def test_an_arm_is_summed_up_by_the_mean_and_sample_std_of_its_seeds_final_evaluations(tmp_path):
    curves = [curve([0.5, 0.6, 0.9], [0.0, 0.25, 0.5]), curve([0.4, 0.7, 0.7], [0.0, 0.5, 0.5])]
    summary = arm_summary("method", curves)
    assert summary["initial_reward"] == pytest.approx(0.45)
    assert summary["final_reward"] == pytest.approx(0.8)
    assert summary["final_reward_std"] == pytest.approx(((0.1 ** 2 + 0.1 ** 2) / 1) ** 0.5)
    assert summary["final_solved_std"] == 0.0 and summary["episodes"] == 64 and summary["train_seconds"] == 4.0
    results = {"name": "t", "failed": ["x-s1"], "arms": {"grpo": summary},
               "runs": {f"grpo-s{i}": {"arm": "grpo", "curve": c} for i, c in enumerate(curves)}}
    assert "| grpo | method | 2 | 0.450 | 0.800 ± 0.141 | - | - | 0.500 ± 0.000 | 64 | 600 | 4 |" in markdown_table(
        results)
    # sample efficiency: the first evaluation whose mean over seeds (0.45, 0.65, 0.8) reaches the target
    assert budget_to_reach(results, "grpo", 0.6) == {"episodes": 32.0, "train_seconds": 2.0}
    assert budget_to_reach(results, "grpo", 0.8) == {"episodes": 64.0, "train_seconds": 4.0}
    assert budget_to_reach(results, "grpo", 0.81) == {"episodes": None, "train_seconds": None}
    for path in write_plots(str(tmp_path), results):
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert plot_title(results) == "t"
    results["budget"] = {"episodes": 2880, "max_new_tokens": 8}
    for seed, run in enumerate(results["runs"].values(), 1):
        run.update(seed=seed, overrides=["model.path=builtin:tiny-qwen3-rules", f"train.seed={seed}"])
    assert plot_title(results) == "t; builtin:tiny-qwen3-rules; 2880 episodes, 8 new tokens per turn; seeds 1, 2"


def test_an_arm_that_watched_its_teacher_has_the_teachers_start_and_end_and_its_dashed_curve():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lopd_ray.study.plots import draw_arm

    curves = [curve([0.1, 0.2, 0.3], [0.0] * 3), curve([0.2, 0.2, 0.4], [0.0] * 3)]
    for c, teacher in zip(curves, ([0.9, 0.6, 0.3], [1.0, 0.5, 0.45])):
        for row, value in zip(c, teacher):
            row["teacher_reward_mean"] = value
    summary = arm_summary("method", curves)
    assert summary["initial_teacher_reward"] == pytest.approx(0.95)
    assert summary["final_teacher_reward"] == pytest.approx(0.375)
    results = {"name": "t", "failed": [], "arms": {"opsd": summary},
               "runs": {f"opsd-s{i}": {"arm": "opsd", "curve": c} for i, c in enumerate(curves)}}
    assert "| opsd | method | 2 | 0.150 | 0.350 ± 0.071 | 0.950 | 0.375 | 0.000 ± 0.000 |" in markdown_table(results)
    fig, ax = plt.subplots()
    draw_arm(ax, results, "opsd", summary, "episodes")
    student, teacher = ax.lines
    assert teacher.get_label() == "opsd teacher" and teacher.get_linestyle() == "--"
    assert teacher.get_color() == student.get_color() and student.get_linestyle() == "-"
    assert list(teacher.get_ydata()) == pytest.approx([0.95, 0.55, 0.375])
    plt.close(fig)


# A cluster of two raylets on this host, its job API and its head's agent on the ports given (Ray's fixed default for
# the agent may be another cluster's); it lives until its stdin closes.
SIMULATED_CLUSTER = """
import sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 1, "include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": int(sys.argv[1]),
    "dashboard_agent_listen_port": int(sys.argv[2])})
cluster.add_node(num_cpus=2)
print("READY", flush=True)
sys.stdin.read()
cluster.shutdown()
"""


def same_numbers(results: dict) -> dict:
    """results.json less what differs between two executions of one grid: the seconds."""
    return {run_id: [{k: v for k, v in row.items() if "seconds" not in k} for row in run["curve"]]
            for run_id, run in results["runs"].items()}


@pytest.mark.ray
def test_a_two_step_two_run_grid_writes_its_files_and_keeps_finished_runs(ray_cluster, tmp_path):
    spec = write_spec(tmp_path, methods={"grpo": {"recipe": GRPO, "overrides": [
        "rollout.engine=hf", "rollout.num_workers=1", "learner.num_learners=1", "train.prompts_per_step=2",
        "train.samples_per_prompt=2", "run.checkpoint_every_steps=0", "run.export_student=false",
        "run.loggers=[]"]}}, ablations={})
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ADDRESS=head_address())  # the runs join the session's cluster
    command = [sys.executable, "-m", "lopd_ray.study", spec, "--out", str(tmp_path / "out")]
    first = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    out = tmp_path / "out" / "t"
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["runs"]) == ["grpo-s1", "grpo-s2"]
    for run in results["runs"].values():
        assert [row["updates"] for row in run["curve"]] == [0, 1, 2]
        assert [row["episodes"] for row in run["curve"]] == [0, 4, 8]   # 2 prompts x 2 samples per step
        assert all(row["tasks"] == 4 and 0.0 <= row["reward_mean"] <= 1.0 for row in run["curve"])
    assert results["arms"]["grpo"]["seeds"] == 2 and results["budget"]["episodes"] == 8
    assert "| grpo | method | 2 |" in (out / "results.md").read_text()
    assert (out / "held_out_vs_episodes.png").stat().st_size > 0
    assert (out / "held_out_vs_train_seconds.png").stat().st_size > 0
    # As jobs of a two-node cluster, two at once: the same numbers
    import socket

    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        port, agent_port = a.getsockname()[1], b.getsockname()[1]
    alone = dict(env, RAY_ADDRESS="")
    cluster = subprocess.Popen([sys.executable, "-c", SIMULATED_CLUSTER, str(port), str(agent_port)], cwd=REPO,
                               env=alone,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert cluster.stdout.readline().strip() == "READY"
        jobs = subprocess.run([*command[:-1], str(tmp_path / "jobs"), "--address", f"http://127.0.0.1:{port}",
                               "--parallel", "2"], cwd=REPO, env=alone, capture_output=True,
                              text=True, timeout=600)
    finally:
        cluster.communicate("", timeout=120)
    assert jobs.returncode == 0, jobs.stdout[-2000:] + jobs.stderr[-3000:]
    schedule = json.loads((tmp_path / "jobs" / "t" / "runs" / "schedule.json").read_text())
    first, second = (schedule[f"grpo-s{seed}"] for seed in (1, 2))
    assert first["started"] < second["ended"] and second["started"] < first["ended"]  # they ran at the same time
    assert same_numbers(json.loads((tmp_path / "jobs" / "t" / "results.json").read_text())) == same_numbers(results)
    again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("finished before, kept") == 2, again.stdout
    assert json.loads((out / "results.json").read_text())["runs"] == results["runs"]
    (out / "runs" / "grpo-s2" / "eval.jsonl").unlink()  # unfinished now: --collect leaves it out and runs nothing
    collected = subprocess.run(command + ["--collect"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-3000:]
    assert sorted(json.loads((out / "results.json").read_text())["runs"]) == ["grpo-s1"]
    assert not (out / "runs" / "grpo-s2" / "eval.jsonl").exists()


@pytest.mark.parametrize("spec_file", sorted((REPO / "recipes" / "studies").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_spec_checks_in_each_of_its_modes(spec_file, tmp_path):
    """Whole, --quick and at every scale: each run's config loads, reads every key it is given, evaluates held out,
    and all runs share one generation budget."""
    spec = load_spec(str(spec_file))
    for quick, scale in [(False, "cpu"), (True, "cpu"), *((False, name) for name in spec.scales)]:
        runs = plan_runs(spec, str(tmp_path / "runs"), quick, scale)
        assert runs and check_runs(runs)


def test_gate_on_a_spec_without_one_is_refused(tmp_path):
    from lopd_ray.study.__main__ import study

    with pytest.raises(ConfigError, match="gate.enabled=false"):
        study([write_spec(tmp_path), "--gate", "--out", str(tmp_path / "out")])


def test_arms_and_seeds_choose_runs_of_the_grid_and_refuse_others():
    from lopd_ray.study.__main__ import chosen_runs
    from lopd_ray.study.spec import RunSpec

    runs = [RunSpec(f"{arm}-s{seed}", arm, "method", seed, "r.yaml", ()) for arm in ("grpo", "lopd")
            for seed in (1, 2)]
    assert chosen_runs(runs, "", "") == runs
    assert [r.run_id for r in chosen_runs(runs, "lopd", "1")] == ["lopd-s1"]
    assert [r.run_id for r in chosen_runs(runs, "", "2")] == ["grpo-s2", "lopd-s2"]
    with pytest.raises(ConfigError, match=r"--arms: \['opsd'\]"):
        chosen_runs(runs, "lopd,opsd", "")
    with pytest.raises(ConfigError, match=r"--seeds: \['3'\]"):
        chosen_runs(runs, "", "3")


def test_redraw_draws_the_figures_and_the_table_from_results_json_alone(tmp_path):
    from lopd_ray.study.__main__ import study

    spec = write_spec(tmp_path)
    out = tmp_path / "out" / "t"
    with pytest.raises(ConfigError, match="--redraw: no .*results.json: run the study first"):
        study([spec, "--out", str(tmp_path / "out"), "--redraw"])
    curves = [curve([0.5, 0.9], [0.0, 0.5])]
    results = {"name": "t", "failed": [], "arms": {"grpo": arm_summary("method", curves)},
               "runs": {"grpo-s1": {"arm": "grpo", "curve": curves[0], "seed": 1}}}
    out.mkdir(parents=True)
    (out / "results.json").write_text(json.dumps(results))
    assert study([spec, "--out", str(tmp_path / "out"), "--redraw"]) == 0
    assert "| grpo | method | 1 | 0.500 | 0.900 ± 0.000 |" in (out / "results.md").read_text()
    assert sorted(p.name for p in out.glob("*.png")) == ["held_out_vs_episodes.png", "held_out_vs_train_seconds.png"]
    assert not (out / "runs").exists()  # nothing ran
