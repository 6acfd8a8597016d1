"""lopd_ray/algorithms/distill_losses.py: top-M + tail divergences against hand values, gradients against finite
differences, the tail clamp at top-M mass 1 in float32/bfloat16, the JSD end conventions, k1/k3, and M = V."""
from __future__ import annotations

import math

import pytest
import torch

from lopd_ray.algorithms.distill_losses import (
    DISTILL_LOSSES,
    TAIL_MIN_PROB,
    forward_kl_topm_tail,
    gather_topm,
    generalized_jsd_topm_tail,
    make_distill_loss,
    reverse_kl_topm_tail,
    sampled_k1,
    sampled_k3,
    with_tail,
)

# Two positions, V = 5, M = 2, written out. The teacher's top-2 indices are chosen by hand from its distribution.
#   position 0: p_T = [.50 .30 .10 .06 .04] top-2 idx [0, 1] -> p_T on support (.50, .30, tail .20)
#               p_S = [.20 .40 .20 .10 .10] at idx [0, 1]    -> p_S on support (.20, .40, tail .40)
#   position 1: p_T = [.10 .05 .60 .05 .20] top-2 idx [2, 4] -> p_T on support (.60, .20, tail .20)
#               p_S = [.25 .25 .25 .15 .10] at idx [2, 4]    -> p_S on support (.25, .10, tail .65)
P_T = [[0.50, 0.30, 0.10, 0.06, 0.04], [0.10, 0.05, 0.60, 0.05, 0.20]]
P_S = [[0.20, 0.40, 0.20, 0.10, 0.10], [0.25, 0.25, 0.25, 0.15, 0.10]]
IDX = [[0, 1], [2, 4]]
# (student, teacher) probabilities on the 3-outcome support [top-1, top-2, tail], tails worked by hand.
SUPPORT = [((0.20, 0.40, 0.40), (0.50, 0.30, 0.20)), ((0.25, 0.10, 0.65), (0.60, 0.20, 0.20))]

# Reverse KL by hand: sum_k s_k ln(s_k / t_k).
REVERSE_HAND = [
    0.20 * math.log(0.20 / 0.50) + 0.40 * math.log(0.40 / 0.30) + 0.40 * math.log(0.40 / 0.20),  # ~0.209074
    0.25 * math.log(0.25 / 0.60) + 0.10 * math.log(0.10 / 0.20) + 0.65 * math.log(0.65 / 0.20),  # ~0.477944
]
# Forward KL by hand: sum_k t_k ln(t_k / s_k).
FORWARD_HAND = [
    0.50 * math.log(0.50 / 0.20) + 0.30 * math.log(0.30 / 0.40) + 0.20 * math.log(0.20 / 0.40),  # ~0.233211
    0.60 * math.log(0.60 / 0.25) + 0.20 * math.log(0.20 / 0.10) + 0.20 * math.log(0.20 / 0.65),  # ~0.428180
]


def _hand_tensors(dtype=torch.float64):
    """Returns (student logits [1,2,5], teacher idx [1,2,2], student top-M logp [1,2,2], teacher top-M logp [1,2,2])."""
    # Logits = log p + an arbitrary per-position constant, so gather_topm's normalization is exercised.
    logits = torch.tensor([[[math.log(p) + 3.0 for p in P_S[0]], [math.log(p) - 7.0 for p in P_S[1]]]], dtype=dtype)
    idx = torch.tensor([IDX])
    student = torch.tensor([[[math.log(P_S[t][i]) for i in IDX[t]] for t in range(2)]], dtype=dtype)
    teacher = torch.tensor([[[math.log(P_T[t][i]) for i in IDX[t]] for t in range(2)]], dtype=dtype)
    return logits, idx, student, teacher


def _jsd_hand(s, t, beta):
    """beta KL(t || m) + (1 - beta) KL(s || m), m = beta t + (1 - beta) s, on explicit probability lists."""
    m = [beta * tk + (1 - beta) * sk for sk, tk in zip(s, t)]
    return beta * sum(tk * math.log(tk / mk) for tk, mk in zip(t, m)) + (1 - beta) * sum(
        sk * math.log(sk / mk) for sk, mk in zip(s, m)
    )


# ---------------------------------------------------------------------------------------------------------- 1


