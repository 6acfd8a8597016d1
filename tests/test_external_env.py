"""An env of the user's own, in a module outside the package (docs/examples/reverse_words.py, the module docs/envs.md
shows): named by import path, its options read into its own dataclass, trained and evaluated from the folder that
holds it, and every misnaming refused in one line."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, head_address
from lopd_ray.config import load_config
from lopd_ray.envs import make_env
from lopd_ray.errors import ConfigError
from lopd_ray.preflight import check_registries, check_unread_keys

EXAMPLE = os.path.join(REPO, "docs", "examples", "reverse_words.py")
RECIPE = os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml")


def checked(*overrides: str):
    cfg = load_config(RECIPE, list(overrides))
    check_registries(cfg)
    check_unread_keys(cfg)
    return cfg


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as caught:
        checked(*overrides)
    return str(caught.value)


def test_docs_show_the_example_module_as_it_is():
    with open(EXAMPLE) as f:
        assert f.read() in open(os.path.join(REPO, "docs", "envs.md")).read()


def test_an_env_named_by_import_path_takes_its_options_and_its_keys(monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(EXAMPLE))
    cfg = checked("env.name=reverse_words:ENV", "env.options.word_length=3", "env.options.num_tasks=5")
    new_env, tasks = make_env(cfg.env)
    assert len(tasks) == 5 and all(len(tasks.reference_solution(i)) == 3 for i in range(5))
    env = new_env()
    env.reset(tasks[0])
    assert env.step(f" {tasks.reference_solution(0)}\n").reward == 1.0 and env.step("abc x").reward == 0.0
    _, test = make_env(checked("env.name=reverse_words:ENV", "env.options.num_tasks=5", "env.split=test").env)
    assert {t.messages[0]["content"] for t in test} != {t.messages[0]["content"] for t in tasks}

    assert refusal("env.name=reverse_words:ENV", "env.options.wordlength=3").startswith(
        "env.options.wordlength: Key 'wordlength' not in 'ReverseOptions'")
    assert "could not be converted to Integer" in refusal("env.name=reverse_words:ENV", "env.options.word_length=x")
    assert refusal("env.name=reverse_words:ENV", "env.limit=3").startswith(
        "env.limit=3 is never read by env.name=reverse_words:ENV")
    assert refusal("env.name=reverse_words:MISSING").startswith(
        "env.name=reverse_words:MISSING: reverse_words has no MISSING, not an EnvSpec")
    assert refusal("env.name=reverse_words:ReverseEnv").startswith(
        "env.name=reverse_words:ReverseEnv: reverse_words has a ABCMeta as ReverseEnv")
    assert "no module 'no_such_tasks' is importable from here" in refusal("env.name=no_such_tasks:ENV")
    assert refusal("env.name=reverse").startswith("env.name='reverse' is not registered")
    assert refusal("env.options.word_length=3").startswith("env.options.word_length is never read by env.name=letters")


@pytest.mark.ray
def test_the_example_env_trains_and_evaluates_from_the_users_folder(ray_cluster, tiny_model_dir, tmp_path):
    """As a user runs it: the module beside them, not in the library; the cluster's workers import it too."""
    shutil.copy(EXAMPLE, tmp_path / "reverse_words.py")
    env = dict(os.environ, RAY_ADDRESS=head_address(), PYTHONPATH=REPO)
    quick = ["rollout.engine=hf", "rollout.num_workers=1", "learner.num_learners=1", "run.loggers=[]",
             "run.progress_bar=false", "run.checkpoint_every_steps=0", "run.export_student=false",
             "sync.probe_prompts=0"]
    train = subprocess.run(
        [sys.executable, "-m", "lopd_ray.train", RECIPE, "env.name=reverse_words:ENV", "env.options.word_length=3",
         f"model.path={tiny_model_dir}", "train.total_steps=2", "train.prompts_per_step=4", "run.name=reverse",
         f"run.output_dir={tmp_path / 'runs'}", *quick], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300)
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-2000:]
    with open(tmp_path / "runs" / "reverse" / "metrics.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [0, 1]
    evaluated = subprocess.run(
        [sys.executable, "-m", "lopd_ray.eval", "--model", tiny_model_dir, "--bench", "reverse_words:ENV", "--n", "3",
         "rollout.engine=hf", "rollout.num_workers=1"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300)
    assert evaluated.returncode == 0, evaluated.stdout[-2000:] + evaluated.stderr[-2000:]
    with open(tmp_path / "runs" / "eval" / "reverse_words_ENV" / "summary.json") as f:
        summary = json.load(f)
    assert (summary["tasks"], summary["aggregate_name"]) == (3, "reverse_words:ENV mean reward x 100")
