"""Context providers: what each method's teacher is shown (golden prompts on the tiny and SmolLM2 tokenizers), that
OPSD always shows the task's own solution and OP2SD never does, that SDPO never shows a sample its own rollout, and
that with an empty context the teacher's log-probs equal the student's at every response token, for every provider."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

from lopd_ray.config import load_config
from lopd_ray.data.trajectory import TeacherContext, Trajectory
from lopd_ray.envs import make_env
from lopd_ray.rollout.agent_loop import render_ids
from lopd_ray.teacher.contexts import CONTEXTS, make_context
from lopd_ray.teacher.injection import LATENT_SLOT, latent_context, place_context, teacher_prompt_ids

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = {name: os.path.join(REPO, "recipes", f"{name}_letters_cpu.yaml")
           for name in ("opsd", "op2sd", "sdpo", "h2sd")}
SOLUTION = re.compile(r"=== Reference Solution Begin ===\n(.*?)\n=== Reference Solution End ===", re.DOTALL)


@pytest.fixture
def tokenizer(chat_tokenizer):
    return chat_tokenizer


def rollout(tasks, task_index: int, group_id: int, text: str, reward: float, uid: int) -> Trajectory:
    """A trajectory as the rollout worker returns it (token ids do not matter to the providers)."""
    t = Trajectory(tasks[task_index].task_id, group_id, [1], [2, 3], [1, 1], [(0, 2)], [0.0, 0.0], 0, reward=reward,
                   task_index=task_index, task_text=tasks[task_index].user_text, action_texts=[text])
    t.uid = uid
    return t


def provider_for(method: str, *overrides: str):
    cfg = load_config(RECIPES[method], list(overrides))
    _, tasks = make_env(cfg.env)
    return make_context(cfg, tasks), tasks


def test_opsd_always_shows_the_tasks_own_solution(tokenizer):
    provider, tasks = provider_for("opsd")
    trajs = [rollout(tasks, i, i, "x", 0.0, i) for i in range(40)]
    assert provider.attach(trajs, step=0) == {"context/missing": 0.0}
    for t in trajs:
        own = tasks.reference_solution(t.task_index)
        assert SOLUTION.findall(t.teacher_context.text) == [own]
        ids, latent_slice = teacher_prompt_ids(tokenizer, tasks[t.task_index].messages, t.teacher_context, 0, 0)
        assert latent_slice.start == latent_slice.stop == len(ids)
        # Golden: the student's own chat template with the context after the task in the first user message.
        expected = tokenizer.apply_chat_template(
            [{"role": "user", "content": t.task_text + t.teacher_context.text}], add_generation_prompt=True,
            tokenize=False)
        assert tokenizer.decode(ids) == expected
        assert expected.index(t.task_text) < expected.index(own) < expected.rindex("assistant")


def test_op2sd_never_shows_the_tasks_own_problem_or_solution():
    provider, tasks = provider_for("op2sd")
    trajs = [rollout(tasks, i % 64, i, "x", 0.0, i) for i in range(256)]
    provider.attach(trajs, step=3)
    shown = set()
    for t in trajs:
        text = t.teacher_context.text
        assert SOLUTION.findall(text) != [tasks.reference_solution(t.task_index)]
        assert t.task_text not in text
        shown.add(SOLUTION.findall(text)[0])
    assert len(shown) > 4  # drawn, not one fixed example
    again = [rollout(tasks, i % 64, i, "x", 0.0, i) for i in range(256)]
    provider.attach(again, step=3)  # the same step draws the same examples (a resumed run sees the same contexts)
    assert [t.teacher_context for t in again] == [t.teacher_context for t in trajs]


def test_sdpo_shows_a_successful_sibling_never_the_sample_itself():
    provider, tasks = provider_for("sdpo")
    group = [rollout(tasks, 0, 0, f"<think>plan {k}</think>answer-{k}", reward, k)
             for k, reward in enumerate([1.0, 0.0, 0.7, 0.2])]
    failed_group = [rollout(tasks, 1, 1, f"wrong-{k}", 0.0, 4 + k) for k in range(3)]
    stats = provider.attach(group + failed_group, step=0)
    assert stats == {"context/missing": 3.0}  # nobody in the second group succeeded and letters gives no feedback
    for t in group:
        text = t.teacher_context.text
        own = t.action_texts[0].split("</think>")[1]
        assert own not in text and "<think>" not in text and "plan" not in text
        shown = [s for s in group if s.action_texts[0].split("</think>")[1] in text]
        assert len(shown) == 1 and shown[0] is not t and shown[0].reward >= 0.5
        assert text.endswith("Correctly solve the original question.\n")
    assert all(t.teacher_context is None for t in failed_group)


def test_sdpo_falls_back_to_the_feedback_on_a_failed_attempt():
    provider, tasks = provider_for("sdpo")
    t = rollout(tasks, 0, 0, "print(1)", 0.0, 0)
    t.observation_texts = ["AssertionError: expected 2"]
    provider.attach([t], step=0)
    assert "AssertionError: expected 2" in t.teacher_context.text


def test_h2sd_shows_a_success_its_own_response_and_a_failure_the_verified_solution():
    provider, tasks = provider_for("h2sd")
    success, failure = rollout(tasks, 0, 0, "<think>x</think>own-answer", 0.95, 0), rollout(tasks, 1, 0, "bad", 0.2, 1)
    provider.attach([success, failure], step=0)
    assert "own-answer" in success.teacher_context.text and "<think>" not in success.teacher_context.text
    assert tasks.reference_solution(0) not in success.teacher_context.text.replace("own-answer", "")
    assert tasks.reference_solution(1) in failure.teacher_context.text and "bad" not in failure.teacher_context.text


@pytest.mark.parametrize("placement", ["user_prefix", "user_suffix", "system"])
def test_an_empty_context_is_the_students_prompt_and_a_text_goes_where_it_says(tokenizer, placement):
    messages = [{"role": "user", "content": "Reply with the letter 'a' repeated 4 times."}]
    student = render_ids(tokenizer, messages, add_generation_prompt=True)
    assert teacher_prompt_ids(tokenizer, messages, TeacherContext("", placement), 0, 0)[0] == student
    placed = place_context(messages, TeacherContext("<CTX>", placement))
    assert messages[0]["content"] == "Reply with the letter 'a' repeated 4 times."  # the task is not modified
    where = {"user_prefix": (-1, "<CTX>Reply"), "user_suffix": (-1, "times.<CTX>"), "system": (0, "<CTX>")}[placement]
    assert where[1] in placed[where[0]]["content"]


@pytest.fixture(scope="module")
def student(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


EMPTY_FRAMING = {
    "none": [],
    "oracle": ["context.oracle.framing=''"],
    "other_problem": ["context.other_problem.framing=''"],
    "sibling": ["context.sibling.solution_framing=''", "context.sibling.closing=''"],
    "hint": ["context.hint.success_framing=''", "context.hint.failure_framing=''"],
    "latent": ["composer.framing_before=''", "composer.framing_after=''"],
}


def test_every_provider_has_an_empty_context_case():
    assert set(EMPTY_FRAMING) == set(CONTEXTS)


@pytest.mark.parametrize("name", sorted(EMPTY_FRAMING))
def test_with_an_empty_context_the_teacher_scores_like_the_student(name, tiny_model_dir, student):
    from lopd_ray.learner.logprobs import token_logprobs
    from lopd_ray.teacher.latent_worker import LatentTeacherWorker
    from lopd_ray.teacher.worker import TeacherWorker

    algorithm = ["algorithm.name=lopd"] if name == "latent" else []
    cfg = load_config(RECIPES["opsd"], [f"context.name={name}", *algorithm, *EMPTY_FRAMING[name]])
    teacher = (LatentTeacherWorker if CONTEXTS[name].uses_latents else TeacherWorker)(cfg, tiny_model_dir)
    tok, tasks = teacher.tokenizer, teacher.tasks
    trajs = []
    for k, text in enumerate(["aaaa", "bbb b", "a"]):
        response = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        t = Trajectory(tasks[k].task_id, 0, render_ids(tok, tasks[k].messages, add_generation_prompt=True), response,
                       [1] * len(response), [(0, len(response))], [0.0] * len(response), 0, reward=1.0,
                       task_index=k, task_text=tasks[k].user_text, action_texts=[text], uid=k)
        trajs.append(t)
    if CONTEXTS[name].uses_latents:  # nothing retrieved: the latent block is empty
        for t in trajs:
            t.teacher_context, t.retrieved_ids, t.retrieved_texts = latent_context(cfg.composer), [], []
        assert LATENT_SLOT in trajs[0].teacher_context.text
    else:
        make_context(cfg, tasks).attach(trajs, step=0)
    scores = teacher.score(trajs)
    assert not any(p.requires_grad for p in teacher._backbone_parameters().values())  # no gradient into the teacher
    assert not teacher.backbone.training or CONTEXTS[name].uses_latents  # no dropout in its targets
    for t, (top_ids, top_logp, sampled) in zip(trajs, scores, strict=True):
        assert t.teacher_context is not None and t.teacher_context.text.replace(LATENT_SLOT, "") == ""
        ids = torch.from_numpy(t.token_ids)[None]
        with torch.no_grad():
            expected = token_logprobs(student, ids, torch.ones_like(ids), 5)[0, len(t.prompt_ids) - 1:]
        assert sampled.shape == (len(t.response_ids),) and top_ids.shape == top_logp.shape == (len(t.response_ids), 20)
        np.testing.assert_allclose(sampled, expected.numpy(), atol=1e-5, rtol=0)
        assert np.all(np.diff(top_logp, axis=1) <= 1e-6)  # the teacher's top-M, most likely first


def test_a_teacher_of_another_vocabulary_is_refused_before_any_work(tokenizer):
    from lopd_ray.errors import ConfigError
    from lopd_ray.models.tiny_tokenizer import ASSET_DIR
    from lopd_ray.preflight import check_same_vocabulary
    from transformers import AutoTokenizer

    tiny = AutoTokenizer.from_pretrained(ASSET_DIR)
    if len(tokenizer) == len(tiny):
        check_same_vocabulary(tiny, tokenizer, "same")
        return
    with pytest.raises(ConfigError, match=r"teacher.model_path='smollm2' has a different vocabulary .* tokens differ"):
        check_same_vocabulary(tiny, tokenizer, "smollm2")


def test_without_its_context_the_self_teacher_is_the_student_and_with_it_is_not(tiny_model_dir, student):
    from lopd_ray.learner.logprobs import token_logprobs
    from lopd_ray.teacher.worker import TeacherWorker

    cfg = load_config(RECIPES["opsd"])
    teacher = TeacherWorker(cfg, tiny_model_dir)
    tok, tasks = teacher.tokenizer, teacher.tasks
    response = tok("aaaa", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    t = Trajectory(tasks[0].task_id, 0, render_ids(tok, tasks[0].messages, add_generation_prompt=True), response,
                   [1] * len(response), [(0, len(response))], [0.0] * len(response), 0, task_index=0)
    make_context(cfg, tasks).attach([t], step=0)
    plain, = teacher.score_without_context([t])
    ids = torch.from_numpy(t.token_ids)[None]
    with torch.no_grad():
        expected = token_logprobs(student, ids, torch.ones_like(ids), 5)[0, len(t.prompt_ids) - 1:].numpy()
    np.testing.assert_allclose(plain, expected, atol=1e-5, rtol=0)
    assert np.abs(teacher.score([t])[0][2] - expected).max() > 1e-3  # the solution in the prompt changes the scores
