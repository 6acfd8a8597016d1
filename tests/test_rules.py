"""The `rules` testbed: exact-match reward, kinds shared and task texts disjoint across splits (for every shipped
task source), the warm start's answers following the reference's content, the control contexts, the gate's
checks, and the committed base model passing them."""
from __future__ import annotations

import random

import pytest

from conftest import env_config, text_gate
from lopd_ray.config import Config, load_config
from lopd_ray.envs import make_env
from lopd_ray.envs.rules import KINDS, TAGS, RulesTasks, rule_tags
from lopd_ray.errors import ConfigError


def texts(env_name: str, split: str, **fields) -> set[str]:
    _, tasks = make_env(env_config(env_name, split=split, **fields))
    return {tasks[i].user_text for i in range(len(tasks))}


# (env, its training split, its held-out split, settings); BFCL has no split (an evaluation benchmark only), and
# MBPP+'s `test` is the whole benchmark, not a held-out part of `train`.
HELD_OUT_SPLITS = [
    ("rules", "train", "test", {"num_tasks": 2400}),
    ("rules_tool", "train", "test", {"num_tasks": 2400}),
    ("envscaler", "train", "test", {}),
    ("code", "train", "heldout", {"subset": "mbpp"}),
]


@pytest.mark.parametrize("env_name,train,held_out,fields", HELD_OUT_SPLITS)
def test_train_and_held_out_task_texts_are_disjoint(env_name, train, held_out, fields):
    train_texts, held_texts = texts(env_name, train, **fields), texts(env_name, held_out, **fields)
    assert train_texts and held_texts
    assert not train_texts & held_texts


def test_letters_refuses_a_held_out_split_it_does_not_have():
    assert len(texts("letters", "train")) <= 10  # its few prompts: any split would repeat them
    with pytest.raises(ConfigError, match="letters has no held-out split"):
        make_env(env_config("letters", split="test"))


def test_rules_splits_share_the_kinds_and_each_kind_has_its_own_tag():
    train, test = RulesTasks(512, "train"), RulesTasks(64, "test")
    assert {t.meta["kind"] for t in train.tasks} == {t.meta["kind"] for t in test.tasks} == set(KINDS)
    assert sorted(rule_tags().values()) == sorted(TAGS)
    for tasks in (train, test):
        for i, t in enumerate(tasks.tasks):
            assert t.meta["kind"] in t.user_text and " ".join(t.meta["letters"]) in t.user_text
            assert tasks.reference_solution(i) == f"#{rule_tags()[t.meta['kind']]} " + " ".join(t.meta["letters"])
    assert len({t.user_text for t in train.tasks}) == 512  # no task repeats within a split either


def test_rules_reward_is_an_exact_match_of_tag_and_input():
    new_env, tasks = make_env(env_config("rules", split="test"))
    task = tasks[0]
    tag, letters = rule_tags()[task.meta["kind"]], " ".join(task.meta["letters"])
    wrong_tag = next(t for t in TAGS if t != tag)
    for answer, reward in [(f"#{tag} {letters}", 1.0), (f"  #{tag}  {letters}\n", 1.0),
                           (f"#{wrong_tag} {letters}", 0.0), (f"{tag} {letters}", 0.0), (letters, 0.0), (f"#{tag} {letters} a", 0.0), ("", 0.0)]:
        env = new_env()
        env.reset(task)
        assert env.step(answer).reward == reward, answer


def test_rules_limit_keeps_the_first_tasks():
    _, tasks = make_env(env_config("rules", split="train", limit=16))
    assert len(tasks) == 16 and tasks[3].task_id == "rules/train/3"


def test_warm_examples_answer_with_the_reference_tag_and_guess_alone():
    """The answers depend on the reference's content: with a solved example (matched codename or not) the tag is
    the example's; alone or under an empty framing the tag is uniform over TAGS; the env's codenames never appear."""
    from lopd_ray.warm_start.rules import warm_example

    cfg, rng = Config(), random.Random(0)
    with_reference, alone_tags = 0, []
    for _ in range(2000):
        messages, answer = warm_example(rng, cfg)
        content = messages[0]["content"]
        assert not any(f"the {kind} rule" in content for kind in KINDS)
        tag = answer.split()[0].removeprefix("#")
        lines = [line.removeprefix("Action: ").split() for line in content.splitlines()]
        shown = [words[0][1:] for words in lines if len(words) in (4, 5) and words[0][1:] in TAGS]
        if shown:
            with_reference += 1
            assert shown == [tag]
        else:
            alone_tags.append(tag)
    assert 1000 < with_reference < 1600
    counts = [alone_tags.count(t) for t in TAGS]
    assert min(counts) > len(alone_tags) / len(TAGS) * 0.6


def test_wrong_kind_control_shows_another_kinds_solution_and_empty_shows_none():
    from lopd_ray.data.trajectory import Trajectory
    from lopd_ray.teacher.contexts import make_context

    _, tasks = make_env(env_config("rules", split="train"))
    trajs = [Trajectory(tasks[i].task_id, i, [], [1], [1], [], [], 0, task_index=i, uid=i) for i in range(16)]
    for t in trajs:
        t.task_text = tasks[t.task_index].user_text
    cfg = load_config(None, ["env.name=rules", "context.name=wrong_kind"])
    provider = make_context(cfg, tasks)
    provider.attach(trajs, step=0)
    for t in trajs:
        own_tag = rule_tags()[tasks[t.task_index].meta["kind"]]
        shown = t.teacher_context.text.split("=== Reference Solution Begin ===\n")[1].split()[0]
        assert shown.removeprefix("#") in TAGS and shown != f"#{own_tag}"
    cfg = load_config(None, ["env.name=rules", "context.name=empty_oracle"])
    make_context(cfg, tasks).attach(trajs, step=0)
    assert all("Begin ===\n\n=== Reference Solution End" in t.teacher_context.text for t in trajs)