def test_with_tail_hand_values_and_dtype():
    _, _, student, teacher = _hand_tensors()
    full = with_tail(teacher)
    assert full.shape == (1, 2, 3)
    torch.testing.assert_close(full.exp(), torch.tensor([[SUPPORT[0][1], SUPPORT[1][1]]], dtype=torch.float64))
    torch.testing.assert_close(with_tail(student)[..., -1].exp(), torch.tensor([[0.40, 0.65]], dtype=torch.float64))
    # Half-precision input is computed and returned in float32.
    assert with_tail(teacher.to(torch.bfloat16)).dtype == torch.float32


def test_gather_topm_is_log_softmax_at_teacher_indices():
    logits, idx, student, _ = _hand_tensors()
    torch.testing.assert_close(gather_topm(logits, idx), student)
    torch.manual_seed(0)
    logits_BTV = torch.randn(3, 4, 11) * 4
    idx_BTM = torch.randint(0, 11, (3, 4, 5))
    for temperature in (1.0, 0.7):
        ref = torch.log_softmax(logits_BTV / temperature, dim=-1).gather(-1, idx_BTM)
        torch.testing.assert_close(gather_topm(logits_BTV, idx_BTM, temperature=temperature), ref)
    assert gather_topm(logits_BTV.to(torch.bfloat16), idx_BTM).dtype == torch.float32


def test_reverse_kl_hand_values_nonnegative_and_zero_when_equal():
    logits, idx, student, teacher = _hand_tensors()
    expected = torch.tensor([REVERSE_HAND], dtype=torch.float64)
    assert abs(REVERSE_HAND[0] - 0.209074) < 1e-6 and abs(REVERSE_HAND[1] - 0.477944) < 1e-6
    out = reverse_kl_topm_tail(student, teacher)
    assert out.shape == (1, 2)  # per token, never reduced
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    # Through the student logits (gather at the teacher's indices): the same numbers.
    torch.testing.assert_close(reverse_kl_topm_tail(gather_topm(logits, idx), teacher), expected, rtol=0, atol=1e-12)
    # Direction matters: swapping the arguments gives the forward KL, which differs here.
    assert (reverse_kl_topm_tail(teacher, student) - expected).abs().min() > 1e-3

    torch.manual_seed(1)
    s_logits, t_logits = torch.randn(4, 6, 9) * 3, torch.randn(4, 6, 9) * 3
    t_idx = t_logits.topk(3, dim=-1).indices
    s_top, t_top = gather_topm(s_logits, t_idx), gather_topm(t_logits, t_idx)
    assert (reverse_kl_topm_tail(s_top, t_top) >= 0).all()
    assert reverse_kl_topm_tail(t_top, t_top).abs().max() < 1e-6
    assert reverse_kl_topm_tail(s_top, t_top).min() > 1e-4  # and not trivially zero for different distributions


# ---------------------------------------------------------------------------------------------------------- 2


def test_reverse_kl_gradient_wrt_student_logits_matches_finite_differences():
    torch.manual_seed(2)
    B, T, V, M = 2, 3, 6, 3
    s_logits = (torch.randn(B, T, V, dtype=torch.float64) * 2).requires_grad_(True)
    t_logits = (torch.randn(B, T, V, dtype=torch.float64) * 2).requires_grad_(True)
    idx = t_logits.detach().topk(M, dim=-1).indices

    def loss(s, t):
        return reverse_kl_topm_tail(gather_topm(s, idx), gather_topm(t, idx))

    # Full Jacobians ([B, T] outputs x logits) on both sides: the teacher side is NOT detached (composer update).
    assert torch.autograd.gradcheck(loss, (s_logits, t_logits), eps=1e-6, atol=1e-7, rtol=1e-5)

    # One explicit central difference on a weighted sum of the per-token outputs.
    w = torch.rand(B, T, dtype=torch.float64)
    (grad,) = torch.autograd.grad((loss(s_logits, t_logits) * w).sum(), s_logits)
    h = 1e-6
    fd = torch.zeros_like(grad)
    with torch.no_grad():
        base = s_logits.detach()
        for flat in range(base.numel()):
            plus, minus = base.clone(), base.clone()
            plus.view(-1)[flat] += h
            minus.view(-1)[flat] -= h
            fd.view(-1)[flat] = ((loss(plus, t_logits) - loss(minus, t_logits)) * w).sum() / (2 * h)
    torch.testing.assert_close(grad, fd, rtol=1e-6, atol=1e-8)
    assert grad.abs().max() > 1e-3  # a real gradient, not a vacuous zero
    (t_grad,) = torch.autograd.grad(loss(s_logits, t_logits).sum(), t_logits)
    assert t_grad.abs().max() > 1e-3  # gradient reaches the teacher input too


