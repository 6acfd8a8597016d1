"""Per-token distillation divergences on a truncated support (METHOD.md section 1).

Every function maps per-position inputs to a per-token value: [B, T, M] (or [B, T]) in, [B, T] out. Nothing here
reduces over tokens; aggregation is `losses.token_weights`' job, like every other loss term.

Support "top-M + tail": the teacher's M most likely tokens at a position plus one extra outcome, the tail, whose
probability is 1 - sum of the M probabilities. Both distributions are evaluated on the SAME indices (the teacher's;
`gather_topm` produces the student's log-probs there), so the student's tail holds whatever student mass falls
outside the teacher's top-M.

Precision: inputs in bfloat16/float16 are upcast to float32 and the results are float32; float32 and float64 inputs
keep their dtype (float64 is what the finite-difference tests run in).

Gradients: nothing is detached here. The student update differentiates the student side; the composer update
differentiates the teacher side (through the latents) as well, so either input may require grad. Inputs must be
finite log-probs (top-M entries of a log_softmax are).
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import torch

# Smallest tail probability the tail bucket can take (`algorithm.distill.tail_clamp`, TAIL_CLAMPS): the top-M
# log-mass s = logsumexp(top-M log-probs) is clamped to at most a bound below 0 before the tail log(-expm1(s)) is
# taken. "floor_1e-6" bounds s by log(1 - 1e-6), so log p(tail) >= log(1e-6) ~= -13.8; "sdpo" bounds s by -1e-7 as
# SDPO's official code does, so p(tail) >= 1 - exp(-1e-7) ~= 1e-7.
# - Resolution: a float32 sum of ~20 probabilities near 1 carries rounding error of order M * 2^-24 ~ 1e-6, so a tail
#   below ~1e-6 is indistinguishable from rounding noise; bfloat16 log-probs (8-bit mantissa) are coarser still and
#   their top-M mass routinely rounds ABOVE 1 - the clamp then only has to keep the result finite. 1e-7 sits at
#   float32's resolution around 1.0 (2^-24 ~ 6e-8).
# - Finite gradients: d log p(tail) / d s = -exp(s) / (1 - exp(s)) has magnitude <= 1/floor (1e6, or 1e7 with
#   "sdpo"), and 0 when the clamp is active (mass at or above 1 - floor, including exactly 1 or above). In the reverse
#   KL the student's tail gradient is multiplied by p_S(tail) and stays O(1); the teacher's is at most
#   p_S(tail)/p_T(tail).
# - Bias: NOT negligible on a peaked teacher. Where the teacher's true tail is below the floor, the reverse KL's tail
#   term p_S(tail) * (log p_S(tail) - log p_T(tail)) loses p_S(tail) * log(floor / true tail) nats. Teacher
#   (1 - 2e-10, 1e-10, 1e-10) and student (0.02, 0.49, 0.49) on their top-1 + tail: 13.44 nats with "floor_1e-6",
#   15.70 with "sdpo", 21.79 (the full-vocabulary float64 value) with the exact tail. The floor trades that bias for
#   finite values and gradients in float32; where the teacher's tail is above the floor, both give the exact value.
TAIL_MIN_PROB = 1e-6
_MAX_TOP_LOG_MASS = math.log1p(-TAIL_MIN_PROB)
# `algorithm.distill.tail_clamp` -> the largest top-M log-mass s the tail is taken from.
TAIL_CLAMPS: dict[str, float] = {
    "floor_1e-6": _MAX_TOP_LOG_MASS,
    "sdpo": -1e-7,
}


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float32 for half-precision inputs; float32/float64 inputs keep their dtype."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _tail_logp(topm_logp_BTM: torch.Tensor, max_top_log_mass: float) -> torch.Tensor:
    """log(1 - sum exp(top-M)) = log(-expm1(logsumexp(top-M))) with the top log-mass clamped (see TAIL_MIN_PROB)."""
    top_log_mass_BT1 = torch.logsumexp(topm_logp_BTM, dim=-1, keepdim=True)
    return torch.log(-torch.expm1(top_log_mass_BT1.clamp(max=max_top_log_mass)))


def with_tail(topm_logp_BTM: torch.Tensor, max_top_log_mass: float = _MAX_TOP_LOG_MASS) -> torch.Tensor:
    """Append the tail bucket: [B, T, M] top-M log-probs -> [B, T, M+1] log-probs, the last entry the tail.

    Computed in float32 (float64 kept); finite values and gradients even when the top-M mass is 1 or rounds above 1
    (the tail then takes its floor, TAIL_MIN_PROB unless `max_top_log_mass` says otherwise, and passes no gradient).
    """
    topm_logp_BTM = _upcast(topm_logp_BTM)
    return torch.cat([topm_logp_BTM, _tail_logp(topm_logp_BTM, max_top_log_mass)], dim=-1)


def renormalized(topm_logp_BTM: torch.Tensor) -> torch.Tensor:
    """The top-M log-probs renormalized to sum to 1 over the M tokens (no tail): the other support, [B, T, M]."""
    topm_logp_BTM = _upcast(topm_logp_BTM)
    return topm_logp_BTM - torch.logsumexp(topm_logp_BTM, dim=-1, keepdim=True)


Support = Callable[[torch.Tensor], torch.Tensor]


def _kl_terms(p_logp_BTK: torch.Tensor, q_logp_BTK: torch.Tensor) -> torch.Tensor:
    """KL(p || q)'s pointwise terms p_k (log p_k - log q_k), inputs already on the same support: [B, T, K]."""
    return p_logp_BTK.exp() * (p_logp_BTK - q_logp_BTK)


