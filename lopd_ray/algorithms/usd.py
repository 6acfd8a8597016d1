"""USD, known from its abstract only: the teacher sees the task's solution revealed at several levels
(`context.name=reveal`), and ONE dual variable lambda decides per token both how much of it the target may use and
whether the token trains at all: the revealed level l maximizing D_l - lambda * C_l, kept when that is positive, with
D_l the divergence left to learn on the sampled token (from the student's own log-prob at the distillation
temperature) and C_l how much of the teacher's view hinges on the revealed
part (learning difficulty). Dual ascent moves lambda so that the mean difficulty over action tokens meets a budget.

The weakest level (the framing alone) is the reference that C is measured from, not a target: its C is 0, so its
value D_0 > 0 would keep every token at every lambda; among the revealed levels a token trains only while
max_l D_l / C_l > lambda."""
from __future__ import annotations

import numpy as np

from lopd_ray.algorithms.distill import Distill
from lopd_ray.algorithms.dual import dual_ascent


def all_levels(weaker: np.ndarray, strongest: np.ndarray) -> np.ndarray:
    """[L, ...]: the weaker levels' arrays, then the strongest's (the teacher's own scores)."""
    return np.concatenate([weaker, strongest[None]])


def choose_levels(t, multiplier: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per response token: the chosen level's index (1 or more: a revealed level), whether the token is kept
    (action tokens only), and the chosen level's difficulty C."""
    sampled = all_levels(t.level_logprobs, t.teacher_logprobs).astype(np.float64)  # [L, R]
    gain = np.abs(sampled - t.own_logprobs)
    difficulty = np.abs(sampled - sampled[0])
    value = (gain - multiplier * difficulty)[1:]
    level = value.argmax(axis=0) + 1
    rows = np.arange(sampled.shape[1])
    keep = (value[level - 1, rows] > 0) & (t.loss_mask == 1)
    return level, keep.astype(np.float32), difficulty[level, rows]


def use_levels(t, level: np.ndarray) -> None:
    """The teacher's sampled-token log-prob and entropy of each token taken from its chosen level (the support and
    its log-probs follow on the learner: `USD.complete_targets`)."""
    rows = np.arange(len(level))
    t.teacher_logprobs, t.teacher_entropy = (all_levels(weaker, strongest)[level, rows] for weaker, strongest in (
        (t.level_logprobs, t.teacher_logprobs), (t.level_entropy, t.teacher_entropy)))
    t.teacher_level = level


class USD(Distill):
    required_context = "reveal"
    reads = Distill.reads + ("algorithm.usd",)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.multiplier = cfg.usd.lambda_init

    def scorers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(super().scorers() + ("teacher_levels", "student_own")))

    def prepare(self, trajs):
        choices = {}
        for t in trajs:
            if t.level_logprobs is not None:
                choices[id(t)] = choose_levels(t, self.multiplier)
                use_levels(t, choices[id(t)][0])
        kept, stats = super().prepare(trajs)
        tokens = difficulty = selected = level_sum = 0.0
        for t in kept:
            if id(t) in choices:
                level, keep, cost = choices[id(t)]
                t.distill_weights = (t.distill_weights if t.distill_weights is not None else t.loss_mask) * keep
                tokens += t.num_action_tokens
                difficulty += float((cost * keep).sum())
                selected += float(keep.sum())
                level_sum += float((level * keep).sum()) / max(len(t.level_logprobs), 1)
        measured = difficulty / max(tokens, 1.0)
        u = self.cfg.usd
        stats.update({"usd/lambda": self.multiplier, "usd/difficulty": measured,
                      "usd/selected_share": selected / max(tokens, 1.0),
                      "usd/level_mean": level_sum / max(selected, 1.0)})
        self.multiplier = dual_ascent(self.multiplier, measured - u.difficulty_budget, u.dual_lr)
        return kept, stats

    def complete_targets(self, t) -> None:
        if t.teacher_level is not None:
            rows = np.arange(len(t.teacher_level))
            t.teacher_topm_ids, t.teacher_topm_logprobs = (
                all_levels(weaker, strongest)[t.teacher_level, rows]
                for weaker, strongest in ((t.level_topm_ids, t.teacher_topm_ids),
                                          (t.level_topm_logprobs, t.teacher_topm_logprobs)))

    def state_dict(self) -> dict:
        return {"multiplier": self.multiplier}

    def load_state_dict(self, state: dict) -> None:
        self.multiplier = state.get("multiplier", self.multiplier)