# ---------------------------------------------------------------------------------------------------------- 3


def _naive_tail(topm):
    return torch.log(-torch.expm1(torch.logsumexp(topm.float(), dim=-1)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tail_finite_when_topm_mass_is_one_or_above(dtype):
    # Row 0: mass exactly 1 (one token, log p = 0). Row 1: two tokens of log(0.5) + 1e-3 -> mass rounds above 1.
    # Row 2: log(0.5) in this dtype (bfloat16: -0.69140625, mass 1.0016 > 1).
    topm = torch.tensor([[[0.0, -1e4], [math.log(0.5) + 1e-3] * 2, [math.log(0.5)] * 2]], dtype=dtype)
    # Without the clamp these are -inf / NaN - the situation the clamp exists for.
    assert not torch.isfinite(_naive_tail(topm)[0, :2]).any()
    leaf = topm.clone().requires_grad_(True)
    full = with_tail(leaf)
    assert full.dtype == torch.float32 and torch.isfinite(full).all()
    assert full[0, :2, -1].tolist() == pytest.approx([math.log(TAIL_MIN_PROB)] * 2, abs=1e-3)
    full.sum().backward()
    assert torch.isfinite(leaf.grad).all()

    # Teacher puts all its mass on M tokens (huge logit margins), student too: both tails clamped.
    V, M = 8, 2
    t_logits = torch.tensor([[[60.0, 60.0] + [-60.0] * (V - 2), [80.0, -80.0, 79.0] + [-80.0] * (V - 3)]])
    s_logits = torch.tensor([[[50.0, 49.0] + [-50.0] * (V - 2), [0.3, 0.1, -0.2] + [0.05] * (V - 3)]])
    idx = t_logits.topk(M, dim=-1).indices
    s_logits = s_logits.to(dtype).requires_grad_(True)
    t_logits = t_logits.to(dtype).requires_grad_(True)
    s_top, t_top = gather_topm(s_logits, idx), gather_topm(t_logits, idx)
    assert t_top.dtype == torch.float32
    for name, fn in DISTILL_LOSSES.items():
        for extra in ({},) if name != "jsd_topm_tail" else ({}, {"beta": 0.0}, {"beta": 1.0}, {"beta": 0.9}):
            out = fn(s_top, t_top, **extra)
            assert out.shape == (1, 2) and torch.isfinite(out).all(), (name, extra, out)
            gs, gt = torch.autograd.grad(out.sum(), (s_logits, t_logits), retain_graph=True)
            assert torch.isfinite(gs).all() and torch.isfinite(gt).all(), (name, extra)
    # Position 1: diffuse student vs a teacher with no tail -> the reverse KL is large (tail at its floor), not inf.
    rkl = reverse_kl_topm_tail(s_top, t_top)
    assert rkl[0, 1] > 5.0 and rkl[0, 0] < 1.0


def test_tail_gradient_just_below_the_clamp_is_finite_and_correct():
    # Mass 1 - 2e-6 in float32 (tail 2e-6, just above the floor): unclamped, d log tail / d logp_i = -p_i / tail.
    topm = torch.tensor([math.log(0.5 - 1e-6)] * 2, dtype=torch.float64).requires_grad_(True)
    tail = with_tail(topm)[-1]
    assert tail.item() == pytest.approx(math.log(2e-6), rel=1e-9)
    tail.backward()
    assert topm.grad.tolist() == pytest.approx([-(0.5 - 1e-6) / 2e-6] * 2, rel=1e-6)
    t32 = topm.detach().float().requires_grad_(True)
    with_tail(t32)[-1].backward()
    assert torch.isfinite(t32.grad).all() and t32.grad.abs().max() <= 1.0 / TAIL_MIN_PROB


# ---------------------------------------------------------------------------------------------------------- 4


def test_forward_kl_and_jsd_hand_values():
    _, _, student, teacher = _hand_tensors()
    assert abs(FORWARD_HAND[0] - 0.233211) < 1e-6 and abs(FORWARD_HAND[1] - 0.428180) < 1e-6
    torch.testing.assert_close(
        forward_kl_topm_tail(student, teacher), torch.tensor([FORWARD_HAND], dtype=torch.float64), rtol=0, atol=1e-12
    )
    for beta in (0.3, 0.5, 0.8):
        expected = torch.tensor([[_jsd_hand(s, t, beta) for s, t in SUPPORT]], dtype=torch.float64)
        torch.testing.assert_close(generalized_jsd_topm_tail(student, teacher, beta), expected, rtol=0, atol=1e-12)
    # Asymmetric beta: swapping the weights would be caught (0.3 and 0.7 give different values here).
    gap = generalized_jsd_topm_tail(student, teacher, 0.3) - generalized_jsd_topm_tail(student, teacher, 0.7)
    assert gap.abs().min() > 1e-4


def test_jsd_ends_follow_method_convention():
    _, _, student, teacher = _hand_tensors()
    fwd, rev = forward_kl_topm_tail(student, teacher), reverse_kl_topm_tail(student, teacher)
    # beta = 0 IS forward KL(p_T || p_S), beta = 1 IS reverse KL(p_S || p_T) (METHOD.md, OPSD/TRL code), no NaN.
    torch.testing.assert_close(generalized_jsd_topm_tail(student, teacher, 0.0), fwd, rtol=0, atol=0)
    torch.testing.assert_close(generalized_jsd_topm_tail(student, teacher, 1.0), rev, rtol=0, atol=0)
    torch.testing.assert_close(make_distill_loss("jsd_topm_tail", 0.0)(student, teacher), fwd)
    torch.testing.assert_close(make_distill_loss("jsd_topm_tail", 1.0)(student, teacher), rev)
    # The convention is consistent with the mixture formula's first-order behaviour near the ends:
    # JSD_beta ~ beta * KL(p_T || p_S) as beta -> 0 and ~ (1 - beta) * KL(p_S || p_T) as beta -> 1.
    eps = 1e-5
    torch.testing.assert_close(generalized_jsd_topm_tail(student, teacher, eps) / eps, fwd, rtol=1e-3, atol=0)
    torch.testing.assert_close(generalized_jsd_topm_tail(student, teacher, 1 - eps) / eps, rev, rtol=1e-3, atol=0)
    with pytest.raises(ValueError):
        generalized_jsd_topm_tail(student, teacher, 1.5)


def test_jsd_symmetry_and_bounds():
    torch.manual_seed(3)
    s_logits, t_logits = torch.randn(3, 5, 10, dtype=torch.float64) * 3, torch.randn(3, 5, 10, dtype=torch.float64) * 3
    idx = t_logits.topk(4, dim=-1).indices
    s, t = gather_topm(s_logits, idx), gather_topm(t_logits, idx)
    half = generalized_jsd_topm_tail(s, t, 0.5)
    torch.testing.assert_close(half, generalized_jsd_topm_tail(t, s, 0.5))  # symmetric at beta = 0.5
    assert (half >= 0).all() and (half <= math.log(2) + 1e-12).all() and half.max() > 1e-3
    # JSD_beta(S, T) = JSD_{1-beta}(T, S): the roles of beta and the arguments are tied together.
    torch.testing.assert_close(generalized_jsd_topm_tail(s, t, 0.3), generalized_jsd_topm_tail(t, s, 0.7))
    assert generalized_jsd_topm_tail(t, t, 0.4).abs().max() < 1e-12


def test_sampled_k1_k3_hand_values():
    # l = ln .5 - ln .25 = ln 2: k1 = ln 2, k3 = 1/2 - 1 + ln 2.  l = -ln 2: k3 = 2 - 1 - ln 2.  l = 0: both 0.
    s = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.3)]])
    t = torch.tensor([[math.log(0.25), math.log(0.5), math.log(0.3)]])
    ln2 = math.log(2)
    assert sampled_k1(s, t).tolist()[0] == pytest.approx([ln2, -ln2, 0.0], abs=1e-6)
    assert sampled_k3(s, t).tolist()[0] == pytest.approx([0.5 - 1 + ln2, 2 - 1 - ln2, 0.0], abs=1e-6)
    l = torch.linspace(-20, 20, 401).reshape(1, -1)
    assert (sampled_k3(l, torch.zeros_like(l)) >= 0).all()
    # Tiny log-ratios: expm1 keeps k3 ~ l^2 / 2 accurate in float32 (exp(-l) - 1 would round to 0 or worse).
    assert sampled_k3(torch.tensor([[1e-4]]), torch.zeros(1, 1)).item() == pytest.approx(0.5e-8, rel=1e-3)
    assert sampled_k3(s.to(torch.bfloat16), t.to(torch.bfloat16)).dtype == torch.float32


