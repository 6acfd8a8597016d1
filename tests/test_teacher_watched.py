"""The teacher, watched (eval.teacher): greedy episodes under a teacher's context (lopd_ray/teacher/greedy.py, which
the gate and the teacher actor share), the teacher actor playing held-out tasks as the gate does, the config's
refusals, and a run whose teacher's context is emptied mid-way."""
from __future__ import annotations

import logging
import os

import pytest
import torch

from lopd_ray.config import load_config
from lopd_ray.data.trajectory import TeacherContext
from lopd_ray.envs.base import StepResult, Task
from lopd_ray.errors import ConfigError
from lopd_ray.teacher.greedy import greedy_answer, play, prompt_embeds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPSD = os.path.join(REPO, "recipes", "opsd_letters_cpu.yaml")
# recipes/studies/rules.yaml's `common`: the rules testbed and its warm-started model (the gate on its first 16
# held-out tasks: the student alone 0.125, the teacher with the task's own solution 1.000)
RULES = ["env.name=rules", "model.path=builtin:tiny-qwen3-rules", "rollout.max_new_tokens=8"]


def test_a_greedy_answer_is_the_argmax_continuation_of_the_prompt_with_the_context_in_it(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "Reply with the letter 'a' repeated 4 times."}]
    context = TeacherContext("\nA solved example: aaaa", "user_suffix")
    with torch.no_grad():
        embeds = prompt_embeds(model, tok, messages, context, torch.zeros(0, model.config.hidden_size), 0)
        answer = greedy_answer(model, tok, embeds, 6)
        # by hand: the context appended to the user message, then the most likely next token, one at a time
        text = tok.apply_chat_template([{"role": "user", "content": messages[0]["content"] + context.text}],
                                       add_generation_prompt=True, tokenize=False)
        ids, expected = tok(text, add_special_tokens=False)["input_ids"], []
        while len(expected) < 6 and tok.eos_token_id not in expected:
            expected.append(int(model(torch.tensor([ids + expected])).logits[0, -1].argmax()))
    assert embeds.shape[1] == len(ids)
    assert answer == expected


class TwoTurnEnv:
    """Ends at its second step, with reward 1 if the answer there is "b"; replies "again" after the first."""
    max_turns = 3

    def reset(self, task):
        self.steps = 0

    def step(self, text):
        self.steps += 1
        return StepResult(done=self.steps == 2, reward=float(text == "b"),
                          observation=[{"role": "user", "content": "again"}])


