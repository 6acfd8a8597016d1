"""A divergence on the full vocabulary: the teacher ships its last hidden states, the learner rebuilds the teacher's
distribution chunk by chunk with the frozen teacher's head; the loss equals the full-vocabulary JSD by hand."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from lopd_ray.config import load_config
from lopd_ray.data.batching import plan_learner_batches
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.rollout.agent_loop import render_ids
from lopd_ray.teacher.contexts import make_context
from lopd_ray.utils.distributed import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DISTILL_T = 1.5


def test_the_full_vocabulary_jsd_equals_the_hand_value_and_moves_the_student(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from lopd_ray.learner.policy_learner import PolicyLearner
    from lopd_ray.teacher.worker import TeacherWorker

    cfg = load_config(os.path.join(REPO, "recipes", "opsd_letters_cpu.yaml"),
                      [f"model.path={tiny_model_dir}", "algorithm.distill.support=full_vocab",
                       "algorithm.distill.diagnose_context=false", f"algorithm.distill_temperature={DISTILL_T}",
                       "learner.num_learners=1", "learner.zero_stage=0", "learner.logprob_chunk_tokens=3"])
    teacher = TeacherWorker(cfg, tiny_model_dir)
    tok, tasks = teacher.tokenizer, teacher.tasks
    trajs = []
    for k, text in enumerate(["aaaa", "bb b"]):
        response = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        trajs.append(Trajectory(tasks[k].task_id, k, render_ids(tok, tasks[k].messages, add_generation_prompt=True),
                                response, [1] * len(response), [(0, len(response))], [0.0] * len(response), 0,
                                reward=1.0, task_index=k, task_text=tasks[k].user_text, uid=k))
    trajs[1].loss_mask[1] = 0  # a tool-output token: no loss there
    make_context(cfg, tasks).attach(trajs, step=0)
    for t, (ids, logp, sampled, hidden) in zip(trajs, teacher.score(trajs, with_hidden=True)):
        t.teacher_topm_ids, t.teacher_topm_logprobs, t.teacher_logprobs, t.teacher_hidden = ids, logp, sampled, hidden
        assert hidden.shape == (len(t.response_ids), teacher.backbone.config.hidden_size)

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    beta, expected, tokens = cfg.algorithm.distill.jsd_beta, 0.0, 0
    with torch.no_grad():
        for t in trajs:
            student = torch.log_softmax(model(input_ids=torch.from_numpy(t.token_ids)[None]).logits[
                0, len(t.prompt_ids) - 1:-1].double() / DISTILL_T, -1)
            rows, head = teacher._hidden_rows([t], teacher._latents([t]))
            teach = torch.log_softmax(head(rows[0]).double() / DISTILL_T, -1)
            mix = torch.logsumexp(torch.stack([teach + np.log(beta), student + np.log(1 - beta)]), 0)
            jsd = (beta * (teach.exp() * (teach - mix)).sum(-1) + (1 - beta) * (student.exp() * (student - mix)).sum(-1))
            expected += float((jsd * torch.from_numpy(t.loss_mask)).sum())
            tokens += t.num_action_tokens
    learner = PolicyLearner(cfg, tiny_model_dir, 0, 1, "127.0.0.1", free_port())
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    plans, norms = plan_learner_batches(trajs, 1, 1, cfg.learner.max_tokens_per_micro_batch)
    metrics, _ = learner.train_step(plans[0], norms)
    assert expected / tokens > 1e-5  # the solution in its prompt moves the teacher
    assert metrics["distill/student_kl"] == pytest.approx(expected / tokens, rel=1e-4)
    assert any(not torch.equal(p, before[n]) for n, p in learner.model.named_parameters())
    # the head the learner rebuilds the teacher with is frozen: the step did not move it
    assert not any(p.requires_grad for p in learner.teacher_head.parameters())
    torch.testing.assert_close(learner.teacher_head.weight, model.get_output_embeddings().weight)
