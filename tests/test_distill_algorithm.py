"""The distillation algorithm's per-token loss, for every registered loss: zero on tool-output tokens, finite in
fp32 and bf16, the RL term mixed in by weight, and the teacher diagnostics."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lopd_ray.algorithms import make_algorithm
from lopd_ray.algorithms.distill_diagnostics import topm_entropy
from lopd_ray.algorithms.distill_losses import DISTILL_LOSSES, SAMPLED_LOSSES
from lopd_ray.algorithms.losses import clipped_pg
from lopd_ray.config import AlgorithmConfig, DistillConfig
from lopd_ray.data.trajectory import Trajectory

# Every registered loss, and the top-M divergences on the renormalized support and with the per-token cap.
ALL_LOSSES = ([(name, {}) for name in sorted({**DISTILL_LOSSES, **SAMPLED_LOSSES})]
              + [(name, {"tail": False}) for name in sorted(DISTILL_LOSSES)]
              + [(name, {"pointwise_clip": 0.05}) for name in sorted(DISTILL_LOSSES)])


def batch_of(dtype, seed=0):
    """B=2, T=5, M=3: row 0 has a tool output at columns 2-3 (loss_mask 0), row 1 no teacher signal at all."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    teacher_full = torch.log_softmax(torch.randn(2, 5, 8, generator=g, dtype=torch.float64), -1)
    top = teacher_full.topk(3, dim=-1)
    loss_mask = torch.tensor([[1, 1, 0, 0, 1], [1, 1, 1, 1, 1]], dtype=torch.float64)
    distill_mask = loss_mask * torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    student = torch.log_softmax(logits, -1)
    sampled = torch.randint(0, 8, (2, 5), generator=g)
    batch = {"loss_mask": loss_mask, "distill_mask": distill_mask, "teacher_topm_logprobs": top.values,
             "teacher_logprobs": teacher_full.gather(-1, sampled[..., None])[..., 0],
             "advantages": torch.tensor([[1.0] * 5, [-0.5] * 5], dtype=torch.float64)}
    logp = student.gather(-1, sampled[..., None])[..., 0]
    topm = student.gather(-1, top.indices)
    return {k: v.to(dtype) for k, v in batch.items()}, logp.to(dtype), topm.to(dtype)


def algorithm(**distill):
    return make_algorithm(AlgorithmConfig(name="distill", distill=DistillConfig(**distill)))


