"""`python -m lopd_ray.cold_start` writes phi_0, and a teacher given `composer.init_path` starts from it."""
from __future__ import annotations

import os

import pytest
import torch

from lopd_ray.config import load_config
from lopd_ray.cli.cold_start import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "lopd_letters_cpu.yaml")


@pytest.mark.ray
def test_cold_start_command_writes_the_phi_a_teacher_starts_from(ray_cluster, tiny_model_dir, tmp_path):
    from lopd_ray.teacher.latent_worker import LatentTeacherWorker

    out = str(tmp_path / "phi0.pt")
    common = [f"model.path={tiny_model_dir}", "bank.seed_references=16"]
    assert main([RECIPE, "--out", out, "composer.cold_start_steps=3", *common]) == 0
    phi0 = torch.load(out, weights_only=True)
    fresh = LatentTeacherWorker(load_config(RECIPE, common), tiny_model_dir).composer.phi_state_dict()
    assert sorted(phi0) == sorted(fresh)
    assert any(not torch.equal(phi0[k], fresh[k]) for k in phi0)  # the cold start moved phi
    started = LatentTeacherWorker(load_config(RECIPE, [*common, f"composer.init_path={out}"]), tiny_model_dir)
    assert all(torch.equal(v, phi0[k]) for k, v in started.composer.phi_state_dict().items())
    assert main([RECIPE, "--out", out, "composer.cold_start_steps=0", *common]) == 2  # said before any work
