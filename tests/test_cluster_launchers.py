"""The cluster launchers (cluster/ray_up.yaml, cluster/kuberay_rayjob.yaml, cluster/slurm.sbatch) run the agentic
LOPD recipe with outputs on storage that outlives the job, Ray without token auth, and at least the CPUs and GPUs
the recipe asks for (counted by the project's own config loading). Read, never run: no cluster starts here."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lopd_ray.config import load_config
from lopd_ray.preflight import training_resources

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "cluster"
RECIPE = "recipes/lopd_agentic.yaml"
ENTRYPOINT = ["python", "-m", "lopd_ray.train", RECIPE]


@pytest.fixture(scope="module")
def need() -> dict[str, float]:
    return training_resources(load_config(str(REPO / RECIPE)))


def test_the_recipe_asks_for_five_gpus(need):
    """Its comment says so: rollout workers, learners and the teacher take one GPU each, the bank none."""
    assert need["GPU"] == 5


def test_the_guide_lists_what_each_gpu_recipe_asks_for():
    """docs/cluster.md's table: every agentic recipe and the code recipe, with the numbers their configs give."""
    rows = re.findall(r"^\| ((?:`\w+\.yaml`(?:, )?)+) \| [^|]+ \| ([\d.]+) \| ([\d.]+) \|$",
                      (REPO / "docs" / "cluster.md").read_text(), re.M)
    listed = {name: {"CPU": float(cpu), "GPU": float(gpu)}
              for names, cpu, gpu in rows for name in re.findall(r"`(\w+\.yaml)`", names)}
    recipes = [p.name for p in sorted((REPO / "recipes").glob("*_agentic.yaml"))] + ["lopd_code.yaml"]
    assert sorted(listed) == sorted(recipes)
    for name in recipes:
        assert listed[name] == training_resources(load_config(str(REPO / "recipes" / name))), name


def training_command(text: str) -> tuple[list[str], dict[str, str]]:
    """The words of the one training command in `text` (continuation lines joined) and its key=value overrides."""
    lines = [line for line in text.replace("\\\n", " ").splitlines() if "python -m lopd_ray.train" in line]
    assert len(lines) == 1, lines
    words = shlex.split(lines[0][lines[0].index("python -m lopd_ray.train"):])
    return words, dict(word.split("=", 1) for word in words if "=" in word)


def env_sh_sets_auth_off() -> bool:
    """What sourcing cluster/env.sh (the launchers' environment) sets RAY_AUTH_MODE to."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    out = subprocess.run(["bash", "-c", f"source {CLUSTER / 'env.sh'} && printf %s \"$RAY_AUTH_MODE\""],
                         env=dict(env, PYTHON=sys.executable), capture_output=True, text=True, check=True)
    return out.stdout == "disabled"


# --- ray up ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_up() -> dict:
    return yaml.safe_load((CLUSTER / "ray_up.yaml").read_text())


def test_ray_up_config_follows_rays_schema(ray_up):
    import jsonschema

    schema = Path(importlib.util.find_spec("ray").submodule_search_locations[0]) / "autoscaler" / "ray-schema.json"
    jsonschema.validate(ray_up, json.loads(schema.read_text()))
    assert ray_up["provider"]["type"] == "aws" and ray_up["head_node_type"] in ray_up["available_node_types"]


def test_ray_up_starts_the_recipes_resources_with_the_head(ray_up, need):
    """Workers counted at min_workers: the run checks the cluster's resources as it starts."""
    types = ray_up["available_node_types"]
    head = types[ray_up["head_node_type"]]
    workers = [t for name, t in types.items() if name != ray_up["head_node_type"]]
    assert sum(t.get("min_workers", 0) for t in workers) <= ray_up["max_workers"]
    for resource in ("CPU", "GPU"):
        offered = head["resources"].get(resource, 0) + sum(t.get("min_workers", 0) * t["resources"].get(resource, 0)
                                                           for t in workers)
        assert offered >= need[resource], (resource, offered, need[resource])


def test_ray_up_installs_the_mounted_checkout_and_starts_ray_without_token_auth(ray_up):
    checkout = [remote for remote, local in ray_up["file_mounts"].items() if (REPO / local).resolve() == REPO]
    assert len(checkout) == 1
    assert any(command.startswith(f"{checkout[0]}/cluster/install_gpu.sh") for command in ray_up["setup_commands"])
    starts = [c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in ray_up[key]
              if "ray start" in c]
    assert len(starts) == 2
    assert all(c.startswith(f"source {checkout[0]}/cluster/env.sh && ") for c in starts), starts
    assert env_sh_sets_auth_off()


def test_ray_up_submits_the_recipe_with_outputs_on_the_shared_mount(ray_up):
    """The command in the file's header: the client without token auth, outputs on the file system every node
    mounts (the host's mount, bound into each node's container)."""
    header = (CLUSTER / "ray_up.yaml").read_text()
    words, overrides = training_command(header)
    assert words[:4] == ENTRYPOINT
    output_dir = overrides["run.output_dir"]
    assert output_dir.startswith("/")
    submit = [line for line in header.splitlines() if "ray job submit" in line]
    assert len(submit) == 1 and "RAY_AUTH_MODE=disabled ray job submit" in submit[0]
    assert any(re.search(rf"mount -t \S+ .* {re.escape(output_dir)}\)", c) for c in ray_up["initialization_commands"])
    assert f"-v {output_dir}:{output_dir}" in ray_up["docker"]["run_options"]