@pytest.mark.parametrize("loss,options", ALL_LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_loss_is_finite_and_masked(loss, options, dtype):
    batch, logp, topm = batch_of(dtype)
    logp.requires_grad_(True)
    topm.requires_grad_(True)
    loss_BT, metrics = algorithm(loss=loss, **options).token_loss(batch, logp, logp.detach(), None,
                                                                  student_topm_BTM=topm)
    assert loss_BT.shape == (2, 5) and torch.isfinite(loss_BT.float()).all()
    assert (loss_BT[batch["distill_mask"] == 0] == 0).all()  # tool outputs and samples without a teacher
    assert (loss_BT[0, [0, 1, 4]] != 0).any()
    loss_BT.float().sum().backward()
    student_grads = [g for g in (logp.grad, topm.grad) if g is not None]
    assert student_grads and all(torch.isfinite(g.float()).all() for g in student_grads)
    assert all((g[batch["distill_mask"] == 0] == 0).all() for g in student_grads)
    assert all(torch.isfinite(v.float()).all() for v in metrics.values())


def test_the_rl_term_is_mixed_in_by_weight():
    batch, logp, topm = batch_of(torch.float64)
    old = logp.detach() - 0.1
    pg, _ = clipped_pg(logp, old, batch["advantages"], 0.2, 0.28)
    only_distill, _ = algorithm().token_loss(batch, logp, old, None, student_topm_BTM=topm)
    mixed, metrics = algorithm(rl_coef=0.5, distill_coef=0.25).token_loss(batch, logp, old, None,
                                                                          student_topm_BTM=topm)
    torch.testing.assert_close(mixed, 0.25 * only_distill + 0.5 * pg)
    assert "actor/clipfrac" in metrics


def test_the_same_batch_gives_the_same_loss():
    def once():
        batch, logp, topm = batch_of(torch.float32, seed=3)
        return algorithm(loss="jsd_topm_tail").token_loss(batch, logp, logp, None, student_topm_BTM=topm)[0]

    assert torch.equal(once(), once())


def scored(reward: float, group: int, teacher_sampled_p: float) -> Trajectory:
    t = Trajectory("t", group, [1], [2, 3, 4], [1, 0, 1], [(0, 1), (2, 3)], [0.0] * 3, 0, reward=reward)
    t.teacher_logprobs = np.full(3, math.log(teacher_sampled_p), dtype=np.float32)
    t.teacher_topm_ids = np.zeros((3, 2), dtype=np.int64)
    t.teacher_topm_logprobs = np.log(np.array([[0.5, 0.5]] * 3, dtype=np.float32))
    t.teacher_entropy = topm_entropy(t.teacher_topm_logprobs)
    return t


def test_prepare_drops_samples_without_context_unless_an_rl_term_needs_them():
    with_signal = [scored(1.0, 0, 0.5), scored(0.0, 0, 0.25)]
    bare = Trajectory("t", 0, [1], [2], [1], [(0, 1)], [0.0], 0, reward=0.0)
    kept, stats = algorithm().prepare(with_signal + [bare])
    assert kept == with_signal and stats["distill/no_context_samples"] == 1.0
    # Top-2 of (0.5, 0.5) leaves the tail its floor: entropy ln 2; the sampled-token probability is averaged over
    # action tokens (2 per trajectory).
    assert stats["distill/teacher_entropy_topm"] == pytest.approx(math.log(2), abs=1e-4)
    assert stats["distill/teacher_sampled_prob"] == pytest.approx((0.5 + 0.25) / 2, abs=1e-6)
    kept, _ = algorithm(rl_coef=1.0).prepare(with_signal + [bare])
    assert kept == with_signal + [bare]
    rewards = np.array([1.0, 0.0, 0.0])
    expected = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)
    assert [float(t.advantages[0]) for t in kept] == pytest.approx(expected.tolist())
    assert float(kept[0].advantages[1]) == 0.0  # observation tokens carry no advantage


def test_h2sd_routing_rl_on_successes_distillation_on_failures_and_teacher_weighted_credit():
    success, failure = scored(1.0, 0, 0.5), scored(0.0, 0, 0.25)
    success.teacher_logprobs = np.log(np.array([0.8, 0.5, 0.2], dtype=np.float32))  # token 1 is a tool output
    kept, _ = algorithm(rl_coef=1.0, route="by_outcome", success_threshold=0.9,
                        rl_token_weight="teacher_prob").prepare([success, failure])
    assert kept == [success, failure]
    assert success.distill_weights.tolist() == [0.0, 0.0, 0.0] and failure.distill_weights is None  # the loss mask
    assert failure.advantages.tolist() == [0.0, 0.0, 0.0]
    group = (1.0 - 0.5) / (np.std([1.0, 0.0], ddof=1) + 1e-6)
    # Weights: p / mean over action tokens of p = (0.8, 0.2) / 0.5.
    np.testing.assert_allclose(success.advantages, [group * 1.6, 0.0, group * 0.4], rtol=1e-5)