def _summed(terms_BTK: torch.Tensor, pointwise_clip: float) -> torch.Tensor:
    """The per-token divergence: its pointwise terms, each capped at `pointwise_clip` when > 0 (OPSD's option; no
    gradient from a capped term), summed over the support."""
    return (terms_BTK.clamp(max=pointwise_clip) if pointwise_clip > 0 else terms_BTK).sum(dim=-1)


def reverse_kl_topm_tail(student_topm_logp_BTM: torch.Tensor, teacher_topm_logp_BTM: torch.Tensor,
                         support: Support = with_tail, pointwise_clip: float = 0.0) -> torch.Tensor:
    """KL(p_S || p_T) over the teacher's top-M indices plus the tail (or renormalized over them, `support`):
    [B, T, M] x2 -> [B, T] (LOPD, SDPO)."""
    return _summed(_kl_terms(support(student_topm_logp_BTM), support(teacher_topm_logp_BTM)), pointwise_clip)


def forward_kl_topm_tail(student_topm_logp_BTM: torch.Tensor, teacher_topm_logp_BTM: torch.Tensor,
                         support: Support = with_tail, pointwise_clip: float = 0.0) -> torch.Tensor:
    """KL(p_T || p_S) over the teacher's top-M indices plus the tail (or renormalized over them, `support`):
    [B, T, M] x2 -> [B, T] (SDFT, OPSD as run)."""
    return _summed(_kl_terms(support(teacher_topm_logp_BTM), support(student_topm_logp_BTM)), pointwise_clip)


