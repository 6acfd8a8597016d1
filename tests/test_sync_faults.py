"""An actor lost inside a stage the design survives (docs/reliability.md) costs the run nothing: a rollout worker
dying in the weight sync (the collective broadcast, the object-store load), the sync probe or the held-out
evaluation is replaced by one holding the last weights pushed; a teacher that follows the student, dying in its
sync, is rebuilt and the push made again; the bank, dying in an add, is rebuilt with its entries and the add made
again. Each run ends with every step and the numbers of the same run without the fault."""
from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from conftest import REPO
from lopd_ray.config import load_config
from lopd_ray.study.runner import eval_rows
from lopd_ray.utils.metrics import read_metrics

pytestmark = pytest.mark.ray


@dataclass(frozen=True)
class Fault:
    recipe: str
    overrides: tuple[str, ...]
    group: str         # the Controller's ActorGroup attribute
    member: int
    path: str          # what the actor calls inside the stage: an attribute path on the actor
    call: int          # dies inside the call-th call of it that `when` accepts
    when: str = ""     # "" every call; "greedy" a greedy generation (the held-out evaluation); "probe" the probe's


GRPO = "grpo_letters_cpu.yaml"
# The weight sync over a collective, the probe after every sync, a held-out evaluation after every update.
WATCHED = ("sync.method=collective", "sync.probe_prompts=2", "sync.probe_max_new_tokens=5", "sync.probe_every=1",
           "eval.every_steps=1", "eval.split=train", "eval.tasks=4")
FAULTS = {
    "worker in the collective sync": Fault(GRPO, WATCHED, "workers", 1, "engine.receive_weights", 2),
    "worker in the object-store load": Fault(GRPO, ("sync.method=object_store",), "workers", 1, "engine.load_weights",
                                             2),
    "worker in the sync probe": Fault(GRPO, WATCHED, "workers", 0, "engine.generate", 2, "probe"),
    "worker in the held-out evaluation": Fault(GRPO, WATCHED, "workers", 1, "engine.generate", 2, "greedy"),
    "following teacher in its sync": Fault("opsd_letters_cpu.yaml", ("teacher.weights=live", "sync.method=collective"),
                                           "teachers", 0, "_follow", 2),
    "bank in an add": Fault("lopd_letters_cpu.yaml", ("composer.cold_start_steps=2",), "bank", 0, "_append", 2),
}
QUICK = ["rollout.engine=hf", "rollout.num_workers=2", "learner.num_learners=1", "train.prompts_per_step=4",
         "train.samples_per_prompt=2", "train.total_steps=3", "run.progress_bar=false", "run.loggers=[]",
         "run.checkpoint_every_steps=0", "run.export_student=false"]


def run(fault: Fault, tiny_model_dir: str, out_dir, inject: bool):
    import ray

    from lopd_ray.controller import Controller

    cfg = load_config(os.path.join(REPO, "recipes", fault.recipe),
                      [f"model.path={tiny_model_dir}", f"run.output_dir={out_dir}", "sync.probe_prompts=0", *QUICK,
                       *fault.overrides])
    controller = Controller(cfg)
    try:
        if inject:  # the function goes to the actor by value: it refers to nothing of this module
            *owners, name = fault.path.split(".")
            when, nth = fault.when, fault.call

            def die_inside(actor):
                owner = actor
                for attribute in owners:
                    owner = getattr(owner, attribute)
                original, due = getattr(owner, name), []

                def call_or_die(*args, **kwargs):
                    specs = args[1] if len(args) > 1 else None
                    if (when == "" or (when == "greedy" and specs[0].temperature == 0.0)
                            or (when == "probe" and specs[0].max_new_tokens == 5)):
                        due.append(1)
                        if len(due) == nth:
                            os._exit(1)
                    return original(*args, **kwargs)
                setattr(owner, name, call_or_die)
            group = getattr(controller, fault.group)
            ray.get(group[fault.member].__ray_call__.remote(die_inside))
        controller.run()
        restarts = getattr(controller, fault.group).restarts
    finally:
        controller.shutdown()
    return read_metrics(cfg.run_dir), eval_rows(cfg.run_dir), restarts


def numbers(rows: list[dict]) -> list[dict]:
    """What the fault must not change: all but timings, the sync's bookkeeping and the restart counts."""
    return [{k: v for k, v in row.items() if not k.startswith(("timing_s/", "sync/", "perf/"))
             and not k.endswith(("restarts", "seconds", "_ms"))} for row in rows]


@pytest.fixture(scope="module")
def clean_runs(tmp_path_factory, tiny_model_dir):
    """The run without a fault, once per recipe and overrides."""
    runs = {}

    def clean(fault: Fault):
        key = (fault.recipe, fault.overrides)
        if key not in runs:
            runs[key] = run(fault, tiny_model_dir, tmp_path_factory.mktemp("clean"), inject=False)
        return runs[key]
    return clean


@pytest.mark.parametrize("name", list(FAULTS))
def test_an_actor_lost_inside_a_survived_stage_leaves_the_run_unchanged(name, ray_cluster, tiny_model_dir, tmp_path,
                                                                        clean_runs):
    fault = FAULTS[name]
    faulted, faulted_eval, restarts = run(fault, tiny_model_dir, tmp_path, inject=True)
    clean, clean_eval, _ = clean_runs(fault)
    assert restarts == 1 and [r["step"] for r in faulted] == [0, 1, 2]
    differ = [(k, a[k], b.get(k)) for a, b in zip(numbers(faulted), numbers(clean)) for k in a if a[k] != b.get(k)]
    assert not differ and len(faulted) == len(clean) and numbers(faulted_eval) == numbers(clean_eval)