def test_the_context_decomposition_separates_what_the_context_adds_from_what_the_teacher_knows():
    from lopd_ray.algorithms.distill_diagnostics import context_decomposition

    t = scored(1.0, 0, 0.5)  # teacher with context: ln .5 on every token; token 1 is a tool output
    t.teacher_plain_logprobs = np.log(np.array([0.25, 0.9, 0.125], dtype=np.float32))
    t.rollout_logprobs = np.log(np.array([0.5, 0.9, 0.5], dtype=np.float32))
    stats = context_decomposition([t])
    # context: ln(.5/.25) = ln 2 and ln(.5/.125) = ln 4 -> mean 1.5 ln 2; own: ln(.25/.5), ln(.125/.5) -> -1.5 ln 2
    assert stats["distill/context_gain"] == pytest.approx(1.5 * math.log(2), abs=1e-5)
    assert stats["distill/teacher_own_gap"] == pytest.approx(-1.5 * math.log(2), abs=1e-5)
    assert stats["distill/context_share"] == pytest.approx(0.5, abs=1e-5)
    assert context_decomposition([scored(1.0, 0, 0.5)]) == {}  # not asked for: nothing logged


def test_dopd_distills_only_where_the_teacher_beats_the_privileged_student():
    t = scored(1.0, 0, 0.5)  # teacher: ln .5 on every token; token 1 is a tool output
    t.privileged_logprobs = np.log(np.array([0.25, 0.1, 0.75], dtype=np.float32))
    algo = algorithm(route="privilege_gap", privilege_gap_min=0.0)
    assert algo.makes("privileged_logprobs") and not algorithm().makes("privileged_logprobs")
    kept, stats = algo.prepare([t, scored(0.0, 0, 0.25)])  # the second was not scored by the privileged student
    # token 0: the teacher beats the privileged student by ln 2; token 2: it loses by ln 1.5
    assert t.distill_weights.tolist() == [1.0, 0.0, 0.0]
    assert kept[1].distill_weights.tolist() == [0.0, 0.0, 0.0]
    assert stats["distill/privilege_gap_mean"] == pytest.approx((math.log(2) - math.log(1.5)) / 2, abs=1e-5)
    assert stats["distill/privileged_token_share"] == 0.5
    algorithm(route="privilege_gap", privilege_gap_min=1.0).prepare([t])  # ln 2 < 1 nat: nothing is distilled
    assert t.distill_weights.tolist() == [0.0, 0.0, 0.0]
    # the light regime: the tokens the context alone explains keep a small weight, tool outputs none
    algorithm(route="privilege_gap", privilege_gap_min=0.0, privilege_light_weight=0.25).prepare([t])
    assert t.distill_weights.tolist() == [1.0, 0.0, 0.25]
    t.privileged_logprobs = t.teacher_logprobs.copy()  # a self-teacher before the first update: no gap anywhere
    algorithm(route="privilege_gap", privilege_gap_min=0.05, privilege_light_weight=0.25).prepare([t])
    assert t.distill_weights.tolist() == [0.25, 0.0, 0.25]


def test_token_selection_keeps_the_top_fraction_of_action_tokens_by_entropy_or_divergence():
    # The engine's log-probs (its sampling settings applied) would rank token 0 first; the student's own at the
    # distillation temperature (-1 everywhere) rank token 1 first.
    t = Trajectory("t", 0, [1], [2, 3, 4, 5, 6], [1, 1, 0, 1, 1], [(0, 2), (3, 5)], [-3.0, -3.0, -9.0, -1.5, -3.0],
                   0, reward=1.0)
    t.own_logprobs = np.full(5, -1.0, dtype=np.float32)
    # Teacher top-2 + tail entropies: (.6, .39, .01) 0.72 nats, (.5, .5) ln 2, (.9, .05, .05) and (.98, .01, .01)
    # less; token 2, a tool output, would have the highest of all.
    probs = [[0.9, 0.05], [0.5, 0.5], [0.34, 0.33], [0.98, 0.01], [0.6, 0.39]]
    t.teacher_entropy = topm_entropy(np.log(np.array(probs, dtype=np.float32)))
    t.teacher_logprobs = np.array([-1.0, -3.0, -9.0, -1.5, -1.2], dtype=np.float32)  # |gap| 0, 2, (8), .5, .2
    algorithm(token_selection="teacher_entropy", token_keep_fraction=0.5).prepare([t])
    assert t.distill_weights.tolist() == [0.0, 1.0, 0.0, 0.0, 1.0]  # entropies ln 2 and 0.72: the top 2 of 4
    algorithm(token_selection="divergence", token_keep_fraction=0.25).prepare([t])
    assert t.distill_weights.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    algorithm(token_selection="divergence", token_keep_fraction=0.1).prepare([t])  # at least one token
    assert t.distill_weights.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    algorithm().prepare([t])
    assert t.distill_weights is None  # every action token: the learner reads the loss mask


