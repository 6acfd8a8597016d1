"""The TeacherWorker in-process: alignment of its scores with the student's, adapter isolation, the composer step
and dual ascent on beta."""
from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch

from lopd_ray.config import load_config
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.modeling.logprobs import hidden_logprobs, token_logprobs
from lopd_ray.rollout.agent_loop import render_ids
from lopd_ray.teacher.injection import latent_context

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRIES = ["Task to solve:\nReply with the letter 'a' repeated 4 times.\n\nReference past trajectory:\nAction: aaaa",
           "Task to solve:\nReply with the letter 'b' repeated 6 times.\n\nReference past trajectory:\nAction: bbbbbb"]


@pytest.fixture(scope="module")
def teacher(tiny_model_dir):
    from lopd_ray.teacher.latent_worker import LatentTeacherWorker

    cfg = load_config(os.path.join(REPO, "recipes", "lopd_letters_cpu.yaml"),
                      ["composer.framing_before=''", "composer.framing_after=''", "composer.lr=1e-2"])
    return LatentTeacherWorker(cfg, tiny_model_dir)


def trajectory(teacher, task_index: int, response_text: str, reward: float, retrieved: list[str]) -> Trajectory:
    tok = teacher.tokenizer
    prompt = render_ids(tok, teacher.tasks[task_index].messages, add_generation_prompt=True)
    response = tok(response_text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    t = Trajectory(teacher.tasks[task_index].task_id, 0, prompt, response, [1] * len(response),
                   [(0, len(response))], [0.0] * len(response), 0, reward=reward, task_index=task_index,
                   retrieved_texts=retrieved, teacher_context=latent_context(teacher.comp_cfg))
    t.retrieved_ids = [f"entry{i}" for i in range(len(retrieved))]
    return t


def teacher_sampled_logprobs(teacher, t: Trajectory, latents: torch.Tensor) -> torch.Tensor:
    rows, head = teacher._hidden_rows([t], [latents])
    return hidden_logprobs(head, rows[0][None], torch.from_numpy(t.response_ids)[None, :, None], 8)[0, :, 0]


def test_empty_context_scores_equal_student_logprobs(teacher, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    student = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    t = trajectory(teacher, 5, "aaaa bbb ccc", 1.0, [])
    with torch.no_grad():
        teacher_lp = teacher_sampled_logprobs(teacher, t, torch.zeros(0, student.config.hidden_size))
        ids = torch.from_numpy(t.token_ids)[None]
        student_lp = token_logprobs(student, ids, torch.ones_like(ids), 5)[0, len(t.prompt_ids) - 1:]
    assert teacher_lp.shape == student_lp.shape == (len(t.response_ids),)
    torch.testing.assert_close(teacher_lp, student_lp, atol=1e-5, rtol=0)


def test_scores_cover_every_response_token_and_latents_matter(teacher):
    t = trajectory(teacher, 5, "aaaa bbb", 1.0, ENTRIES)
    ids, logp, sampled = teacher.score([t])[0]
    assert len(ids) == len(logp) == len(sampled) == len(t.response_ids)
    assert all(len(row) == teacher.cfg.teacher.top_m for row in ids)
    assert all(a >= b for row in logp for a, b in zip(row, row[1:]))  # top-M sorted, most likely first
    bare = trajectory(teacher, 5, "aaaa bbb", 1.0, [])
    with torch.no_grad():
        no_latents = torch.zeros(0, teacher.composer.resampler.linear_out.out_features)
        without = teacher_sampled_logprobs(teacher, bare, no_latents)
    assert not torch.allclose(torch.from_numpy(sampled), without, atol=1e-4)


def test_multi_turn_trajectory_is_scored_at_every_token_and_matches_the_student(teacher, tiny_model_dir):
    """Action, tool observation, action: with an empty context the teacher's log-prob of every response token (the
    observation's included, which the loss mask then leaves out) is the student's; with latents every token still
    gets a score."""
    from transformers import AutoModelForCausalLM

    from lopd_ray.rollout.agent_loop import observation_ids

    tok, task = teacher.tokenizer, teacher.tasks[3]
    first = tok('<tool_call>{"name": "count", "arguments": {}}</tool_call>', add_special_tokens=False)["input_ids"]
    first = first + [tok.eos_token_id]
    messages = task.messages + [{"role": "assistant", "content": tok.decode(first, skip_special_tokens=False)}]
    obs = observation_ids(tok, messages, [{"role": "user", "content": "<tool_response>3</tool_response>"}], first)
    second = tok("aaa", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    prompt = render_ids(tok, task.messages, add_generation_prompt=True)
    response, mask = first + obs + second, [1] * len(first) + [0] * len(obs) + [1] * len(second)
    spans = [(0, len(first)), (len(first) + len(obs), len(response))]
    bare = Trajectory(task.task_id, 0, prompt, response, mask, spans, [0.0] * len(response), 0, reward=1.0,
                      task_index=3, retrieved_texts=[], teacher_context=latent_context(teacher.comp_cfg))
    student = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        teacher_lp = teacher_sampled_logprobs(teacher, bare, torch.zeros(0, student.config.hidden_size))
        ids = torch.tensor([prompt + response])
        student_lp = token_logprobs(student, ids, torch.ones_like(ids), 5)[0, len(prompt) - 1:]
    torch.testing.assert_close(teacher_lp, student_lp, atol=1e-5, rtol=0)
    with_context = trajectory(teacher, 3, "", 1.0, ENTRIES)
    with_context.response_ids, with_context.loss_mask = np.asarray(response), np.asarray(mask)
    ids_M, logp_M, sampled = teacher.score([with_context])[0]
    assert len(ids_M) == len(logp_M) == len(sampled) == len(response)


def test_batched_scores_equal_one_trajectory_at_a_time(teacher):
    """Scoring pads a micro-batch to its longest teacher sequence: the padding must not change any score."""
    trajs = [trajectory(teacher, i, text, 1.0, ENTRIES[:j])
             for i, (text, j) in enumerate([("aaaa", 2), ("b", 1), ("aaaa bbbb cccc dddd", 2), ("ab", 2)])]
    batched = teacher.score(trajs)
    assert len(teacher._micro_batches(trajs)) == 1
    for t, (ids, logp, sampled) in zip(trajs, batched):
        alone_ids, alone_logp, alone_sampled = teacher.score([t])[0]
        np.testing.assert_array_equal(ids, alone_ids)
        np.testing.assert_allclose(logp, alone_logp, atol=1e-5, rtol=0)
        np.testing.assert_allclose(sampled, alone_sampled, atol=1e-5, rtol=0)


def test_samples_that_retrieved_the_same_entries_share_one_encoding(teacher):
    trajs = [trajectory(teacher, i, "aaaa", 1.0, entries) for i, entries in
             enumerate([ENTRIES, ENTRIES[:1], ENTRIES, ENTRIES[:1]])]
    shared = teacher._latents(trajs)
    assert shared[0] is shared[2] and shared[1] is shared[3] and shared[0] is not shared[1]
    with torch.no_grad():
        for t, latents in zip(trajs, shared):
            alone = teacher.composer.latents([teacher._entry_ids(t)])[0]
            torch.testing.assert_close(latents.detach(), alone, atol=1e-5, rtol=0)


def test_encoder_lora_is_inactive_in_the_teacher_forward(teacher):
    t = trajectory(teacher, 2, "bbbb", 1.0, ENTRIES)
    latents = torch.randn(2 * teacher.comp_cfg.num_queries, teacher.composer.resampler.linear_out.out_features)
    with torch.no_grad():
        before = teacher_sampled_logprobs(teacher, t, latents)
        saved = {k: v.clone() for k, v in teacher.composer.phi_state_dict().items()}
        for name, param in teacher.composer.named_phi_parameters():
            if "lora" in name:
                param.add_(0.5)
        after = teacher_sampled_logprobs(teacher, t, latents)
        teacher.composer.load_phi_state_dict(saved)
    assert torch.equal(before, after)


def test_composer_step_changes_only_phi_and_its_margin_term_pushes_the_signed_advantage_up(teacher):
    backbone = {n: p.detach().clone() for n, p in teacher.composer.named_parameters() if not p.requires_grad}
    phi = teacher._phi_copy()
    good = trajectory(teacher, 5, "aaaa", 1.0, ENTRIES)
    bad = trajectory(teacher, 6, "zzzz", 0.0, ENTRIES)
    for t, (ids, logp, sampled) in zip((good, bad), teacher.score([good, bad])):
        t.teacher_topm_ids, t.teacher_topm_logprobs = ids, logp
        t.student_logprobs, t.student_topm_logprobs = sampled, logp  # a student equal to the teacher before the step
    try:
        first = teacher.update_composer([good, bad], 0.0, 0.05)
        assert first["lopd/delta"] == pytest.approx(0.0, abs=1e-5)  # the teacher is the student: no advantage yet
        after = {n: p.detach() for n, p in teacher.composer.named_parameters() if not p.requires_grad}
        assert all(torch.equal(backbone[n], after[n]) for n in backbone)
        changed = [k for k, v in teacher.composer.phi_state_dict().items() if not torch.equal(v, phi[k])]
        assert any("lora" in k for k in changed) and any("resampler" in k for k in changed)
        # with a large beta the margin term dominates: phi moves toward a teacher that likes the success's tokens
        # and dislikes the failure's, so the outcome-signed advantage measured at the next step is positive
        for _ in range(3):
            teacher.update_composer([good, bad], 50.0, 0.05)
        assert teacher.update_composer([good, bad], 0.0, 0.05)["lopd/delta"] > 0.01
    finally:
        teacher.composer.load_phi_state_dict(phi)


def test_the_composer_step_reuses_the_scoring_pass_and_takes_the_step_a_new_pass_takes(teacher):
    trajs = [trajectory(teacher, 5, "aaaa", 1.0, ENTRIES), trajectory(teacher, 6, "zzzz", 0.0, ENTRIES[:1]),
             trajectory(teacher, 7, "aaa bbb", 1.0, ENTRIES)]
    for uid, t in enumerate(trajs):
        t.uid = uid
    optimizer = getattr(teacher.engine.optimizer, "optimizer", teacher.engine.optimizer)
    start = (teacher._phi_copy(), copy.deepcopy(optimizer.state_dict()))
    forward_passes, gradients = [], []
    padded_hidden, optimizer_step = teacher._padded_hidden, teacher.engine.step

    def counted(*args):
        forward_passes.append(1)
        return padded_hidden(*args)

    def recorded():
        gradients.append({n: p.grad.clone() for n, p in teacher.composer.named_phi_parameters()})
        optimizer_step()

    def step(reuse: bool) -> tuple[dict, int]:
        teacher.composer.load_phi_state_dict(start[0])
        optimizer.load_state_dict(start[1])
        teacher.reuses_scoring_pass = reuse
        light, blob = teacher.teacher_scores(trajs)
        for t in trajs:
            t.teacher_topm_ids, t.teacher_topm_logprobs = (blob[t.uid]["teacher_topm_ids"],
                                                           blob[t.uid]["teacher_topm_logprobs"])
            t.student_logprobs = light[t.uid]["teacher_logprobs"] - 0.3  # a student below the teacher everywhere
            t.student_topm_logprobs = t.teacher_topm_logprobs - 0.1
        forward_passes.clear()
        metrics = teacher.update_composer(trajs, 0.3, 0.05)
        return metrics, len(forward_passes)

    teacher._padded_hidden, teacher.engine.step = counted, recorded
    try:
        reused_metrics, reused_passes = step(reuse=True)
        fresh_metrics, fresh_passes = step(reuse=False)
    finally:
        del teacher._padded_hidden, teacher.engine.step
        teacher.reuses_scoring_pass = True
    assert (reused_passes, fresh_passes) == (0, 1) and teacher.scoring_passes == []
    assert reused_metrics == pytest.approx(fresh_metrics, abs=1e-6)
    reused, fresh = gradients
    assert any(float(g.abs().max()) > 0 for g in fresh.values())
    for name in fresh:
        torch.testing.assert_close(reused[name], fresh[name], atol=1e-7, rtol=1e-4)


def test_cold_start_lowers_the_nll_of_reference_answers_and_sets_phi0(teacher):
    examples = [{"task_index": i, "answer": teacher.tasks.reference_solution(i), "retrieved_texts": ENTRIES}
                for i in range(8)]
    teacher.comp_cfg.cold_start_batch_size = 8  # the whole set each step: the loss must go down
    stats = teacher.cold_start(examples, steps=10)
    assert stats["cold_start/nll_last"] < stats["cold_start/nll_first"] - 1e-3
    assert all(torch.equal(teacher.phi0[k], v) for k, v in teacher.composer.phi_state_dict().items())
    assert not teacher.anchor_latents