class Letters:
    """A tokenizer's decode for one-letter ids (0 -> "a", 1 -> "b")."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("ab"[i] for i in ids)


def test_an_episode_appends_the_envs_replies_and_scores_its_end():
    task = Task("t/0", [{"role": "user", "content": "go"}])
    seen = []

    def answer(messages):
        seen.append(messages)
        return [len(seen) - 1]  # "a", then "b", then "b"...

    episode = play(task, TwoTurnEnv, answer, Letters())
    assert episode.reward == 1.0 and episode.texts == ["a", "b"]
    assert seen == [task.messages, task.messages + [{"role": "assistant", "content": "a"},
                                                    {"role": "user", "content": "again"}]]
    assert [ids for _, ids in episode.turns] == [[0], [1]]
    never_done = play(task, lambda: type("Endless", (TwoTurnEnv,), {"max_turns": 1})(), lambda m: [1], Letters())
    assert never_done.reward == 0.0 and never_done.texts == ["b"]  # no end within max_turns scores 0


def test_the_teacher_actor_plays_held_out_tasks_as_the_gate_scores_them():
    """Under the task's own solution (OPSD's oracle over the held-out split) and under its empty framing, the
    teacher's rewards per task are the gate's, and the solution lifts them (the gate's 1.000 against 0.125)."""
    from lopd_ray.controller import held_out_probes
    from lopd_ray.envs import make_env
    from lopd_ray.models import resolve_model_path
    from lopd_ray.study.gate import Probe, Scorer
    from lopd_ray.teacher.contexts import make_context
    from lopd_ray.teacher.worker import TeacherWorker

    cfg = load_config(OPSD, [*RULES, "eval.teacher=true", "eval.every_steps=1"])
    model_dir = resolve_model_path(cfg.model.path)
    teacher, gate = TeacherWorker(cfg, model_dir), Scorer(cfg, model_dir, None)
    new_env, held = make_env(cfg.held_out_env)
    means = {}
    for name in ("oracle", "empty_oracle"):
        cfg.context.name = name
        probes = held_out_probes(held, 8)
        make_context(cfg, held).attach(probes, 0)
        rewards = teacher.play_held_out(probes)
        with torch.no_grad():
            assert rewards == [gate.play(held[t.task_index], Probe(t.teacher_context), new_env).reward for t in probes]
        means[name] = sum(rewards) / len(rewards)
    assert means["oracle"] >= 0.875 and means["empty_oracle"] <= 0.25, means


@pytest.mark.parametrize("overrides, expected", [
    (["eval.every_steps=0"], "eval.teacher=true scores the teacher at each held-out evaluation, which "
                             "eval.every_steps=0 turns off"),
    (["eval.every_steps=1", "teacher.zero_stage=3"], "teacher.zero_stage=3 cannot take: set teacher.zero_stage=0"),
])
def test_eval_teacher_is_refused_without_evaluations_or_with_a_sharded_teacher(overrides, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        load_config(OPSD, ["eval.teacher=true", *overrides])
    load_config(OPSD, ["eval.teacher=false", *overrides])


def test_eval_teacher_is_refused_for_a_method_without_a_teacher():
    from lopd_ray.preflight import check_registries

    grpo = os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml")
    with pytest.raises(ConfigError, match="algorithm.name=grpo has no teacher: set eval.teacher=false"):
        check_registries(load_config(grpo, ["eval.teacher=true", "eval.every_steps=1"]))
    check_registries(load_config(OPSD, ["eval.teacher=true", "eval.every_steps=1"]))


SWITCH = 2  # the update from which the test's teacher sees its framing holding nothing


def oracle_then_empty():
    """OPSD's teacher with the task's own solution before update SWITCH (training steps 0 and 1, the evaluations
    after 0 and 1 updates), OPSD's framing holding nothing from then on (as EmptyOracleContext)."""
    from lopd_ray.teacher.contexts import ContextProvider
    from lopd_ray.teacher.framings import opsd

    class OracleThenEmpty(ContextProvider):
        needs_reference_solutions = True
        reads = ("context.oracle",)

        def context_for(self, t, step):
            return opsd(self.cfg, "", self.tasks.reference_solution(t.task_index) if step < SWITCH else "")
    return OracleThenEmpty


@pytest.mark.ray
def test_a_teacher_whose_context_is_emptied_falls_to_its_student_and_the_run_says_so_once(
        ray_cluster, tmp_path, monkeypatch, caplog):
    from lopd_ray.controller import Controller
    from lopd_ray.study.runner import eval_rows
    from lopd_ray.teacher.contexts import CONTEXTS

    monkeypatch.setitem(CONTEXTS, "oracle_then_empty", oracle_then_empty())  # this process's Controller only
    caplog.set_level(logging.INFO, logger="lopd_ray")
    # learner.lr: the student barely moves in 4 steps, so what changes is the teacher
    cfg = load_config(OPSD, [*RULES, "context.name=oracle_then_empty", "eval.teacher=true", "eval.every_steps=1",
                             "eval.tasks=16", "train.total_steps=4", "train.prompts_per_step=4",
                             "train.samples_per_prompt=2", "learner.lr=1e-6", "rollout.engine=hf",
                             "rollout.num_workers=1", "learner.num_learners=1", "sync.probe_prompts=0",
                             "run.checkpoint_every_steps=0", "run.export_student=false", "run.progress_bar=false",
                             "run.loggers=[]", f"run.output_dir={tmp_path}"])
    controller = Controller(cfg)
    try:
        controller.run()
    finally:
        controller.shutdown()
    rows = eval_rows(cfg.run_dir)
    assert [r["updates"] for r in rows] == [0, 1, 2, 3, 4]
    assert all(r["teacher_tasks"] == 16 for r in rows), rows
    for r in rows[:SWITCH]:
        assert r["teacher_reward_mean"] >= r["reward_mean"] + 0.5, rows
    for r in rows[SWITCH:]:
        assert r["teacher_reward_mean"] <= r["reward_mean"] + cfg.eval.teacher_margin, rows
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Teacher no better")]
    assert len(said) == 1 and f"at update {SWITCH}:" in said[0], said