def test_registry_and_factory():
    _, _, student, teacher = _hand_tensors()
    assert set(DISTILL_LOSSES) == {"reverse_kl_topm_tail", "forward_kl_topm_tail", "jsd_topm_tail"}
    for name, fn in (("reverse_kl_topm_tail", reverse_kl_topm_tail), ("forward_kl_topm_tail", forward_kl_topm_tail)):
        torch.testing.assert_close(DISTILL_LOSSES[name](student, teacher), fn(student, teacher))
    torch.testing.assert_close(
        DISTILL_LOSSES["jsd_topm_tail"](student, teacher), generalized_jsd_topm_tail(student, teacher, 0.5)
    )
    jsd3 = make_distill_loss("jsd_topm_tail", jsd_beta=0.3)(student, teacher)
    torch.testing.assert_close(jsd3, torch.tensor([[_jsd_hand(s, t, 0.3) for s, t in SUPPORT]], dtype=torch.float64))
    assert make_distill_loss("reverse_kl_topm_tail") is reverse_kl_topm_tail
    with pytest.raises(KeyError):
        make_distill_loss("reverse_kl")


# ---------------------------------------------------------------------------------------------------------- 5


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_top_m_equal_to_vocab_matches_full_kl(dtype):
    torch.manual_seed(4)
    B, T, V = 2, 3, 7
    s_logits, t_logits = torch.randn(B, T, V, dtype=dtype) * 2, torch.randn(B, T, V, dtype=dtype) * 2
    idx = t_logits.argsort(dim=-1, descending=True)  # M = V: the whole vocabulary, teacher's order
    s, t = gather_topm(s_logits, idx), gather_topm(t_logits, idx)
    # Tail ~ 0: at its floor, since the top-M mass is 1 up to rounding.
    assert (with_tail(s)[..., -1] <= math.log(TAIL_MIN_PROB) + 1e-3).all()
    log_ps, log_pt = torch.log_softmax(s_logits, -1), torch.log_softmax(t_logits, -1)
    full_rev = (log_ps.exp() * (log_ps - log_pt)).sum(-1)
    full_fwd = (log_pt.exp() * (log_pt - log_ps)).sum(-1)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(reverse_kl_topm_tail(s, t), full_rev, **tol)
    torch.testing.assert_close(forward_kl_topm_tail(s, t), full_fwd, **tol)
    assert full_rev.min() > 1e-2


