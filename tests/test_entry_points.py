"""Every command goes through the one start-up path: the same bad config gets the same one-line `config error:`
from each of them, with exit code 2, before Ray or any actor starts."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RECIPE = "recipes/lopd_letters_cpu.yaml"
ENTRY_POINTS = {
    "train": ["-m", "lopd_ray.train", RECIPE],
    "eval": ["-m", "lopd_ray.eval", "--model", "builtin:tiny-qwen3", "--bench", "envscaler"],
    "build_bank": ["-m", "lopd_ray.build_bank", RECIPE, "--out", "unused"],
    "cold_start": ["-m", "lopd_ray.cold_start", RECIPE, "--out", "unused.pt"],
    "build_model": ["-m", "lopd_ray.build_model", RECIPE],
    "benchmark": ["benchmarks/step_throughput.py", RECIPE],
}
# Found past the schema (by the registry check), so it exercises the whole path up to the cluster.
BAD_OVERRIDE, EXPECTED = "rollout.engine=sglang", "rollout.engine='sglang' is not registered"


def run(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ADDRESS="")
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_every_entry_point_rejects_a_bad_config_with_the_same_line():
    lines = {}
    for name, args in ENTRY_POINTS.items():
        proc = run([*args, BAD_OVERRIDE])
        assert proc.returncode == 2, f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        stderr = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(stderr) == 1 and stderr[0].startswith("config error: "), f"{name}: {proc.stderr[-2000:]}"
        assert EXPECTED in stderr[0], f"{name}: {stderr[0]}"
        output = (proc.stdout + proc.stderr).lower().replace("lopd_ray", "")
        assert "ray" not in output and "actor" not in output, f"{name} started something: {output[-500:]}"
        lines[name] = stderr[0]
    assert len(set(lines.values())) == 1, lines


@pytest.mark.slow
def test_a_key_the_env_never_reads_is_refused_by_train_and_the_bank_build():
    """letters has one size (env.letters.num_tasks): env.limit would be ignored, so it is refused."""
    for name in ("train", "build_bank"):
        proc = run([*ENTRY_POINTS[name], "env.limit=16"])
        stderr = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(stderr) == 1, f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        assert stderr[0].startswith("config error: env.limit=16 is never read by env.name=letters: remove it"), stderr


@pytest.mark.slow
def test_check_builds_no_model_and_says_what_a_run_would_build_first(tmp_path):
    """With an empty model cache, the agentic recipe's check reads SmolLM2's tokenizer from its GGUF and builds
    nothing: the cache stays empty, and the console says what a run would build."""
    cache = tmp_path / "cache"
    cache.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ADDRESS="", LOPD_RAY_CACHE=str(cache))
    proc = subprocess.run([sys.executable, "-m", "lopd_ray.train", "recipes/lopd_agentic.yaml", "--check",
                           f"run.output_dir={tmp_path / 'runs'}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(cache.iterdir()) == [] and not (tmp_path / "runs").exists()
    assert proc.stderr.strip() == ""  # no library warning, no progress bar
    assert proc.stdout.strip().splitlines() == [
        f"The config checks out: a run would write to {tmp_path / 'runs' / 'lopd_agentic'} and ask Ray for 1.7 CPUs "
        f"and 5 GPUs. It would first build builtin:smollm2-135m-instruct, not built yet (`python -m "
        f"lopd_ray.build_model model.path=builtin:smollm2-135m-instruct` builds it now)."]


def test_a_cluster_address_where_nothing_answers_is_one_config_error_not_a_hang():
    from lopd_ray.config import ConfigError
    from lopd_ray.startup import check_reachable

    with pytest.raises(ConfigError, match=r"^RAY_ADDRESS=127.0.0.1:9: no Ray cluster answers there"):
        check_reachable("127.0.0.1:9", "RAY_ADDRESS")  # the discard port: nothing listens
    check_reachable("auto", "ray.address")  # left to Ray's own resolution


@pytest.mark.ray
def test_without_an_address_a_run_starts_its_own_cluster_never_the_one_ray_recorded(ray_cluster):
    """The test head (started with `ray start`) is the cluster Ray recorded on this machine; a command without
    ray.address or RAY_ADDRESS must not join it."""
    head = ray_cluster.get_runtime_context().gcs_address
    code = ("from lopd_ray.config import load_config; from lopd_ray.startup import connect_ray; import ray; "
            "connect_ray(load_config('recipes/grpo_letters_cpu.yaml')); "
            "print(ray.get_runtime_context().gcs_address); ray.shutdown()")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(env, OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    own = proc.stdout.strip().splitlines()[-1]
    assert own and own != head, (own, head)