def graded(level_sampled: list[list[float]], student: list[float], loss_mask: list[int]) -> Trajectory:
    """A trajectory scored at len(level_sampled) reveal levels: the teacher's log-prob of each sampled token per
    level; its top-M ids name the level (id = level) so the chosen level of each token can be read back."""
    n = len(student)
    t = Trajectory("t", 0, [1], list(range(2, 2 + n)), loss_mask, [(0, n)], student, 0, reward=1.0)
    t.own_logprobs = np.asarray(student, dtype=np.float32)
    levels = len(level_sampled)
    ids = np.stack([np.full((n, 2), k, dtype=np.int64) for k in range(levels)])
    t.level_topm_ids, t.teacher_topm_ids = ids[:-1], ids[-1]  # as the learner fetches them
    t.level_topm_logprobs = np.log(np.full((levels - 1, n, 2), 0.5, dtype=np.float32))
    t.teacher_topm_logprobs = np.log(np.full((n, 2), 0.5, dtype=np.float32))
    sampled = np.array(level_sampled, dtype=np.float32)
    t.level_logprobs, t.teacher_logprobs = sampled[:-1], sampled[-1]  # the weaker levels, then the teacher's own
    t.level_entropy, t.teacher_entropy = np.zeros((levels - 1, n), dtype=np.float32), np.zeros(n, dtype=np.float32)
    return t


def test_a_teacher_equal_to_the_student_shows_no_gap_whatever_the_engine_sampled_with():
    from lopd_ray.algorithms.distill import TOKEN_SELECTIONS
    from lopd_ray.algorithms.usd import choose_levels

    # Teacher == student at every level: the student's own log-probs at the distillation temperature. The engine's
    # log-probs, taken after temperature 0.7 and top-p, sit 0.35 nats higher (the mean gap measured with usd_agentic's
    # sampling settings): read as the student's, they were a divergence on every token.
    own = [-1.2, -0.4, -2.5, -0.9]
    t = graded([own, own, own], own, [1, 1, 0, 1])
    t.rollout_logprobs = np.asarray(own, dtype=np.float32) + 0.35
    np.testing.assert_array_equal(TOKEN_SELECTIONS["divergence"](t), np.zeros(4))
    level, keep, difficulty = choose_levels(t, multiplier=0.0)
    assert keep.tolist() == [0.0] * 4 and difficulty.tolist() == [0.0] * 4  # nothing to learn, at any level


