"""What a distillation run logs so that a user can tell why a method helps or hurts: the teacher's entropy and
probability of the sampled tokens, the sampled-token gap by token class, DOPD's privilege gap, the split of a text
context's supervision into what the context adds and what the teacher knows anyway, and how the student's update
lines up with each. Every function takes the batch's trajectories and returns `distill/*` metrics (none when the
batch does not carry what it needs)."""
from __future__ import annotations

import numpy as np
import torch

from lopd_ray.algorithms.distill_losses import with_tail


def topm_entropy(topm_logprobs: np.ndarray) -> np.ndarray:
    """Per response token, the entropy of a top-M + tail distribution ([R, M] log-probs -> [R]; high: a branch
    point)."""
    support = with_tail(torch.from_numpy(topm_logprobs.astype(np.float64)))
    return -(support.exp() * support).sum(-1).numpy().astype(np.float32)


def teacher_diagnostics(trajs) -> dict[str, float]:
    """Means over action tokens of the teacher's probability of the sampled token (low: the student went where the
    teacher would not) and of the entropy of its top-M + tail distribution (high: a genuine branch point)."""
    if not trajs:
        return {}
    tokens = sum(t.num_action_tokens for t in trajs)
    masks = [t.loss_mask.astype(np.float64) for t in trajs]  # sums over one sample at a time: no batch-sized copy
    sampled = sum(float(np.exp(t.teacher_logprobs) @ mask) for t, mask in zip(trajs, masks))
    entropy = sum(float(t.teacher_entropy @ mask) for t, mask in zip(trajs, masks))
    return {"distill/teacher_sampled_prob": sampled / tokens if tokens else 0.0,
            "distill/teacher_entropy_topm": entropy / tokens if tokens else 0.0}


def gap_by_token_class(trajs) -> dict[str, float]:
    """Where the env tells tool-call syntax from content: the mean |log p_T(a) - the student's log p(a) when it
    sampled| on each class of action tokens, and the share of syntax tokens (a divergence dominated by syntax is
    style, not skill)."""
    trajs = [t for t in trajs if t.token_classes is not None]
    if not trajs:
        return {}
    classes = np.concatenate([t.token_classes for t in trajs])
    action = np.concatenate([t.loss_mask for t in trajs]).astype(bool) & (classes >= 0)
    if not action.any():
        return {}
    gap = np.abs(np.concatenate([t.teacher_logprobs.astype(np.float64) - t.rollout_logprobs for t in trajs]))
    syntax, content = action & (classes == 1), action & (classes == 0)
    return {"distill/gap_syntax": float(gap[syntax].mean()) if syntax.any() else 0.0,
            "distill/gap_content": float(gap[content].mean()) if content.any() else 0.0,
            "distill/syntax_token_share": float(syntax.sum() / action.sum())}


def privilege_diagnostics(trajs, gap_min: float) -> dict[str, float]:
    """Where the privileged student scored: the mean gap log p_T(a | c) - log p_student(a | c) over action tokens
    and the share of them the privilege_gap route distills."""
    trajs = [t for t in trajs if t.privileged_logprobs is not None]
    if not trajs:
        return {}
    mask = np.concatenate([t.loss_mask for t in trajs]).astype(bool)
    gap = np.concatenate([t.teacher_logprobs.astype(np.float64) - t.privileged_logprobs for t in trajs])[mask]
    return {"distill/privilege_gap_mean": float(gap.mean()) if mask.any() else 0.0,
            "distill/privileged_token_share": float((gap > gap_min).mean()) if mask.any() else 0.0}


def context_decomposition(trajs) -> dict[str, float]:
    """Where the teacher scored without its context too (`algorithm.distill.diagnose_context`): per action token,
    the supervision the context induces, log p_T(a | c) - log p_T(a), and the teacher's own, log p_T(a) - the
    student's log-prob at sampling time; means, and the context's share of their absolute sizes."""
    trajs = [t for t in trajs if t.teacher_plain_logprobs is not None]
    if not trajs:
        return {}
    mask = np.concatenate([t.loss_mask for t in trajs]).astype(bool)
    with_context, plain, student = (np.concatenate([getattr(t, name) for t in trajs]).astype(np.float64)[mask]
                                    for name in ("teacher_logprobs", "teacher_plain_logprobs", "rollout_logprobs"))
    context, own = with_context - plain, plain - student
    size = np.abs(context).mean() + np.abs(own).mean()
    return {"distill/context_gain": float(context.mean()), "distill/teacher_own_gap": float(own.mean()),
            "distill/context_share": float(np.abs(context).mean() / size) if size > 0 else 0.0}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / norm if norm > 0 else 0.0


def update_alignment(trajs, updated) -> dict[str, float]:
    """How the update's change of the student's log-prob of each sampled token (after minus before, over action
    tokens) lines up with the supervision the context induces, log p_T(a | c) - log p_T(a), and with the teacher's
    own, log p_T(a) - the student's log p(a) before: cosine similarities."""
    rows = [(t, after) for t, after in zip(trajs, updated, strict=True)
            if t.teacher_plain_logprobs is not None and t.student_logprobs is not None]
    if not rows:
        return {}
    mask = np.concatenate([t.loss_mask for t, _ in rows]).astype(bool)
    change = np.concatenate([after.astype(np.float64) - t.student_logprobs for t, after in rows])[mask]
    context = np.concatenate([t.teacher_logprobs.astype(np.float64) - t.teacher_plain_logprobs for t, _ in rows])[mask]
    own = np.concatenate([t.teacher_plain_logprobs.astype(np.float64) - t.student_logprobs for t, _ in rows])[mask]
    return {"distill/update_align_context": cosine(change, context), "distill/update_align_own": cosine(change, own)}
