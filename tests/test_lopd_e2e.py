"""LOPD with every actor live on the local Ray cluster; a restart resumes the student, the composer, both
optimizers, beta and the bank from the last checkpoint."""
from __future__ import annotations

import os
import sys

import pytest
import ray
import torch

from lopd_ray.config import load_config
from lopd_ray.controller import Controller
from lopd_ray.utils.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUERIES = ["Reply with the letter 'a' repeated 5 times.", "Reply with the letter 'b' repeated 7 times."]
pytestmark = pytest.mark.ray
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def optimizer_moments(actor) -> list[torch.Tensor]:
    """Runs inside a learner or teacher actor: Adam's first moments of its DeepSpeed engine."""
    optimizer = actor.engine.optimizer
    base = getattr(optimizer, "optimizer", optimizer)
    return [state["exp_avg"].clone() for state in base.state.values()]


def phi_state(teacher) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in teacher.composer.phi_state_dict().items()}


def snapshot(controller: Controller) -> dict:
    teacher, learner = controller.teachers[0], controller.learners[0]
    exports = ray.get([l.export_weights.remote() for l in controller.learners])
    found = ray.get(controller.bank.retrieve.remote(QUERIES, 2, [None, None]))
    return {"beta": ray.get(teacher.get_beta.remote()), "phi": ray.get(teacher.__ray_call__.remote(phi_state)),
            "composer_moments": ray.get(teacher.__ray_call__.remote(optimizer_moments)),
            "student_moments": ray.get(learner.__ray_call__.remote(optimizer_moments)),
            "student": exports[0]["checksums"], "bank_size": ray.get(controller.bank.size.remote()),
            "retrieved": [[e.entry_id for e in entries] for entries in found]}


def test_lopd_runs_every_actor_and_resumes_everything(ray_cluster, tiny_model_dir, tmp_path):
    overrides = [f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path}", "run.progress_bar=false",
                 "run.tensorboard=false", "rollout.num_workers=1", "train.prompts_per_step=4",
                 "train.samples_per_prompt=2", "run.checkpoint_every_steps=1", "composer.cold_start_steps=2",
                 "algorithm.lopd.margin=10.0", "bank.success_threshold=0.3",
                 "rollout.engine=hf"]  # the vLLM engine runs in test_training_e2e, test_job_submit, test_vllm_engine
    recipe = os.path.join(REPO, "recipes", "lopd_letters_cpu.yaml")
    cfg = load_config(recipe, ["train.total_steps=2", *overrides])
    controller = Controller(cfg)
    try:
        controller.run()
        before = snapshot(controller)
    finally:
        controller.shutdown()

    rows = read_metrics(cfg.run_dir)
    for key in ("lopd/kl", "lopd/delta", "lopd/beta", "lopd/margin_violation", "lopd/teacher_student_gap",
                "bank/size", "bank/hit_rate", "bank/retrieve_ms", "timing_s/context", "timing_s/score_teacher",
                "timing_s/update_composer", "sync/logprob_diff_max"):
        assert all(key in row for row in rows), key
    assert before["beta"] > 0 and before["bank_size"] >= cfg.bank.seed_references

    resumed = Controller(load_config(recipe, ["train.total_steps=3", "run.resume=auto", *overrides]))
    try:
        assert resumed.start_step == 2
        after = snapshot(resumed)
    finally:
        resumed.shutdown()
    assert after["beta"] == before["beta"]
    assert after["student"] == before["student"]
    assert after["bank_size"] == before["bank_size"] and after["retrieved"] == before["retrieved"]
    assert sorted(after["phi"]) == sorted(before["phi"])
    assert all(torch.equal(after["phi"][k], before["phi"][k]) for k in before["phi"])
    for name in ("composer_moments", "student_moments"):
        assert len(after[name]) == len(before[name]) > 0
        assert all(torch.equal(a, b) for a, b in zip(after[name], before[name])), name

