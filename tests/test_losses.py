"""lopd_ray/algorithms/losses.py: PPO-clip values and gradients, the k3 KL, and token weights."""
from __future__ import annotations

import math

import pytest
import torch

from lopd_ray.algorithms.losses import clipped_pg, k3_kl, token_weights, truncated_is_weights

EPS_LOW, EPS_HIGH = 0.2, 0.3

# (advantage, ratio, expected loss, expected clipped indicator), worked by hand with eps_low=0.2, eps_high=0.3:
# loss = max(-A*r, -A*clip(r, 0.8, 1.3)).
CASES = [
    (1.0, 1.10, -1.10, 0.0),   # A>0, inside
    (1.0, 1.25, -1.25, 0.0),   # A>0, inside only because eps_high=0.3 (symmetric 0.2 would clip to -1.2)
    (1.0, 1.50, -1.30, 1.0),   # A>0, above 1+eps_high: clipped, no gradient
    (1.0, 0.50, -0.50, 0.0),   # A>0, below 1-eps_low: pessimistic unclipped term wins
    (1.0, 0.85, -0.85, 0.0),   # A>0, inside
    (-2.0, 0.50, 1.60, 1.0),   # A<0, below 1-eps_low: clipped at 2*0.8
    (-2.0, 1.50, 3.00, 0.0),   # A<0, above 1+eps_high: unclipped wins
    (-2.0, 1.25, 2.50, 0.0),   # A<0, inside (asymmetric upper bound)
    (-1.0, 0.75, 0.80, 1.0),   # A<0, just below 1-eps_low=0.8
    (0.0, 1.70, 0.00, 0.0),    # zero advantage: zero loss
]


def _tensors(dtype=torch.float64):
    adv = torch.tensor([[c[0] for c in CASES[:5]], [c[0] for c in CASES[5:]]], dtype=dtype)
    ratio = torch.tensor([[c[1] for c in CASES[:5]], [c[1] for c in CASES[5:]]], dtype=dtype)
    old = torch.linspace(-3.0, -0.5, ratio.numel(), dtype=dtype).reshape(ratio.shape)
    logp = old + ratio.log()
    loss = torch.tensor([[c[2] for c in CASES[:5]], [c[2] for c in CASES[5:]]], dtype=dtype)
    clipped = torch.tensor([[c[3] for c in CASES[:5]], [c[3] for c in CASES[5:]]], dtype=dtype)
    return logp, old, adv, loss, clipped


def test_clipped_pg_hand_values():
    logp, old, adv, expected_loss, expected_clipped = _tensors()
    loss, clipped = clipped_pg(logp, old, adv, EPS_LOW, EPS_HIGH)
    assert loss.shape == adv.shape  # never reduces
    torch.testing.assert_close(loss, expected_loss, atol=1e-9, rtol=0)
    torch.testing.assert_close(clipped.to(torch.float64), expected_clipped, atol=0, rtol=0)


def test_clipped_pg_bounds_are_not_swapped():
    logp, old, adv, expected_loss, _ = _tensors()
    swapped, _ = clipped_pg(logp, old, adv, EPS_HIGH, EPS_LOW)  # eps_low=0.3, eps_high=0.2
    # A=+1, r=1.25 is now above 1.2 -> clipped to -1.2; A=-1, r=0.75 is now inside -> 0.75.
    assert swapped[0, 1].item() == pytest.approx(-1.2)
    assert swapped[1, 3].item() == pytest.approx(0.75)
    assert not torch.allclose(swapped, expected_loss)


def test_clipped_pg_gradient_analytic_and_zero_when_clipped():
    logp, old, adv, _, expected_clipped = _tensors()
    logp = logp.clone().requires_grad_(True)
    loss, clipped = clipped_pg(logp, old, adv, EPS_LOW, EPS_HIGH)
    loss.sum().backward()
    ratio = (logp - old).exp().detach()
    # d/dlogp of -A*r is -A*r where the unclipped term is active, 0 where the clipped constant is.
    expected_grad = torch.where(expected_clipped.bool(), torch.zeros_like(ratio), -adv * ratio)
    torch.testing.assert_close(logp.grad, expected_grad, atol=1e-12, rtol=0)
    assert torch.all(logp.grad[clipped.bool()] == 0)
    assert torch.all(logp.grad[(~clipped.bool()) & (adv != 0)] != 0)