def generalized_jsd_topm_tail(
    student_topm_logp_BTM: torch.Tensor, teacher_topm_logp_BTM: torch.Tensor, beta: float = 0.5,
    support: Support = with_tail, pointwise_clip: float = 0.0,
) -> torch.Tensor:
    """Generalized JSD_beta on top-M + tail: beta KL(p_T || M) + (1-beta) KL(p_S || M), M = beta p_T + (1-beta) p_S.

    Convention of METHOD.md (and of the OPSD / TRL-GKD code): beta=0 IS the forward KL KL(p_T || p_S), beta=1 IS the
    reverse KL KL(p_S || p_T). These ends are special cases, not limits: the mixture formula itself tends to 0 at
    both ends (at beta=0 the mixture is p_S and the weight of KL(p_T || M) is 0), so the value jumps at beta in {0, 1}.
    Inside (0, 1) the mixture is formed in log space as logaddexp(log(beta) + log p_T, log(1-beta) + log p_S), so
    no log(0) is ever taken. A pointwise term is the JSD's at one support entry (both KLs' terms there, weighted).
    """
    beta = float(beta)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"jsd beta must be in [0, 1], got {beta}")
    if beta == 0.0:
        return forward_kl_topm_tail(student_topm_logp_BTM, teacher_topm_logp_BTM, support, pointwise_clip)
    if beta == 1.0:
        return reverse_kl_topm_tail(student_topm_logp_BTM, teacher_topm_logp_BTM, support, pointwise_clip)
    s_BTK = support(student_topm_logp_BTM)
    t_BTK = support(teacher_topm_logp_BTM)
    mix_BTK = torch.logaddexp(t_BTK + math.log(beta), s_BTK + math.log1p(-beta))  # log(beta p_T + (1-beta) p_S)
    return _summed(beta * _kl_terms(t_BTK, mix_BTK) + (1.0 - beta) * _kl_terms(s_BTK, mix_BTK), pointwise_clip)


def sampled_k1(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor) -> torch.Tensor:
    """k1 on the sampled token: l = log p_S(a) - log p_T(a) (unbiased for KL(p_S || p_T) under a ~ p_S, can be < 0)."""
    return _upcast(student_logp_BT) - _upcast(teacher_logp_BT)


def sampled_k3(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor) -> torch.Tensor:
    """k3 on the sampled token: exp(-l) - 1 + l, l = log p_S(a) - log p_T(a); >= 0 (Skill-SD). expm1 for accuracy."""
    log_ratio_BT = sampled_k1(student_logp_BT, teacher_logp_BT)
    return torch.expm1(-log_ratio_BT) + log_ratio_BT


