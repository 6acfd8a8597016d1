"""Shared fixtures: one local Ray cluster per test session, the tiny model built once, offline settings."""
from __future__ import annotations

import glob
import os

import pytest

from lopd_ray.utils.runtime import apply_runtime_env

apply_runtime_env()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from lopd_ray.models.tiny import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("models") / "tiny-qwen3"), arch="qwen3")


@pytest.fixture(scope="session", params=["tiny", "smollm2"])
def chat_tokenizer(request):
    """The project's two chat tokenizers: the tiny models' BPE and SmolLM2's (from its GGUF, no download)."""
    from transformers import AutoTokenizer

    if request.param == "tiny":
        from lopd_ray.models.tiny_tokenizer import ASSET_DIR
        return AutoTokenizer.from_pretrained(ASSET_DIR)
    from lopd_ray.models.gguf_convert import find_smollm2_gguf
    path = find_smollm2_gguf()
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def env_config(name: str, **fields):
    """An EnvConfig for env `name`: split, limit and data_dir at the top, every other field in the env's section."""
    import dataclasses

    from lopd_ray.config import EnvConfig

    common = {key: fields.pop(key) for key in ("split", "limit", "data_dir") if key in fields}
    cfg = EnvConfig(name=name, **common)
    return dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **fields)})


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recorded_head(cluster_dir: str) -> dict[str, str]:
    """What cluster/start_head.sh recorded of the head it started (HEAD_PID, HEAD_ADDRESS, JOB_ADDRESS, ...)."""
    with open(os.path.join(cluster_dir, "head.env")) as f:
        return dict(line.strip().split("=", 1) for line in f if "=" in line)


def head_address() -> str:
    """The test cluster's address (HOST:PORT), for a command's ray.address."""
    return recorded_head(os.environ["LOPD_RAY_CLUSTER_DIR"])["HEAD_ADDRESS"]


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A head node started by the project's own cluster script, on free ports and recorded in a folder of this
    session (so that other clusters on the machine, other test sessions' included, are left alone); the job-submit
    test submits to it too."""
    import subprocess

    import ray

    os.environ["LOPD_RAY_CLUSTER_DIR"] = str(tmp_path_factory.mktemp("cluster"))
    subprocess.run([os.path.join(REPO, "cluster", "start_head.sh"), "2"], check=True, capture_output=True)
    ray.init(address=head_address(), log_to_driver=False)
    yield ray
    ray.shutdown()
    subprocess.run([os.path.join(REPO, "cluster", "stop.sh")], check=False, capture_output=True)
    for path in glob.glob("/dev/shm/deepspeed_allreduce_buffer_*"):
        try:
            os.remove(path)
        except OSError:
            pass


@pytest.fixture(autouse=True)
def session_cluster_left_idle(request):
    """After a test on the session's cluster, no actor it started is left (within a grace period for the ones it
    killed) and no CPU stays held, or the next tests would wait on them: what is left is killed (not the detached
    actors of job submission), its placement groups removed, and a warning names the test."""
    yield
    if "ray_cluster" not in request.fixturenames:
        return
    import signal
    import time
    import warnings

    import ray
    from ray._private import state
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    job = ray.get_runtime_context().get_job_id()

    def left() -> list[dict]:
        return [info for info in state.actors().values()
                if info["State"] == "ALIVE" and not info["IsDetached"] and info["JobID"] == job]

    def held() -> float:
        return ray.cluster_resources().get("CPU", 0.0) - ray.available_resources().get("CPU", 0.0)
    deadline = time.monotonic() + 30
    while (left() or held() > 1e-6) and time.monotonic() < deadline:
        time.sleep(0.5)
    actors, cpus = left(), held()
    if not actors and cpus <= 1e-6:
        return
    actors = [info for info in state.actors().values() if info["State"] == "ALIVE" and not info["IsDetached"]]
    for info in actors:
        try:
            os.kill(info["Pid"], signal.SIGKILL)
        except OSError:
            pass
    for group_id, group in placement_group_table().items():
        if group["state"] == "CREATED":
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))
    warnings.warn(f"{request.node.nodeid} left {sorted(info['ActorClassName'] for info in actors)} on the session's "
                  f"cluster ({cpus:g} CPUs held): killed")


def kill(actor) -> None:
    """ray.kill, returning once the actor no longer answers."""
    import time

    import ray

    ray.kill(actor)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    raise AssertionError("the killed actor still answers")


def pytest_configure(config):
    config.addinivalue_line("markers", "ray: needs a Ray cluster, the session's or one of its own (slower; "
                                       "`make test-fast` leaves these out)")
    config.addinivalue_line("markers", "slow: runs a whole command or scores a model's gate (seconds each; "
                                       "`make test-fast` leaves these out)")


def pytest_collection_modifyitems(config, items):
    """A test that takes the session's cluster needs Ray, marked or not."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


def text_gate(env_name: str, model_path: str, tasks: int = 16):
    """The gate's text contexts scored on the first `tasks` held-out tasks of `env_name` (greedy, the LOPD letters
    recipe's settings): (results per context, the held-out task source)."""
    from lopd_ray.config import load_config
    from lopd_ray.envs import make_env
    from lopd_ray.models import resolve_model_path
    from lopd_ray.study.gate import _Head, probes, retrieve, score

    cfg = load_config(os.path.join(REPO, "recipes", "lopd_letters_cpu.yaml"),
                      [f"env.name={env_name}", f"model.path={model_path}", "rollout.max_new_tokens=8"])
    _, held = make_env(cfg.held_out_env)
    _, train = make_env(cfg.env)
    held_out = _Head(held, tasks)
    found = retrieve(cfg, held_out, train)
    return score(cfg, resolve_model_path(cfg.model.path), probes(cfg, held_out, train, found, with_latents=False),
                 held_out, None), held