def test_usd_picks_a_level_and_tokens_by_one_multiplier_and_moves_it_by_dual_ascent():
    from lopd_ray.algorithms.usd import USD
    from lopd_ray.config import USDConfig

    # Levels 0 (framing alone), 1, 2 (the whole solution); the student's log-prob when it sampled is -1 everywhere.
    # token 0: D = (0, 1, 3), C = (0, 1, 3); token 1: D = (0.5, 2, 2.5), C = (0, 1.5, 2); token 2: D = (2, 2, 2),
    # C = 0; token 3 is a tool output.
    levels = [[-1.0, -1.5, -3.0, -1.0], [-2.0, -3.0, -3.0, -1.0], [-4.0, -3.5, -3.0, -9.0]]
    cfg = AlgorithmConfig(name="usd", distill=DistillConfig(), usd=USDConfig(difficulty_budget=0.5, dual_lr=0.5))
    algo = USD(cfg)
    t = graded(levels, [-1.0] * 4, [1, 1, 1, 0])
    _, stats = algo.prepare([t])
    algo.complete_targets(t)
    # lambda 0: the revealed level of the largest D (ties: the weakest), every action token kept
    assert t.teacher_topm_ids[:, 0].tolist() == [2, 2, 1, 2] and t.distill_weights.tolist() == [1, 1, 1, 0]
    assert t.teacher_logprobs.tolist() == [-4.0, -3.5, -3.0, -9.0]
    # difficulty of the kept tokens (3 + 2 + 0) over 3 action tokens; lambda <- 0 + 0.5 * (5/3 - 0.5)
    assert stats["usd/difficulty"] == pytest.approx(5 / 3) and stats["usd/lambda"] == 0.0
    assert algo.multiplier == pytest.approx(0.5 * (5 / 3 - 0.5))
    algo.multiplier = 1.2  # D - 1.2 C on levels 1, 2: token 0 (-0.2, -0.6) -> dropped; token 1 (0.2, 0.1) -> level 1
    t = graded(levels, [-1.0] * 4, [1, 1, 1, 0])
    _, stats = algo.prepare([t])
    algo.complete_targets(t)
    assert t.distill_weights.tolist() == [0, 1, 1, 0] and t.teacher_topm_ids[1:3, 0].tolist() == [1, 1]
    assert stats["usd/selected_share"] == pytest.approx(2 / 3) and stats["usd/level_mean"] == 0.5
    # difficulty (1.5 + 0) / 3 = 0.5, the budget: lambda stays
    assert algo.multiplier == pytest.approx(1.2 + 0.5 * (0.5 - 0.5))
    resumed = USD(cfg)
    resumed.load_state_dict(algo.state_dict())
    assert resumed.multiplier == algo.multiplier


def test_update_alignment_is_the_cosine_of_the_students_change_with_each_part_of_the_supervision():
    from lopd_ray.algorithms.distill_diagnostics import update_alignment

    t = scored(1.0, 0, 0.5)  # teacher with context: ln .5 everywhere; token 1 is a tool output
    t.teacher_plain_logprobs = np.log(np.array([0.25, 0.9, 0.5], dtype=np.float32))  # context part: ln 2, -, 0
    t.student_logprobs = np.log(np.array([0.25, 0.9, 0.25], dtype=np.float32))       # own part: 0, -, ln 2
    after = np.log(np.array([0.5, 0.1, 0.25], dtype=np.float32))                     # change: ln 2, -, 0
    stats = update_alignment([t], [after])
    assert stats["distill/update_align_context"] == pytest.approx(1.0, abs=1e-6)
    assert stats["distill/update_align_own"] == pytest.approx(0.0, abs=1e-6)
    after = np.log(np.array([0.25, 0.1, 0.5], dtype=np.float32))  # moved only where the teacher's own part points
    stats = update_alignment([t], [after])
    assert stats["distill/update_align_own"] == pytest.approx(1.0, abs=1e-6)
    assert stats["distill/update_align_context"] == pytest.approx(0.0, abs=1e-6)
    assert update_alignment([scored(1.0, 0, 0.5)], [after]) == {}  # no plain scores: nothing logged


def test_the_sampled_token_gap_is_split_by_token_class_where_the_env_tells_them_apart():
    from lopd_ray.algorithms.distill_diagnostics import gap_by_token_class

    t = Trajectory("t", 0, [1], [2, 3, 4, 5, 6], [1, 1, 0, 1, 1], [(0, 2), (3, 5)], [-1.0] * 5, 0, reward=1.0)
    t.teacher_logprobs = np.array([-3.0, -1.5, -9.0, -1.0, -2.0], dtype=np.float32)  # |gap| 2, .5, (8), 0, 1
    t.token_classes = np.array([1, 0, -1, 1, -1], dtype=np.int8)  # token 4: the env could not tell
    stats = gap_by_token_class([t])
    assert stats == {"distill/gap_syntax": pytest.approx(1.0), "distill/gap_content": pytest.approx(0.5),
                     "distill/syntax_token_share": pytest.approx(2 / 3)}
    t.token_classes = np.full(5, -1, dtype=np.int8)
    assert gap_by_token_class([t]) == {}


