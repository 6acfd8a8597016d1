"""A cluster of three raylets on this host (ray.cluster_utils): the learner group's ranks do not fit one node, so
its placement group spreads them; the ranks rendezvous on the node of rank 0 (not the driver's), and a GRPO step
runs with the rollout workers spread over nodes. On simulated GPUs (nodes of 1 and 2), a tensor-parallel worker of
2 GPUs is placed on the 2-GPU node and one of 3 is refused. Runs in a process of its own: it is a different cluster
from the session's."""
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
from ray.util.placement_group import placement_group_table, remove_placement_group
from lopd_ray.actors import rollout_placement
from lopd_ray.config import ConfigError, load_config
from lopd_ray.controller import Controller
from lopd_ray.preflight import check_bundles_fit
from lopd_ray.startup import node_resources

model_dir, out_dir = sys.argv[1:3]
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})  # the driver's node: too small for a rank
gpu_nodes = {}
for gpus in (1, 2):                                                          # one learner rank each; simulated GPUs
    gpu_nodes[gpus] = cluster.add_node(num_cpus=2, num_gpus=gpus).node_id
ray.init(address=cluster.address, log_to_driver=False)
cfg = load_config("recipes/grpo_letters_cpu.yaml", [
    f"model.path={model_dir}", f"run.output_dir={out_dir}", "rollout.engine=hf", "rollout.num_workers=2",
    "rollout.placement=spread", "rollout.cpus_per_worker=0.3", "learner.num_learners=2", "learner.cpus_per_learner=1.4",
    "train.total_steps=1", "train.prompts_per_step=2", "train.samples_per_prompt=2", "run.progress_bar=false",
    "run.loggers=[]", "run.export_student=false", "run.checkpoint_every_steps=0", "sync.probe_prompts=2"])
node_of = lambda actor: ray.get(actor.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()))
controller = Controller(cfg)
try:
    controller.run()
    placed = {"driver": ray.get_runtime_context().get_node_id(), "learners": [node_of(a) for a in controller.learners],
              "rendezvous": controller.learners.rendezvous_node, "workers": [node_of(a) for a in controller.workers]}
finally:
    controller.shutdown()
# A tensor-parallel worker (2 GPUs) is one bundle on one node: only the 2-GPU node can hold it; 3 GPUs none.
sharded = load_config("recipes/grpo_letters_cpu.yaml", ["rollout.num_workers=1", "rollout.tensor_parallel_size=2",
                                                        "rollout.gpus_per_worker=2", "ray.startup_timeout_s=20"])
check_bundles_fit(sharded, ("rollout",), node_resources())
group, _ = rollout_placement(sharded)
table = placement_group_table(group)
placed.update(tp_bundle=table["bundles"][0], tp_node=table["bundles_to_node_id"][0], gpu_nodes=gpu_nodes)
remove_placement_group(group)
try:
    check_bundles_fit(load_config("recipes/grpo_letters_cpu.yaml", ["rollout.tensor_parallel_size=3",
                                                                    "rollout.gpus_per_worker=3"]), ("rollout",),
                      node_resources())
except ConfigError as exc:
    placed["tp3_error"] = str(exc)
rows = [json.loads(line) for line in open(cfg.run_dir + "/metrics.jsonl")]
print(json.dumps({**placed, "steps": [r["step"] for r in rows], "diff": rows[-1]["sync/logprob_diff_max"]}))
"""


def test_groups_placed_across_nodes_rendezvous_on_rank_0s_node_and_train(tiny_model_dir, tmp_path):
    env = dict(os.environ, RAY_ADDRESS="", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, tiny_model_dir, str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    placed = json.loads(proc.stdout.strip().splitlines()[-1])
    rank0, rank1 = placed["learners"]
    assert rank0 != rank1 and placed["driver"] not in (rank0, rank1)  # one rank per learner node
    assert placed["rendezvous"] == rank0                              # not the driver's node
    assert placed["steps"] == [0] and placed["diff"] < 1e-3           # a step, and the weights reach the workers
    assert len(set(placed["workers"])) == 2                           # rollout.placement=spread
    assert placed["tp_bundle"] == {"CPU": 0.3, "GPU": 2.0} and placed["tp_node"] == placed["gpu_nodes"]["2"]
    assert "no node of the cluster" in placed["tp3_error"]
