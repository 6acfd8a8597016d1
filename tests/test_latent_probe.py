"""The latent probe: latents trained in the teacher's latent block by the cold start's loss carry what they were
trained to carry (free per-kind latents take the rules teacher from a guessed tag to every held-out answer), and an
unknown reader is refused by name."""
from __future__ import annotations

from pathlib import Path

import pytest

from lopd_ray.errors import ConfigError
from lopd_ray.study.latent_probe import run_probe

LOPD = str(Path(__file__).resolve().parent.parent / "recipes" / "lopd_letters_cpu.yaml")
RULES = ["env.name=rules", "model.path=builtin:tiny-qwen3-rules", "eval.tasks=16"]


@pytest.mark.slow
def test_trained_latents_in_the_latent_block_teach_the_teacher_each_kinds_tag():
    result = run_probe(LOPD, RULES, steps=30, readers=["per_kind_table"])
    curve = result["readers"]["per_kind_table"]
    assert [point["step"] for point in curve] == [0, 6, 12, 18, 24, 30]
    # 8 kinds, one tag each: before training the teacher guesses (1 in 8 at most for a fixed guess), after it reads
    assert curve[0]["held_out_exact"] <= 0.25
    assert curve[-1]["held_out_exact"] >= 0.9
    assert curve[-1]["held_out_nll"] < curve[0]["held_out_nll"] / 10


def test_an_unknown_reader_is_refused_naming_the_readers():
    with pytest.raises(ConfigError, match="unknown reader 'perceiver'.*per_kind_table"):
        run_probe(LOPD, RULES, steps=1, readers=["perceiver"])