# SDPO's JSD (alpha 0.5) on a top-1 + tail support: student (0.5, tail 0.5), teacher (0.25, tail 0.75), mixture
# (0.375, 0.625), by hand.
SDPO_JSD = (0.5 * (0.25 * math.log(0.25 / 0.375) + 0.75 * math.log(0.75 / 0.625))
            + 0.5 * (0.5 * math.log(0.5 / 0.375) + 0.5 * math.log(0.5 / 0.625)))  # 0.0337


@pytest.mark.parametrize("recipe", ["sdpo_agentic.yaml", "sdpo_letters_cpu.yaml"])
def test_sdpo_weights_its_divergence_by_the_clipped_importance_ratio_as_its_official_code(recipe):
    from lopd_ray.algorithms.losses import token_weights
    from lopd_ray.config import load_config

    cfg = load_config(str(Path(__file__).parents[1] / "recipes" / recipe)).algorithm
    assert (cfg.distill.loss, cfg.distill.jsd_beta, cfg.distill.is_clip, cfg.distill.importance_weighted,
            cfg.distill.tail_clamp, cfg.loss_agg) == (
        "jsd_topm_tail", 0.5, 2.0, True, "sdpo", "token_mean")  # SDPO's verl config: alpha 0.5, is_clip 2, token-mean
    algo = make_algorithm(cfg)
    # One sample, 4 tokens, the last a tool output; ratios p_S / p_S_old of 3 (clipped at 2), 0.5 and 1.
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    batch = {"loss_mask": mask, "distill_mask": mask,
             "teacher_topm_logprobs": torch.full((1, 4, 1), math.log(0.25), dtype=torch.float64)}
    student_topm = torch.full((1, 4, 1), math.log(0.5), dtype=torch.float64, requires_grad=True)
    logp = torch.full((1, 4), math.log(0.5), dtype=torch.float64, requires_grad=True)
    old = logp.detach() - torch.tensor([[math.log(3.0), math.log(0.5), 0.0, 0.0]], dtype=torch.float64)
    weights = token_weights(mask, cfg.loss_agg, action_tokens=3, trajectories=1)
    loss_BT, metrics = algo.token_loss(batch, logp, old, None, student_topm_BTM=student_topm)
    torch.testing.assert_close(loss_BT, torch.tensor([[2.0 * SDPO_JSD, 0.5 * SDPO_JSD, SDPO_JSD, 0.0]],
                                                     dtype=torch.float64))
    assert float((loss_BT * weights).sum().detach()) == pytest.approx(SDPO_JSD * (2.0 + 0.5 + 1.0) / 3, rel=1e-12)
    assert float((metrics["distill/student_kl"] * weights).sum()) == pytest.approx(SDPO_JSD, rel=1e-12)
    (loss_BT * weights).sum().backward()
    assert logp.grad is None  # the ratio is a weight: no gradient flows through it
    assert student_topm.grad[0, 0, 0] == pytest.approx(4.0 * student_topm.grad[0, 1, 0], rel=1e-12)  # 2 vs 0.5
    # On-policy (p_S_old = p_S) the ratio is 1 and the loss is the unweighted divergence.
    on_policy, _ = algo.token_loss(batch, logp, logp.detach(), None, student_topm_BTM=student_topm)
    assert float((on_policy * weights).sum().detach()) == pytest.approx(SDPO_JSD, rel=1e-12)


