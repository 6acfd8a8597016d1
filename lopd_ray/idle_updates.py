"""A run that stops learning says so: `run.max_idle_updates` steps in a row without an update (nothing kept to train
on, every token weighted 0, or a non-finite gradient) end the run in one line naming the likeliest cause and the fix,
instead of a run that "trains" to its last step and exits 0."""
from __future__ import annotations

import math
from typing import Callable, Optional

from lopd_ray.errors import NotLearningError

Metrics = dict[str, float]


def made_update(metrics: Metrics) -> bool:
    """Whether the step's learners took an optimizer step that moved the weights."""
    norm = metrics.get("actor/grad_norm", 0.0)
    return not metrics.get("actor/skipped_update") and math.isfinite(norm) and norm > 0


def _all_groups_flat(m: Metrics, samples: int) -> Optional[str]:
    groups = m.get("grpo/groups", 0.0)
    if groups and m.get("grpo/zero_variance_groups") == groups:
        return (f"every group's samples got the same reward (grpo/zero_variance_groups {groups:.0f} of {groups:.0f}), "
                f"so every advantage is 0: start from a model that sometimes succeeds on this env (model.path), give "
                f"partial credit in the reward, or sample more per task (train.samples_per_prompt)")
    return None


def _no_context(m: Metrics, samples: int) -> Optional[str]:
    if samples and m.get("distill/no_context_samples", 0.0) >= samples:
        return (f"no sample had a teacher context (distill/no_context_samples {samples} of {samples}): give the "
                f"context provider its data (the tasks' reference solutions, a seeded bank, successful siblings) or "
                f"choose another context.name")
    return None


def _not_finite(m: Metrics, samples: int) -> Optional[str]:
    norm = m.get("actor/grad_norm", 0.0)
    if not math.isfinite(norm):
        return (f"the gradient norm was {norm} (actor/grad_norm), so the learners skipped the step: check the "
                f"model's weights (`python -m lopd_ray.train RECIPE --check`), lower learner.lr, or raise "
                f"learner.adam_eps")
    return None


def _zero_gradient(m: Metrics, samples: int) -> Optional[str]:
    if not m.get("actor/skipped_update") and m.get("actor/grad_norm") == 0.0:
        return ("the gradient was 0 (actor/grad_norm): every token's loss weight was 0 (the route or the token "
                "selection kept no token, or the teacher equals the student)")
    return None


# The causes, most specific first: (metrics of the step, samples in it) -> the cause and its fix, or None.
IDLE_CAUSES: tuple[Callable[[Metrics, int], Optional[str]], ...] = (_all_groups_flat, _no_context, _not_finite,
                                                                    _zero_gradient)
NOTHING_KEPT = "the algorithm kept no sample to train on (actor/skipped_update)"


class IdleUpdates:
    """Counts the steps in a row that made no update; `observe` raises NotLearningError at `limit` (0: never)."""

    def __init__(self, limit: int):
        self.limit, self.idle, self.made = limit, 0, 0

    def observe(self, step: int, metrics: Metrics, samples: int) -> None:
        if made_update(metrics):
            self.idle, self.made = 0, self.made + 1
            return
        self.idle += 1
        if self.limit and self.idle >= self.limit:
            cause = next((text for text in (cause(metrics, samples) for cause in IDLE_CAUSES) if text), NOTHING_KEPT)
            raise NotLearningError(
                f"no update in {self.idle} steps in a row (steps {step - self.idle + 1}-{step}; "
                f"run.max_idle_updates={self.limit}): {cause}. metrics.jsonl keeps every step; "
                f"run.max_idle_updates=0 trains on regardless")