# --- KubeRay ----------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kuberay() -> dict:
    documents = list(yaml.safe_load_all((CLUSTER / "kuberay_rayjob.yaml").read_text()))
    return {doc["kind"]: doc for doc in documents}


def pods(job: dict) -> list[tuple[int, dict]]:
    """(replicas, pod spec) of the head, each worker group and the job's submitter."""
    cluster = job["spec"]["rayClusterSpec"]
    return [(1, cluster["headGroupSpec"]["template"]["spec"]),
            *[(group["replicas"], group["template"]["spec"]) for group in cluster["workerGroupSpecs"]],
            (1, job["spec"]["submitterPodTemplate"]["spec"])]


def test_kuberay_job_runs_the_recipe_into_the_claim_and_then_deletes_its_cluster(kuberay):
    job, claim = kuberay["RayJob"], kuberay["PersistentVolumeClaim"]
    assert job["apiVersion"] == "ray.io/v1" and job["spec"]["shutdownAfterJobFinishes"] is True
    words, overrides = training_command(job["spec"]["entrypoint"])
    assert words[:4] == ENTRYPOINT
    output_dir = overrides["run.output_dir"]
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    for _, spec in pods(job)[:-1]:  # every Ray pod writes there
        volumes = {v["name"] for v in spec["volumes"]
                   if v.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"]}
        assert any(m["mountPath"] == output_dir and m["name"] in volumes for m in spec["containers"][0]["volumeMounts"])


def test_kuberay_cluster_has_exactly_the_recipes_gpus_and_enough_cpus(kuberay, need):
    ray_pods = pods(kuberay["RayJob"])[:-1]
    limits = [(replicas, c["resources"]["limits"]) for replicas, spec in ray_pods for c in spec["containers"]]
    assert sum(replicas * int(lim.get("nvidia.com/gpu", 0)) for replicas, lim in limits) == need["GPU"]
    assert sum(replicas * float(lim["cpu"]) for replicas, lim in limits) >= need["CPU"]
    for group in kuberay["RayJob"]["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        assert group["minReplicas"] == group["replicas"] == group["maxReplicas"]


def test_kuberay_every_container_runs_without_token_auth(kuberay):
    containers = [c for _, spec in pods(kuberay["RayJob"]) for c in spec["containers"]]
    assert len(containers) == 3
    for container in containers:
        assert {"name": "RAY_AUTH_MODE", "value": "disabled"} in container["env"], container["name"]


# --- SLURM ------------------------------------------------------------------------------------------------------------

SBATCH = CLUSTER / "slurm.sbatch"


@pytest.fixture(scope="module")
def sbatch() -> tuple[str, dict[str, str]]:
    text = SBATCH.read_text()
    return text, dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))


def test_slurm_script_parses():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)


def test_slurm_allocation_holds_the_recipes_resources(sbatch, need):
    _, options = sbatch
    nodes = int(options["nodes"])
    assert options["ntasks-per-node"] == "1"  # one Ray node per SLURM node, with every CPU of the task
    assert nodes * int(options["gpus-per-node"]) >= need["GPU"]
    assert nodes * int(options["cpus-per-task"]) >= need["CPU"]


def test_slurm_runs_the_recipe_on_its_ray_head_into_the_submit_dir(sbatch):
    text, _ = sbatch
    words, overrides = training_command(text)
    assert words[:4] == ENTRYPOINT
    assert overrides["run.output_dir"].startswith("$SLURM_SUBMIT_DIR/")  # absolute, on the shared file system
    head = overrides["ray.address"]  # the address the head starts on, which the workers join
    assert re.search(rf'^{head[1:]}=".+:\$RAY_HEAD_PORT"', text, re.M)
    assert re.search(rf'ray start --head --node-ip-address="\${{{head[1:]}%:\*}}" --port="\$RAY_HEAD_PORT"', text)
    assert f'ray start --address="{head}"' in text
    assert re.search(r"^trap .*cluster/stop\.sh", text, re.M)


def test_slurm_starts_ray_without_token_auth(sbatch):
    lines = sbatch[0].splitlines()
    first_start = next(i for i, line in enumerate(lines) if "ray start" in line)
    assert "source cluster/env.sh" in lines[:first_start]
    assert env_sh_sets_auth_off()


def test_submit_prints_its_usage_on_help_and_submits_nothing_without_a_recipe():
    script = str(REPO / "cluster" / "submit.sh")
    shown = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and "Usage: cluster/submit.sh RECIPE.yaml [key=value ...]" in shown.stdout
    bare = subprocess.run([script], capture_output=True, text=True, timeout=30)
    assert bare.returncode == 2 and "Usage:" in bare.stderr and not bare.stdout