def test_gate_checks_need_content_not_framing():
    from lopd_ray.study.gate import checks

    def results(own, retrieved, other):
        return {"alone": {"reward": 0.1}, "own solution, opsd": {"reward": own},
                "retrieved same kind, lopd_text": {"reward": retrieved},
                "retrieved same kind, lopd latents": {"reward": 0.1},
                "other kind's solution, opsd": {"reward": other}}

    assert all(c["passed"] for c in checks(results(0.9, 0.8, 0.0), 0.2, check_latents=False))
    failed = [c["check"] for c in checks(results(0.9, 0.8, 0.0), 0.2, check_latents=True) if not c["passed"]]
    assert failed == ["retrieved same kind, lopd latents >= alone + 0.2",
                      "other kind's solution (best) <= own/retrieved (worst) - 0.2"]
    # a teacher that is better whatever its context says (the framing, not the content) fails
    failed = [c["check"] for c in checks(results(0.9, 0.9, 0.85), 0.2, check_latents=False) if not c["passed"]]
    assert failed == ["other kind's solution (best) <= own/retrieved (worst) - 0.2"]
    assert not checks(results(0.25, 0.8, 0.0), 0.2, check_latents=False)[0]["passed"]
    # latents that help whatever entries they read: another kind's entries help as much as the task's own kind's
    latent_rows = {**results(0.9, 0.8, 0.0), "retrieved same kind, lopd latents": {"reward": 0.9},
                   "other kind's solution, lopd latents": {"reward": 0.85}}
    assert all(c["passed"] for c in checks(latent_rows, 0.2, check_latents=False))
    failed = [c["check"] for c in checks(latent_rows, 0.2, check_latents=True) if not c["passed"]]
    assert failed == ["other kind's solution (best) <= own/retrieved (worst) - 0.2"]


def test_committed_rules_model_was_trained_from_the_current_sources():
    """The builtin copies committed weights: a change to the env, the framings or the warm start must retrain them
    (python -m lopd_ray.warm_start.rules)."""
    import json
    import os

    from lopd_ray.warm_start.rules import ASSET_DIR, warm_recipe

    with open(os.path.join(ASSET_DIR, "warm_recipe.json")) as f:
        assert json.load(f) == warm_recipe(), "retrain: python -m lopd_ray.warm_start.rules"


@pytest.mark.slow
def test_the_rules_base_model_passes_the_gate_because_of_its_contexts_content():
    """The study's premise, on 16 held-out tasks (greedy): the teacher with the task's own or a retrieved same-kind
    solution beats the student alone, another kind's solution misleads it, an empty framing changes nothing."""
    from lopd_ray.study.gate import checks

    results, held = text_gate("rules", "builtin:tiny-qwen3-rules")
    assert all(c["passed"] for c in checks(results, 0.2, check_latents=False)), results
    assert results["alone"]["reward"] <= 0.4
    for name in ("lopd_text", "opsd", "op2sd", "sdpo"):
        assert results[f"own solution, {name}"]["reward"] >= 0.9
        assert results[f"other kind's solution, {name}"]["reward"] <= 0.1
        assert results[f"empty framing, {name}"]["kl_teacher_student"] < 0.05
    answers = results["own solution, opsd"]["answers"]
    assert len(answers) == 3 and sum(a == held.reference_solution(i) for i, a in enumerate(answers)) >= 2


@pytest.mark.parametrize("env_name", ["rules", "rules_tool"])
def test_referenced_kinds_leaves_the_other_kinds_train_tasks_without_a_solution(env_name):
    _, train = make_env(env_config(env_name, split="train", num_tasks=64, referenced_kinds=3))
    _, test = make_env(env_config(env_name, split="test", num_tasks=64, referenced_kinds=3))
    shown = {train[i].meta["kind"] for i in range(len(train)) if train.reference_solution(i) is not None}
    assert shown == set(KINDS[:3]) and len(train) == 64
    assert all(test.reference_solution(i) is not None for i in range(len(test)))  # held out: every kind
    with pytest.raises(ValueError, match="referenced_kinds=0"):
        make_env(env_config(env_name, split="train", referenced_kinds=0))


def test_the_room_check_wants_latents_below_the_own_solution():
    from lopd_ray.study.gate import checks

    rows = {"alone": {"reward": 0.1}, "own solution, opsd": {"reward": 1.0},
            "retrieved same kind, lopd_text": {"reward": 0.6}, "other kind's solution, opsd": {"reward": 0.0}}
    roomy = {**rows, "retrieved same kind, lopd latents": {"reward": 0.55}}
    full = {**rows, "retrieved same kind, lopd latents": {"reward": 0.95}}
    assert all(c["passed"] for c in checks(roomy, 0.2, check_latents=True, check_room=True))
    failed = [c["check"] for c in checks(full, 0.2, check_latents=True, check_room=True) if not c["passed"]]
    assert failed == ["retrieved same kind, lopd latents <= own solution (worst) - 0.2"]
    assert len(checks(full, 0.2, check_latents=True)) == len(checks(full, 0.2, True, True)) - 1
