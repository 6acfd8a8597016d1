"""What the composer reads and how it is stored (composer.input, composer.dtype), in the official code's form: the
current task, then the retrieved entry rendered with the chat template; anchors per (task, entry); a bf16
resampler that a small AdamW step mostly cannot move."""
from __future__ import annotations

import math
import os

import pytest
import torch

from lopd_ray.bank.traces import BankEntry, ComposerInputs
from lopd_ray.config import ComposerConfig, load_config
from lopd_ray.data.trajectory import Trajectory
from lopd_ray.teacher.injection import latent_context

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = ["env.name=rules", "model.path=builtin:tiny-qwen3-rules"]
ENTRY = BankEntry("rules/train/3@reference", "rules/train/3", "Apply the zorp rule to: a b c", "Action: #6 a b c",
                  1.0, -1)
TASK, OTHER_TASK = "Apply the zorp rule to: d e f", "Apply the zorp rule to: f a b"


def test_the_current_task_comes_first_then_the_entry_in_the_chat_template():
    text, = ComposerInputs(ComposerConfig(input="current_task"), "builtin:tiny-qwen3-rules").texts(TASK, [ENTRY])
    assert text == ("Task to solve:\nApply the zorp rule to: d e f\n\nReference past trajectory:\n"
                    "<|im_start|>user\nApply the zorp rule to: a b c<|im_end|>\n"
                    "<|im_start|>assistant\nAction: #6 a b c<|im_end|>\n")


def test_entry_task_reads_the_entrys_own_task_and_trace_whatever_the_task():
    inputs = ComposerInputs(ComposerConfig(input="entry_task"), "builtin:tiny-qwen3-rules")
    expected = "Task to solve:\nApply the zorp rule to: a b c\n\nReference past trajectory:\nAction: #6 a b c"
    assert inputs.texts(TASK, [ENTRY]) == inputs.texts(OTHER_TASK, [ENTRY]) == [expected]


def _worker(overrides: list[str]):
    from lopd_ray.models import resolve_model_path
    from lopd_ray.teacher.latent_worker import LatentTeacherWorker

    cfg = load_config(os.path.join(REPO, "recipes", "lopd_letters_cpu.yaml"), [*RULES, *overrides])
    return LatentTeacherWorker(cfg, resolve_model_path(cfg.model.path)), cfg


def _retrieving(cfg, task_text: str, uid: int) -> Trajectory:
    t = Trajectory("rules/train/0", uid, [0], [0], [1], [(0, 1)], [0.0], 0, task_text=task_text,
                   teacher_context=latent_context(cfg.composer), uid=uid)
    t.retrieved_ids = [ENTRY.entry_id]
    t.retrieved_texts = ComposerInputs(cfg.composer, cfg.model.path).texts(task_text, [ENTRY])
    return t


@pytest.mark.parametrize("mode, anchors", [("current_task", 2), ("entry_task", 1)])
def test_two_tasks_retrieving_one_entry_have_their_own_anchor_only_with_the_current_task(mode, anchors):
    worker, cfg = _worker([f"composer.input={mode}"])
    worker._anchors([_retrieving(cfg, TASK, 0), _retrieving(cfg, OTHER_TASK, 1)])
    assert len(worker.anchor_latents) == anchors
    if anchors == 2:
        first, second = worker.anchor_latents.values()
        assert first.shape == second.shape == (cfg.composer.num_queries, worker.composer.hidden_size)
        assert not torch.allclose(first, second, atol=1e-4)


def _one_step_moves(worker) -> dict[str, float]:
    """One AdamW step of the worker's composer engine (its lr, a fixed gradient direction) on the resampler: the
    share of each kind of weight that changed."""
    before = {n: p.detach().clone() for n, p in worker.composer.resampler.named_parameters()}
    latents = worker.composer.encode([[5, 6, 7, 8]])
    worker.engine.set_gradient_accumulation_boundary(True)
    worker.engine.backward((latents.float() * torch.linspace(-1, 1, latents.shape[-1])).sum())
    worker.engine.step()
    after = dict(worker.composer.resampler.named_parameters())
    return {n: float((after[n].detach() != before[n]).float().mean()) for n in before}


def test_bf16_stores_the_resampler_in_bf16_and_a_small_step_leaves_most_of_it_where_it_was():
    worker, _ = _worker(["composer.dtype=bf16", "composer.lr=1e-5"])
    named = dict(worker.composer.named_phi_parameters())
    assert {p.dtype for n, p in named.items() if n.startswith("resampler.")} == {torch.bfloat16}
    assert {p.dtype for n, p in named.items() if n.startswith("lora.")} == {torch.float32}
    assert worker.composer.encode([[5, 6, 7]]).dtype == torch.bfloat16
    bf16 = _one_step_moves(worker)
    fp32 = _one_step_moves(_worker(["composer.dtype=fp32", "composer.lr=1e-5"])[0])
    assert bf16["norm_out.weight"] == 0.0 and fp32["norm_out.weight"] > 0.9  # gains of 1: a 1e-5 step rounds away
    assert bf16["attn.to_q.weight"] < 0.6 < fp32["attn.to_q.weight"]


def test_a_non_finite_phi_gradient_norm_skips_the_step_and_is_counted():
    worker, _ = _worker([])
    before = {n: p.detach().clone() for n, p in worker.composer.named_phi_parameters()}

    def step(poison: bool) -> float:
        hook = worker.composer.resampler.queries_Kd.register_hook(lambda g: g * float("nan")) if poison else None
        worker.engine.set_gradient_accumulation_boundary(True)
        worker.engine.backward(worker.composer.encode([[5, 6, 7, 8]]).float().sum())
        if hook is not None:
            hook.remove()
        return worker._step_if_finite()

    assert math.isnan(step(poison=True)) and worker.skipped_phi_steps == 1
    assert all(torch.equal(p, before[n]) for n, p in worker.composer.named_phi_parameters())
    assert math.isfinite(step(poison=False)) and worker.skipped_phi_steps == 1
    assert not torch.equal(worker.composer.resampler.queries_Kd, before["resampler.queries_Kd"])


class _OneBank:
    """The bank group as a context provider calls it, over one in-process bank."""

    def __init__(self, bank):
        self.bank = bank

    def first(self, method: str, *args):
        return getattr(self.bank, method)(*args)


def test_the_latent_context_composes_each_retrieved_entry_for_the_sample_s_own_task():
    from lopd_ray.bank.bank import ExperienceBank
    from lopd_ray.envs import make_env
    from lopd_ray.teacher.contexts import make_context

    cfg = load_config(os.path.join(REPO, "recipes", "lopd_rules.yaml"), RULES)
    bank = ExperienceBank(cfg.bank)
    bank.add([ENTRY])
    _, tasks = make_env(cfg.env)
    trajs = [Trajectory(f"rules/train/{100 + uid}", uid, [0], [0], [1], [(0, 1)], [0.0], 0, task_text=text, uid=uid)
             for uid, text in enumerate([TASK, OTHER_TASK])]
    make_context(cfg, tasks, _OneBank(bank)).attach(trajs, step=0)
    assert [t.retrieved_ids for t in trajs] == [[ENTRY.entry_id], [ENTRY.entry_id]]
    assert [t.retrieved_texts[0].split("\n")[1] for t in trajs] == [TASK, OTHER_TASK]
    assert all("<|im_start|>user\nApply the zorp rule to: a b c" in t.retrieved_texts[0] for t in trajs)