@pytest.mark.parametrize("recipe", ["lopd_letters_cpu.yaml", "opsd_letters_cpu.yaml", "sdft_letters_cpu.yaml",
                                    "dopd_letters_cpu.yaml", "opd_letters_cpu.yaml"])
def test_a_divergence_without_an_importance_ratio_in_its_definition_takes_none_off_policy(recipe):
    from lopd_ray.config import load_config

    cfg = load_config(str(Path(__file__).parents[1] / "recipes" / recipe), ["learner.updates_per_step=2"]).algorithm
    cfg.distill.rl_coef = 0.0  # the divergence alone (an RL term's PPO ratio is its own)
    batch, logp, topm = batch_of(torch.float64)
    old = logp.detach() - math.log(3.0)  # ratio 3 on every token: SDPO's weight would be min(3, is_clip) = 2
    off_policy, _ = make_algorithm(cfg).token_loss(batch, logp, old, None, student_topm_BTM=topm)
    on_policy, _ = make_algorithm(cfg).token_loss(batch, logp, logp.detach(), None, student_topm_BTM=topm)
    torch.testing.assert_close(off_policy, on_policy)
    cfg.distill.importance_weighted = True
    weighted, _ = make_algorithm(cfg).token_loss(batch, logp, old, None, student_topm_BTM=topm)
    torch.testing.assert_close(weighted, 2.0 * on_policy)


def test_usd_keeps_fewer_tokens_as_lambda_grows_even_where_the_framing_alone_leaves_a_gap():
    from lopd_ray.algorithms.usd import USD
    from lopd_ray.config import USDConfig

    # The student's log-prob when it sampled is -1; levels 0 (framing alone), 1, 2. Every token has D_0 > 0.
    # token 0: D = (0.5, 1, 3), C = (0, 0.5, 2.5): D_l / C_l of the revealed levels 2 and 1.2.
    # token 1: D = (0.2, 0.3, 0.4), C = (0, 0.1, 0.2): 3 and 2.
    # token 2: D = (0.5, 2, 0.5), C = (0, 2.5, 0): level 2 costs nothing, kept at any lambda.
    levels = [[-1.5, -1.2, -0.5], [-2.0, -1.3, -3.0], [-4.0, -1.4, -0.5]]
    chosen = {}
    for multiplier in (0.0, 2.5, 4.0):
        algo = USD(AlgorithmConfig(name="usd", distill=DistillConfig(), usd=USDConfig(lambda_init=multiplier)))
        t = graded(levels, [-1.0] * 3, [1, 1, 1])
        _, stats = algo.prepare([t])
        algo.complete_targets(t)
        chosen[multiplier] = (t.distill_weights.tolist(), t.teacher_topm_ids[:, 0].tolist(), stats)
    # lambda 0: every token, each at its largest revealed D (levels 2, 2, 1)
    assert chosen[0.0][:2] == ([1.0, 1.0, 1.0], [2, 2, 1])
    # lambda 2.5: token 0 (1 - 1.25, 3 - 6.25) < 0 dropped; token 1 (0.3 - 0.25, 0.4 - 0.5) at level 1; token 2 kept
    assert chosen[2.5][0] == [0.0, 1.0, 1.0] and chosen[2.5][1][1:] == [1, 2]
    # lambda 4: token 1 (0.3 - 0.4, 0.4 - 0.8) dropped too
    assert chosen[4.0][0] == [0.0, 0.0, 1.0]
    assert [chosen[m][2]["usd/selected_share"] for m in (0.0, 2.5, 4.0)] == pytest.approx([1.0, 2 / 3, 1 / 3])
    # the kept tokens' difficulty over the 3 action tokens: (2.5 + 0.2 + 2.5) / 3, then 0.1 / 3, then 0
    assert [chosen[m][2]["usd/difficulty"] for m in (0.0, 2.5, 4.0)] == pytest.approx([5.2 / 3, 0.1 / 3, 0.0],
                                                                                       abs=1e-6)