def gather_topm(
    student_logits_BTV: torch.Tensor, teacher_topm_idx_BTM: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Student log-probs at the teacher's top-M indices: logits.gather(idx) - logsumexp(logits) -> [B, T, M] float32.

    Same as log_softmax(logits / temperature).gather(idx) without materializing the [B, T, V] log-softmax output.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits_BTV = _upcast(student_logits_BTV)
    if temperature != 1.0:
        logits_BTV = logits_BTV / temperature
    log_z_BT1 = torch.logsumexp(logits_BTV, dim=-1, keepdim=True)
    return logits_BTV.gather(-1, teacher_topm_idx_BTM.long()) - log_z_BT1


def k1_reinforce(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor, old_student_logp_BT: torch.Tensor,
                 is_clip: float) -> torch.Tensor:
    """k1 as a REINFORCE weight on the sampled token: sg(l) * min(r, is_clip), l = log p_S(a) - log p_T(a), r =
    p_S(a) / p_S_old(a) the importance ratio of this update (1 on-policy; its gradient is grad log p_S(a)). Its
    expected gradient under a ~ p_S is the reverse KL's; past the clip no gradient flows (OPD's per-token
    advantage -l)."""
    ratio_BT = torch.exp(_upcast(student_logp_BT) - _upcast(old_student_logp_BT).detach())
    return sampled_k1(student_logp_BT, teacher_logp_BT).detach() * ratio_BT.clamp(max=is_clip)


def k1_sigmoid_gated(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor,
                     old_student_logp_BT: torch.Tensor, is_clip: float) -> torch.Tensor:
    """k1 with a bounded weight: sg(2 sigmoid(l) - 1) * min(r, is_clip), in (-1, 1) whatever the gap, so that a few
    tokens the teacher finds absurd cannot dominate the step."""
    ratio_BT = torch.exp(_upcast(student_logp_BT) - _upcast(old_student_logp_BT).detach())
    gate_BT = 2.0 * torch.sigmoid(sampled_k1(student_logp_BT, teacher_logp_BT)) - 1.0
    return gate_BT.detach() * ratio_BT.clamp(max=is_clip)


def k1_teacher_prob_weighted(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor,
                             old_student_logp_BT: torch.Tensor, is_clip: float) -> torch.Tensor:
    """k1 scaled by the teacher's probability of the sampled token: sg(p_T(a) * l) * min(r, is_clip); the tokens
    the teacher is sure about count most."""
    ratio_BT = torch.exp(_upcast(student_logp_BT) - _upcast(old_student_logp_BT).detach())
    weight_BT = torch.exp(_upcast(teacher_logp_BT)) * sampled_k1(student_logp_BT, teacher_logp_BT)
    return weight_BT.detach() * ratio_BT.clamp(max=is_clip)


def k3_importance_weighted(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor,
                           old_student_logp_BT: torch.Tensor, is_clip: float) -> torch.Tensor:
    """k3 on the sampled token weighted by the importance ratio, clipped: min(sg(r), is_clip) * k3 (Skill-SD)."""
    ratio_BT = torch.exp(_upcast(student_logp_BT) - _upcast(old_student_logp_BT)).detach()
    return ratio_BT.clamp(max=is_clip) * sampled_k3(student_logp_BT, teacher_logp_BT)


DistillLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

DISTILL_LOSSES: dict[str, DistillLoss] = {
    "reverse_kl_topm_tail": reverse_kl_topm_tail,
    "forward_kl_topm_tail": forward_kl_topm_tail,
    "jsd_topm_tail": functools.partial(generalized_jsd_topm_tail, beta=0.5),
}


# Losses on the sampled token only: (student [B, T], teacher [B, T], student before the update [B, T], is_clip).
SampledLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
SAMPLED_LOSSES: dict[str, SampledLoss] = {
    "k1_reinforce": k1_reinforce,
    "k1_sigmoid": k1_sigmoid_gated,
    "k1_teacher_prob": k1_teacher_prob_weighted,
    "k3_is": k3_importance_weighted,
}


def make_distill_loss(name: str, jsd_beta: float = 0.5, tail: bool = True, pointwise_clip: float = 0.0,
                      tail_clamp: str = "floor_1e-6") -> DistillLoss:
    """(student_topm_logp_BTM, teacher_topm_logp_BTM) -> [B, T] for a registry name; `jsd_beta` binds the JSD's beta,
    `tail=False` renormalizes over the top-M instead of adding the tail bucket (OPSD's top-k option), `tail_clamp`
    names the tail's floor (TAIL_CLAMPS), and `pointwise_clip > 0` caps each pointwise term of the divergence (each
    support entry's, the tail's included) before the sum over the support (OPSD's option)."""
    if name not in DISTILL_LOSSES:
        raise KeyError(f"unknown distillation loss {name!r}; known: {sorted(DISTILL_LOSSES)}")
    if not 0.0 <= float(jsd_beta) <= 1.0:
        raise ValueError(f"jsd beta must be in [0, 1], got {jsd_beta}")
    if tail_clamp not in TAIL_CLAMPS:
        raise KeyError(f"unknown tail clamp {tail_clamp!r}; known: {sorted(TAIL_CLAMPS)}")
    loss = DISTILL_LOSSES[name]
    if name == "jsd_topm_tail":
        loss = functools.partial(generalized_jsd_topm_tail, beta=float(jsd_beta))
    if not tail:
        loss = functools.partial(loss, support=renormalized)
    elif TAIL_CLAMPS[tail_clamp] != _MAX_TOP_LOG_MASS:
        loss = functools.partial(loss, support=functools.partial(with_tail,
                                                                 max_top_log_mass=TAIL_CLAMPS[tail_clamp]))
    if pointwise_clip > 0:
        loss = functools.partial(loss, pointwise_clip=float(pointwise_clip))
    return loss


__all__ = [
    "DISTILL_LOSSES",
    "SAMPLED_LOSSES",
    "TAIL_CLAMPS",
    "TAIL_MIN_PROB",
    "forward_kl_topm_tail",
    "gather_topm",
    "generalized_jsd_topm_tail",
    "k1_reinforce",
    "k1_sigmoid_gated",
    "k1_teacher_prob_weighted",
    "k3_importance_weighted",
    "make_distill_loss",
    "renormalized",
    "reverse_kl_topm_tail",
    "sampled_k1",
    "sampled_k3",
    "with_tail",
]
