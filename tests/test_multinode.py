"""A cluster of three raylets on this host (ray.cluster_utils): the learner group's ranks do not fit one node, so
its placement group spreads them; the ranks rendezvous on the node of rank 0 (not the driver's), and a GRPO step
runs. Runs in a process of its own: it is a different cluster from the session's."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.ray

SCRIPT = """
import json, sys
import ray
from ray.cluster_utils import Cluster
from lopd_ray.config import load_config
from lopd_ray.controller import Controller

model_dir, out_dir = sys.argv[1:3]
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})  # the driver's node: too small for a rank
for _ in range(2):
    cluster.add_node(num_cpus=2)                                             # one learner rank each
ray.init(address=cluster.address, log_to_driver=False)
cfg = load_config("recipes/grpo_letters_cpu.yaml", [
    f"model.path={model_dir}", f"run.output_dir={out_dir}", "rollout.engine=hf", "rollout.num_workers=1",
    "rollout.cpus_per_worker=0.5", "learner.num_learners=2", "learner.cpus_per_learner=1.5",
    "train.total_steps=1", "train.prompts_per_step=2", "train.samples_per_prompt=2", "run.progress_bar=false",
    "run.loggers=[]", "run.export_student=false", "run.checkpoint_every_steps=0", "sync.probe_prompts=2"])
node_of = lambda actor: ray.get(actor.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()))
controller = Controller(cfg)
try:
    controller.run()
    placed = {"driver": ray.get_runtime_context().get_node_id(), "learners": [node_of(a) for a in controller.learners],
              "rendezvous": controller.learners.rendezvous_node}
finally:
    controller.shutdown()
rows = [json.loads(line) for line in open(cfg.run_dir + "/metrics.jsonl")]
print(json.dumps({**placed, "steps": [r["step"] for r in rows], "diff": rows[-1]["sync/logprob_diff_max"]}))
"""


def test_ranks_spread_over_nodes_rendezvous_on_rank_0s_node_and_train(tiny_model_dir, tmp_path):
    env = dict(os.environ, RAY_ADDRESS="", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, tiny_model_dir, str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    placed = json.loads(proc.stdout.strip().splitlines()[-1])
    rank0, rank1 = placed["learners"]
    assert rank0 != rank1 and placed["driver"] not in (rank0, rank1)  # one rank per learner node
    assert placed["rendezvous"] == rank0                              # not the driver's node
    assert placed["steps"] == [0] and placed["diff"] < 1e-3           # a step, and the weights reach the worker