def test_sampled_token_losses_hand_values_gradients_and_the_is_clip():
    from lopd_ray.algorithms.distill_losses import (SAMPLED_LOSSES, k1_reinforce, k1_sigmoid_gated,
                                                    k1_teacher_prob_weighted, k3_importance_weighted)

    assert SAMPLED_LOSSES == {"k1_reinforce": k1_reinforce, "k1_sigmoid": k1_sigmoid_gated,
                              "k1_teacher_prob": k1_teacher_prob_weighted, "k3_is": k3_importance_weighted}
    teacher = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=torch.float64)
    # Token 0: p_S 0.5 vs p_T 0.25, l = ln 2, on-policy (ratio 1). Token 1: p_S 0.75 vs p_T 0.5, l = ln 1.5, and the
    # policy moved since the rollout: old p_S 0.25, ratio 3, clipped at 2.
    student = torch.tensor([[math.log(0.5), math.log(0.75)]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=torch.float64)
    l0, l1 = math.log(2.0), math.log(1.5)
    k1 = k1_reinforce(student, teacher, old, is_clip=2.0)
    torch.testing.assert_close(k1, torch.tensor([[l0 * 1.0, l1 * 2.0]], dtype=torch.float64))
    (grad,) = torch.autograd.grad(k1.sum(), student)
    torch.testing.assert_close(grad, torch.tensor([[l0, 0.0]], dtype=torch.float64))  # no gradient past the clip
    # Bounded: 2 sigmoid(l) - 1 = (e^l - 1) / (e^l + 1): (2 - 1) / 3 and (1.5 - 1) / 2.5, times the clipped ratio.
    gated = k1_sigmoid_gated(student, teacher, old, is_clip=2.0)
    torch.testing.assert_close(gated, torch.tensor([[1 / 3, 2.0 * 0.2]], dtype=torch.float64))
    zero = torch.zeros(1, 1, dtype=torch.float64)
    far = k1_sigmoid_gated(zero, zero - 20.0, zero, 2.0)
    assert 0.99 < float(far) < 1.0  # a 20-nat gap still weighs less than 1 (k1 would weigh it 20)
    (grad,) = torch.autograd.grad(gated.sum(), student)
    torch.testing.assert_close(grad, torch.tensor([[1 / 3, 0.0]], dtype=torch.float64))
    # Teacher-probability weighted: p_T(a) * l = 0.25 ln 2 and 0.5 ln 1.5 (times 2).
    weighted = k1_teacher_prob_weighted(student, teacher, old, is_clip=2.0)
    torch.testing.assert_close(weighted, torch.tensor([[0.25 * l0, 2.0 * 0.5 * l1]], dtype=torch.float64))
    k3 = k3_importance_weighted(student, teacher, old, is_clip=2.0)
    k3_hand = [math.exp(-l0) - 1 + l0, 2.0 * (math.exp(-l1) - 1 + l1)]  # 0.1931, 2 x 0.0721
    torch.testing.assert_close(k3, torch.tensor([k3_hand], dtype=torch.float64))
    assert (k3 >= 0).all()
    (grad,) = torch.autograd.grad(k3.sum(), student)  # d k3 / d log p_S = 1 - exp(-l), the weight is constant
    torch.testing.assert_close(grad, torch.tensor([[1 - math.exp(-l0), 2.0 * (1 - math.exp(-l1))]],
                                                  dtype=torch.float64))


def test_renormalized_support_hand_values():
    _, _, student, teacher = _hand_tensors()
    # Renormalized over the top-2 (no tail): position 0 S (.2, .4)/.6, T (.5, .3)/.8; position 1 S (.25, .1)/.35,
    # T (.6, .2)/.8.
    s0, t0, s1, t1 = (1 / 3, 2 / 3), (0.625, 0.375), (5 / 7, 2 / 7), (0.75, 0.25)
    reverse = [sum(s * math.log(s / t) for s, t in zip(s0, t0)), sum(s * math.log(s / t) for s, t in zip(s1, t1))]
    forward = [sum(t * math.log(t / s) for s, t in zip(s0, t0)), sum(t * math.log(t / s) for s, t in zip(s1, t1))]
    torch.testing.assert_close(make_distill_loss("reverse_kl_topm_tail", tail=False)(student, teacher)[0],
                               torch.tensor(reverse, dtype=torch.float64))
    torch.testing.assert_close(make_distill_loss("jsd_topm_tail", 0.0, tail=False)(student, teacher)[0],
                               torch.tensor(forward, dtype=torch.float64))


def test_the_pointwise_clip_caps_each_support_entrys_term_before_the_sum():
    _, _, student, teacher = _hand_tensors()
    # Reverse KL's terms s_k ln(s_k / t_k) on top-2 + tail: position 0 (-0.1833, 0.1151, 0.2773), position 1
    # (-0.2189, -0.0693, 0.7661). At 0.3 only position 1's tail term is capped: -0.2189 - 0.0693 + 0.3 = 0.011818
    # (a cap of the summed divergence would give 0.3); at 0.2 position 0's tail term is capped too.
    terms = [[s * math.log(s / t) for s, t in zip(*SUPPORT[i])] for i in range(2)]
    for cap in (0.3, 0.2):
        capped = make_distill_loss("reverse_kl_topm_tail", pointwise_clip=cap)(student, teacher)[0]
        torch.testing.assert_close(capped, torch.tensor([sum(min(x, cap) for x in row) for row in terms],
                                                        dtype=torch.float64))
    assert make_distill_loss("reverse_kl_topm_tail", pointwise_clip=0.3)(student, teacher)[0, 1] == pytest.approx(
        0.011818, abs=1e-6)
    # The JSD's pointwise term at beta 0.5: 0.5 t_k ln(t_k / m_k) + 0.5 s_k ln(s_k / m_k), m = (s + t) / 2.
    jsd_terms = [[0.5 * t * math.log(2 * t / (s + t)) + 0.5 * s * math.log(2 * s / (s + t)) for s, t in zip(*SUPPORT[i])]
                 for i in range(2)]
    torch.testing.assert_close(make_distill_loss("jsd_topm_tail", 0.5, pointwise_clip=0.02)(student, teacher)[0],
                               torch.tensor([sum(min(x, 0.02) for x in row) for row in jsd_terms], dtype=torch.float64))
    # Away from the cap's kink the gradient is the capped function's: a capped term passes none, the others do.
    capped = make_distill_loss("reverse_kl_topm_tail", pointwise_clip=0.3)
    assert torch.autograd.gradcheck(lambda s_: capped(s_, teacher), (student.clone().requires_grad_(True),))


# A peaked teacher against a diffuse student, V = 3, M = 1: p_T = (1 - 2e-10, 1e-10, 1e-10), p_S = (0.02, 0.49, 0.49).
# The full-vocabulary reverse KL is 0.02 ln(0.02 / (1 - 2e-10)) + 2 x 0.49 ln(0.49 / 1e-10) = 21.788; on the top-1
# + tail the exact tail (2e-10 vs 0.98) gives the same value, and each clamp raises the teacher's tail to its floor.
PEAKED_TOP = 0.02 * math.log(0.02 / (1 - 2e-10))
PEAKED_FULL = PEAKED_TOP + 2 * 0.49 * math.log(0.49 / 1e-10)                    # 21.788011
PEAKED_BY_CLAMP = {"floor_1e-6": PEAKED_TOP + 0.98 * math.log(0.98 / 1e-6),      # 13.441161
                   "sdpo": PEAKED_TOP + 0.98 * math.log(0.98 / 1.0e-7)}          # 15.697695 (1 - e^-1e-7 ~ 1e-7)


@pytest.mark.parametrize("clamp", sorted(PEAKED_BY_CLAMP))
def test_each_tail_clamp_gives_its_hand_value_on_a_peaked_teacher(clamp):
    from lopd_ray.algorithms.distill_losses import TAIL_CLAMPS

    assert sorted(TAIL_CLAMPS) == sorted(PEAKED_BY_CLAMP)
    student = torch.tensor([[[math.log(0.02)]]], dtype=torch.float64)
    teacher = torch.tensor([[[math.log1p(-2e-10)]]], dtype=torch.float64)
    full_s = torch.tensor([0.02, 0.49, 0.49], dtype=torch.float64).log()
    full_t = torch.tensor([1 - 2e-10, 1e-10, 1e-10], dtype=torch.float64).log()
    assert float((full_s.exp() * (full_s - full_t)).sum()) == pytest.approx(PEAKED_FULL, rel=1e-12)
    got = make_distill_loss("reverse_kl_topm_tail", tail_clamp=clamp)(student, teacher)
    assert float(got) == pytest.approx(PEAKED_BY_CLAMP[clamp], rel=1e-6)
    # Above both floors (the hand support of position 0: teacher tail 0.2) every clamp gives the exact value.
    _, _, s, t = _hand_tensors()
    assert float(make_distill_loss("reverse_kl_topm_tail", tail_clamp=clamp)(s, t)[0, 0]) == pytest.approx(
        REVERSE_HAND[0], rel=1e-12)


def test_the_tail_clamp_setting_reaches_the_distillation_loss():
    from lopd_ray.algorithms import make_algorithm
    from lopd_ray.config import AlgorithmConfig, DistillConfig

    student = torch.tensor([[[math.log(0.02)]]], dtype=torch.float64)
    teacher = torch.tensor([[[math.log1p(-2e-10)]]], dtype=torch.float64)
    for clamp, value in PEAKED_BY_CLAMP.items():
        algorithm = make_algorithm(AlgorithmConfig(name="distill", distill=DistillConfig(tail_clamp=clamp)))
        assert float(algorithm.divergence(student, teacher)) == pytest.approx(value, rel=1e-6)
