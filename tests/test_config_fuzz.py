"""Every shipped recipe, mutated (wrong types, out-of-range and non-finite numbers, unknown keys, missing files,
malformed overrides and YAML, unicode, impossible resource requests): `python -m lopd_ray.train RECIPE ... --check`
either accepts the config or prints exactly one `config error:` line and exits 2, never a traceback; a number below
its range, NaN or infinity is always refused."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from lopd_ray.config import Config, flat_settings, load_config
from lopd_ray.errors import ConfigError
from lopd_ray.preflight import check_resources, fit_to_cluster, training_groups
from lopd_ray.cli.train import main

REPO = Path(__file__).resolve().parent.parent
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
PATH_KEYS = ("model.path", "env.data_dir", "bank.init_path", "composer.init_path", "bank.embedder_path",
             "run.resume", "teacher.model_path")
SYNTAX = ("learner.lr", "=5", "learner.lr==1", "learner..lr=1", "learner.lr=[", "learner.lr={a: 1}",
          "ｌearner.lr=1", "learner.lr=１e-3", "run.name=ünïcødé", "run.name=a/../../b", "run.name=..",
          "algorithm.name=ＬＯＰＤ", "env.name=", "nosuch.key=1", "learner.nosuch=1", "learner=5")
BELOW_RANGE = ("-1", "-0.5", "nan", "inf", "-inf")


def numeric_mutations(key: str, value) -> list[tuple[str, bool]]:
    """(override, must be refused) pairs for a number."""
    must_refuse = [(f"{key}={bad}", key != "rollout.top_k" or bad != "-1") for bad in BELOW_RANGE]
    return must_refuse + [(f"{key}=0", False), (f"{key}=1e30", False), (f"{key}=abc", True), (f"{key}=[1]", True)]


def mutations(recipe: Path, per_recipe: int, rng: random.Random) -> list[tuple[str, bool]]:
    """`per_recipe` (override, must be refused) pairs over the keys the recipe's config has."""
    settings = flat_settings(load_config(str(recipe)))
    pool: list[tuple[str, bool]] = []
    for key, value in settings.items():
        if isinstance(value, bool):
            pool += [(f"{key}=maybe", True), (f"{key}=2", False)]
        elif isinstance(value, (int, float)):
            pool += numeric_mutations(key, value)
        elif isinstance(value, list):
            pool += [(f"{key}=5", True), (f"{key}=[nosuch]", False)]
        else:
            pool += [(f"{key}=[1,2]", True), (f"{key}=ünïcødé", False)]
    pool += [(f"{key}=/nonexistent/x", key not in ("env.data_dir",)) for key in PATH_KEYS]
    pool += [(override, override.startswith(("=", "nosuch", "learner.nosuch", "ｌ", "run.name=a/", "run.name=..")))
             for override in SYNTAX]
    pool += [(f"{key}x=1", True) for key in rng.sample(sorted(settings), 3)]
    return rng.sample(pool, min(per_recipe, len(pool)))


def broken_recipes(tmp_path: Path) -> list[Path]:
    texts = {"unclosed.yaml": "learner:\n  lr: [1e-3\n", "tabs.yaml": "learner:\n\tlr: 1e-3\n",
             "list.yaml": "- learner\n- rollout\n", "scalar.yaml": "just a string\n",
             "bom_unicode.yaml": "\ufeffrun:\n  name: ünïcødé/..\n", "binary.yaml": "\x00\x01\x02",
             "unknown_base.yaml": "base: nosuch.yaml\n", "empty.yaml": ""}
    paths = []
    for name, text in texts.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        paths.append(tmp_path / name)
    return paths + [tmp_path / "missing.yaml"]


def check(argv: list[str], capsys) -> int:
    code = main([*argv, "--check"])
    captured = capsys.readouterr()
    if code == 2:
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("config error: "), (argv, captured.err)
    else:
        assert code == 0, (argv, code, captured.err)
    return code


# Letters recipes check in a tenth of a second, the agentic ones in about a second (their model and env checks are
# computed once per process), so the letters recipes take most of the mutations.
PER_RECIPE = {"letters": 30, "other": 8}


@pytest.mark.slow
def test_mutated_recipes_are_accepted_or_refused_in_one_line(tmp_path, capsys):
    rng = random.Random(0)
    tried = refused = 0
    for recipe in RECIPES:
        base = [f"run.output_dir={tmp_path / 'runs'}"]
        per_recipe = PER_RECIPE["letters" if recipe.name.endswith("_letters_cpu.yaml") else "other"]
        for override, must_refuse in mutations(recipe, per_recipe, rng):
            code = check([str(recipe), *base, override], capsys)
            assert not (must_refuse and code == 0), f"{recipe.name} accepted {override}"
            tried, refused = tried + 1, refused + (code == 2)
    for recipe in broken_recipes(tmp_path):
        assert check([str(recipe)], capsys) == 2, recipe.name  # an empty one too: it would run as the defaults
        tried += 1
    assert tried >= 500 and refused >= 300, (tried, refused)


@pytest.mark.parametrize("overrides", [["rollout.num_workers=64"], ["learner.cpus_per_learner=3"],
                                       ["ray.accelerator=gpu", "rollout.gpus_per_worker=1"]])
def test_impossible_resource_requests_are_refused_in_one_line(overrides):
    """On a 2-CPU cluster without GPUs, as start-up checks them (GPU shares fitted to the cluster first)."""
    cfg = load_config(str(REPO / "recipes" / "grpo_letters_cpu.yaml"), [*overrides, "train.prompts_per_step=64"])
    cluster = {"CPU": 2.0, "memory": 24e9}
    fit_to_cluster(cfg, cluster)
    with pytest.raises(ConfigError) as info:
        check_resources(cfg, training_groups(cfg), cluster)
    assert "\n" not in str(info.value)


def test_the_schema_defaults_pass_the_number_rules():
    load_config(None, [])
    assert all(not isinstance(v, float) or v == v for v in flat_settings(Config()).values())