def test_clipped_pg_gradient_matches_finite_differences():
    logp, old, adv, _, _ = _tensors(torch.float64)
    logp = logp.clone().requires_grad_(True)

    def f(x):
        return clipped_pg(x, old, adv, EPS_LOW, EPS_HIGH)[0]

    # No ratio sits within 1e-6 of a clip boundary, so finite differences are valid everywhere.
    assert torch.autograd.gradcheck(f, (logp,), eps=1e-6, atol=1e-6)
    # Also against an explicit central difference per element.
    grad = torch.autograd.grad(f(logp).sum(), logp)[0]
    h = 1e-6
    fd = torch.zeros_like(grad)
    with torch.no_grad():
        for idx in range(logp.numel()):
            e = torch.zeros_like(logp).view(-1)
            e[idx] = h
            e = e.view_as(logp)
            fd.view(-1)[idx] = (f(logp + e).sum() - f(logp - e).sum()) / (2 * h)
    torch.testing.assert_close(grad, fd, atol=1e-6, rtol=1e-6)


def test_k3_kl_hand_values():
    logp = torch.tensor([math.log(0.5), 0.0, -2.0, -0.7], dtype=torch.float64)
    ref = torch.tensor([math.log(0.25), 1.0, -2.0, -0.7], dtype=torch.float64)
    kl = k3_kl(logp, ref)
    # ref-logp = -ln2: 0.5 - 1 + ln2;  ref-logp = 1: e - 2;  equal: 0.
    expected = torch.tensor([0.5 - 1 + math.log(2), math.e - 2, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(kl, expected, atol=1e-12, rtol=0)
    # k3 is not symmetric in its arguments.
    assert k3_kl(ref, logp)[0].item() == pytest.approx(2 - 1 - math.log(2))


def test_k3_kl_nonnegative_and_zero_only_when_equal():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 50, generator=g, dtype=torch.float64) * 5
    ref = -torch.rand(4, 50, generator=g, dtype=torch.float64) * 5
    kl = k3_kl(logp, ref)
    assert kl.shape == logp.shape
    assert torch.all(kl >= 0)
    assert torch.all(kl[(logp - ref).abs() > 1e-3] > 0)
    assert torch.all(k3_kl(logp, logp) == 0)


def test_truncated_is_weights_hand_values_and_no_gradient():
    old = torch.tensor([[0.0, math.log(3.0), math.log(0.5), -1.0]], requires_grad=True)
    rollout = torch.tensor([[0.0, 0.0, 0.0, -2.0]])
    weights = truncated_is_weights(old, rollout, cap=2.0)
    assert torch.allclose(weights, torch.tensor([[1.0, 2.0, 0.5, 2.0]]))  # 3 and e are capped at 2
    assert not weights.requires_grad


def test_token_weights_token_mean():
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 1, 1, 1, 0]], dtype=torch.float32)  # 5 local action tokens
    w = token_weights(mask, "token_mean", action_tokens=20, trajectories=8)
    assert w.sum().item() == pytest.approx(5 / 20)
    assert torch.all(w[mask == 0] == 0)
    assert torch.allclose(w[mask == 1], torch.full((5,), 1 / 20))


def test_token_weights_seq_mean():
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.float32)
    w = token_weights(mask, "seq_mean", action_tokens=20, trajectories=4)
    sums = w.sum(dim=1)
    torch.testing.assert_close(sums, torch.tensor([1 / 4, 1 / 4, 0.0]))  # an all-padding row weighs nothing
    assert torch.all(w[mask == 0] == 0)
    # Uniform within a trajectory: a short trajectory's tokens weigh more than a long one's.
    assert torch.allclose(w[0, :2], torch.full((2,), 1 / 8))
    assert torch.allclose(w[1, 1:], torch.full((4,), 1 / 16))


def test_token_weights_seq_sum_weigh_every_token_alike_whatever_its_trajectorys_length():
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.float32)
    w = token_weights(mask, "seq_sum", action_tokens=20, trajectories=4, seq_sum_tokens=8)
    assert torch.allclose(w[mask == 1], torch.full((6,), 1 / 32))  # 1 / (4 trajectories x 8 tokens)
    assert torch.all(w[mask == 0] == 0)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean"])
def test_token_weights_sum_to_one_over_ranks(mode):
    g = torch.Generator().manual_seed(1)
    full = (torch.rand(6, 9, generator=g) < 0.6).float()
    full[:, 0] = 1  # every trajectory has an action token
    ranks = [full[:2], full[2:3], full[3:]]
    total = sum(token_weights(r, mode, int(full.sum()), full.shape[0]).sum() for r in ranks)
    assert total.item() == pytest.approx(1.0, abs=1e-6)
