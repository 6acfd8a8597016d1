"""Student and teacher log-probs of a distillation step are taken at the same temperature,
`algorithm.distill_temperature`, whatever temperature the rollout sampled at."""
from __future__ import annotations

import os

import pytest
import torch

from lopd_ray.config import load_config
from lopd_ray.data.batching import plan_learner_batches
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.rollout.agent_loop import render_ids
from lopd_ray.teacher.injection import latent_context
from lopd_ray.utils.distributed import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRIES = ["Task to solve:\nReply with the letter 'a' repeated 4 times.\n\nReference past trajectory:\nAction: aaaa"]
ROLLOUT_T, DISTILL_T = 0.7, 2.0


@pytest.fixture(scope="module")
def cfg(tiny_model_dir):
    return load_config(os.path.join(REPO, "recipes", "lopd_letters_cpu.yaml"),
                       [f"model.path={tiny_model_dir}", f"rollout.temperature={ROLLOUT_T}",
                        f"algorithm.distill_temperature={DISTILL_T}", "learner.num_learners=1",
                        "learner.zero_stage=0", "teacher.top_m=5"])


@pytest.fixture(scope="module")
def teacher(cfg, tiny_model_dir):
    from lopd_ray.teacher.latent_worker import LatentTeacherWorker

    return LatentTeacherWorker(cfg, tiny_model_dir)


def trajectory(cfg, teacher, task_index: int, text: str) -> Trajectory:
    """The student's answer `text` to a task, with one retrieved entry for the teacher's latents."""
    tok = teacher.tokenizer
    prompt = render_ids(tok, teacher.tasks[task_index].messages, add_generation_prompt=True)
    response = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return Trajectory(teacher.tasks[task_index].task_id, 0, prompt, response, [1] * len(response),
                      [(0, len(response))], [0.0] * len(response), 0, reward=1.0, task_index=task_index,
                      retrieved_ids=["e0"], retrieved_texts=ENTRIES, teacher_context=latent_context(cfg.composer),
                      uid=0)


def student_logits(tiny_model_dir, t: Trajectory) -> torch.Tensor:
    """The student's logits at the positions that score each response token, by plain HF."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(t.token_ids)[None]).logits[0, len(t.prompt_ids) - 1:-1].float()


def test_teacher_and_student_score_at_the_distill_temperature(cfg, teacher, tiny_model_dir):
    from lopd_ray.learner.policy_learner import PolicyLearner

    t = trajectory(cfg, teacher, 2, "aaaa bb")

    ids, logp, sampled = teacher.score([t])[0]
    with torch.no_grad():
        rows, head = teacher._hidden_rows([t], teacher._latents([t]))
        by_hand = torch.log_softmax(head(rows[0]).float() / DISTILL_T, -1)
    top = by_hand.topk(5)
    assert torch.equal(torch.from_numpy(ids), top.indices)
    torch.testing.assert_close(torch.from_numpy(logp), top.values, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.from_numpy(sampled), by_hand.gather(-1, torch.from_numpy(t.response_ids)[:, None])
                               [:, 0], atol=1e-5, rtol=0)

    t.teacher_topm_ids, t.teacher_topm_logprobs, t.teacher_logprobs = ids, logp, sampled
    learner = PolicyLearner(cfg, tiny_model_dir, 0, 1, "127.0.0.1", free_port())
    plans, norms = plan_learner_batches([t], 1, 1, cfg.learner.max_tokens_per_micro_batch)
    _, student = learner.train_step(plans[0], norms)  # the pre-update log-probs come back
    student_sampled, student_topm = student[0]["student_logprobs"], student[0]["student_topm_logprobs"]
    logits = student_logits(tiny_model_dir, t)
    for temperature, close in ((DISTILL_T, True), (ROLLOUT_T, False)):
        expected = torch.log_softmax(logits / temperature, -1)
        matches = torch.allclose(torch.from_numpy(student_topm), expected.gather(-1, top.indices), atol=1e-4)
        assert matches == close, f"student top-M at T={temperature}"
    expected_sampled = torch.log_softmax(logits / DISTILL_T, -1).gather(-1, torch.from_numpy(t.response_ids)[:, None])
    torch.testing.assert_close(torch.from_numpy(student_sampled), expected_sampled[:, 0], atol=1e-4, rtol=0)


def test_on_the_students_top_k_the_teacher_scores_the_students_support(cfg, teacher, tiny_model_dir):
    from lopd_ray.learner.policy_learner import PolicyLearner

    t = trajectory(cfg, teacher, 1, "bbb a")
    learner = PolicyLearner(cfg, tiny_model_dir, 0, 1, "127.0.0.1", free_port())
    plans, _ = plan_learner_batches([t], 1, 1, cfg.learner.max_tokens_per_micro_batch)
    (support,) = learner.student_topk(plans[0], 5)
    student_top = torch.log_softmax(student_logits(tiny_model_dir, t) / DISTILL_T, -1).topk(5)
    assert torch.equal(torch.from_numpy(support), student_top.indices)  # the student's top-5, at the distill T
    t.support_ids = support
    ids, logp, _ = teacher.score([t])[0]
    with torch.no_grad():
        rows, head = teacher._hidden_rows([t], teacher._latents([t]))
        by_hand = torch.log_softmax(head(rows[0]).float() / DISTILL_T, -1)
    assert torch.equal(torch.from_numpy(ids), student_top.indices)
    torch.testing.assert_close(torch.from_numpy(logp), by_hand.gather(-1, student_top.indices), atol=1e-5, rtol=0)
    assert not torch.equal(by_hand.topk(5).indices, student_top.indices)  # the teacher's own top-5 differs
