"""The teacher side's updates as functions of arrays: LOPD's composer terms and DualOPSD's teacher step, against
values worked out by hand (with |s - t| summed over the support as the divergence, to keep the arithmetic short)."""
import pytest
import torch

from lopd_ray.algorithms.distill import teacher_step_loss
from lopd_ray.algorithms.lopd import composer_terms

# two trajectories of two tokens, the second trajectory one token long; the support is one token (M = 1)
TEACHER_BTM1 = torch.tensor([[[-0.5, -1.0], [-0.2, -2.0]], [[-1.0, -0.3], [0.0, 0.0]]], dtype=torch.float64)
STUDENT_SAMPLED_BT = torch.tensor([[-1.0, -0.6], [-0.5, 0.0]], dtype=torch.float64)
STUDENT_TOPM_BTM = torch.tensor([[[-1.5], [-1.0]], [[-0.8], [0.0]]], dtype=torch.float64)
MASK_BT = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)


def absolute(student, teacher):
    return (student - teacher).abs().sum(-1)


def test_composer_terms_are_the_token_mean_divergence_and_the_signed_margin_violation():
    kl, margin, delta = composer_terms(TEACHER_BTM1, STUDENT_SAMPLED_BT, STUDENT_TOPM_BTM, MASK_BT,
                                       torch.tensor([1.0, -1.0], dtype=torch.float64), beta=2.0, margin=0.1,
                                       divergence=absolute)
    # delta: -0.5 - -1.0, -0.2 - -0.6; -1.0 - -0.5 (the padded token is masked out of every mean)
    assert delta[0].tolist() == pytest.approx([0.5, 0.4]) and delta[1, 0].item() == pytest.approx(-0.5)
    # divergence: (|-1.5 - -1.0| + |-1.0 - -2.0|) / 2 = 0.75; |-0.8 - -0.3| / 1 = 0.5
    assert kl.tolist() == pytest.approx([0.75, 0.5])
    # 2 * (0.1 - (+1) * 0.45) = -0.7 for the success; 2 * (0.1 - (-1) * (-0.5)) = -0.8 for the failure
    assert margin.tolist() == pytest.approx([-0.7, -0.8])


def test_a_violated_margin_pulls_the_teacher_up_on_a_success_and_down_on_a_failure():
    teacher = TEACHER_BTM1.clone().requires_grad_(True)
    _, margin, _ = composer_terms(teacher, STUDENT_SAMPLED_BT, STUDENT_TOPM_BTM, MASK_BT,
                                  torch.tensor([1.0, -1.0], dtype=torch.float64), 2.0, 0.1, absolute)
    margin.sum().backward()
    # d/d teacher[b, t, 0] of beta * (m - A_b * mean_t delta) = -beta * A_b / n_b on the trajectory's tokens
    assert teacher.grad[..., 0].flatten().tolist() == pytest.approx([-1.0, -1.0, 2.0, 0.0])
    assert teacher.grad[..., 1].abs().sum().item() == 0.0


def test_the_dual_teacher_step_is_the_divergence_summed_over_tokens_over_the_whole_batchs_tokens():
    loss = teacher_step_loss(STUDENT_TOPM_BTM, TEACHER_BTM1[..., 1:], MASK_BT, total_tokens=4.0, divergence=absolute)
    assert loss.item() == pytest.approx((0.5 + 1.0 + 0.5) / 4)  # the padded token counts nowhere
    assert teacher_step_loss(STUDENT_TOPM_BTM, TEACHER_BTM1[..., 1:], MASK_BT * 0, 0.0, absolute).item() == 0.0


def lopd(**lopd_fields):
    from lopd_ray.algorithms.lopd import LOPD
    from lopd_ray.config import AlgorithmConfig, LOPDConfig

    return LOPD(AlgorithmConfig(name="lopd", lopd=LOPDConfig(**lopd_fields)))


def test_lopd_holds_beta_on_the_driver_rising_below_the_margin_and_back_to_zero_above():
    algo = lopd(margin=0.05, dual_lr=0.5)
    assert algo.teacher_steps() == ("composer",) and algo.teacher_step_args("composer") == (0.0, 0.05)
    trace = []
    for measured in [0.0] * 4 + [0.2] * 6:
        metrics = algo.after_teacher_step("composer", {"lopd/delta": measured})
        trace.append(algo.beta)
        assert metrics["lopd/margin_violation"] == pytest.approx(max(0.0, 0.05 - measured))
    assert trace[:4] == pytest.approx([0.025, 0.05, 0.075, 0.1])  # 0.5 * (0.05 - 0) a step
    assert trace[4:6] == pytest.approx([0.025, 0.0]) and trace[-1] == 0.0  # 0.5 * (0.05 - 0.2) = -0.075 a step
    assert algo.teacher_step_args("composer") == (0.0, 0.05)
    assert algo.after_teacher_step("composer", {}) == {"lopd/beta": 0.0}  # no trajectory had experience
    resumed = lopd(margin=0.05)
    resumed.load_state_dict({**algo.state_dict(), "beta": 0.4})
    assert resumed.beta == 0.4
    assert lopd(margin_enabled=False).teacher_steps() == ()  # the frozen phi_0 ablation: no composer step


def test_a_relative_margin_keeps_a_share_of_the_first_measured_advantage():
    algo = lopd(margin=0.05, margin_ratio=0.5, dual_lr=1.0)
    assert algo.teacher_step_args("composer") == (0.0, 0.05)  # nothing measured yet
    first = algo.after_teacher_step("composer", {"lopd/delta": 0.3})
    assert first["lopd/margin"] == pytest.approx(0.15) and algo.beta == 0.0  # 0.3 clears it
    second = algo.after_teacher_step("composer", {"lopd/delta": 0.1})
    assert second["lopd/margin"] == pytest.approx(0.15)  # held from the first step, not measured again
    assert algo.beta == pytest.approx(0.05)  # 1.0 * (0.15 - 0.1)
    assert algo.teacher_step_args("composer") == (pytest.approx(0.05), pytest.approx(0.15))
    assert lopd(margin_ratio=0.5).state_dict() == {"beta": 0.0, "first_delta": None}
    absolute = lopd(margin=0.05)
    absolute.after_teacher_step("composer", {"lopd/delta": 0.3})
    assert absolute.after_teacher_step("composer", {"lopd/delta": 0.1})["lopd/margin"] == 0.05


def test_lopds_beta_and_usds_lambda_move_through_the_one_dual_ascent():
    from lopd_ray.algorithms import dual, lopd as lopd_module, usd

    assert lopd_module.dual_ascent is dual.dual_ascent and usd.dual_ascent is dual.dual_ascent
    assert dual.dual_ascent(0.1, 0.3, 0.5) == pytest.approx(0.25) and dual.dual_ascent(0.1, -0.5, 0.5) == 0.0
