"""The composer's cold start with its entry and regression phases, in-process on the rules model: free latents per
entry learn each kind's hidden tag, the composer is regressed onto them, and after that its own latents give the
reference answers the low NLL that a guessed tag cannot (the NLL phase alone leaves them at a guess: the gate)."""
from __future__ import annotations

import math
import os

import pytest

from lopd_ray.bank.seeding import reference_entries
from lopd_ray.bank.traces import composer_input_text
from lopd_ray.config import load_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ["env.name=rules", "model.path=builtin:tiny-qwen3-rules", "composer.output_scale=token_embeddings",
          "composer.cold_start_entry_steps=120", "composer.cold_start_regression_steps=200",
          "composer.cold_start_lr=1e-4"]


def cold_started(overrides: list[str], examples_count: int = 32) -> dict[str, float]:
    from lopd_ray.envs import make_env
    from lopd_ray.models import resolve_model_path
    from lopd_ray.teacher.latent_worker import LatentTeacherWorker

    cfg = load_config(os.path.join(REPO, "recipes", "lopd_letters_cpu.yaml"), overrides)
    _, tasks = make_env(cfg.env)
    entries = reference_entries(tasks, range(48), cfg.bank)
    kinds = [tasks[i].meta["kind"] for i in range(48)]
    examples = []
    for i in range(examples_count):  # each task's first two other tasks of its kind, as the bank would retrieve them
        same = [j for j in range(48) if j != i and kinds[j] == kinds[i]][:2]
        examples.append({"task_index": i, "answer": tasks.reference_solution(i),
                         "retrieved_texts": [composer_input_text(entries[j]) for j in same]})
    return LatentTeacherWorker(cfg, resolve_model_path(cfg.model.path)).cold_start(examples, steps=1)


@pytest.mark.slow
def test_after_the_regression_the_composers_latents_carry_each_entrys_tag():
    stats = cold_started(PHASES)
    guess = math.log(8) / 7  # the tag's 1-in-8 guess spread over the answer's 7 tokens
    assert stats["cold_start/entry_nll_first"] > 0.8 * guess
    assert stats["cold_start/entry_nll_last"] < 0.05
    assert stats["cold_start/regression_last"] < stats["cold_start/regression_first"] / 10
    # the first NLL step measures the regressed composer before it moves
    assert stats["cold_start/nll_first"] < 0.3 * guess


def test_the_phases_step_at_their_own_learning_rate():
    short = [*PHASES, "composer.cold_start_entry_steps=4", "composer.cold_start_regression_steps=4"]
    still = cold_started([*short, "composer.cold_start_regression_lr=1e-12"], examples_count=8)
    moving = cold_started(short, examples_count=8)
    assert still["cold_start/regression_last"] == pytest.approx(still["cold_start/regression_first"], rel=0.05)
    assert moving["cold_start/regression_last"] < 0.9 * moving["cold_start/regression_first"]
