"""A run kept at a URI (here file://, through fsspec as s3:// or gs:// would be): complete checkpoints go up before
the pointer to them, pruned ones are removed there too, every other file follows, and a resume with nothing staged
fetches the run down and continues from its newest intact checkpoint."""
from __future__ import annotations

import filecmp
import os

import pytest

from lopd_ray.config import load_config
from lopd_ray.errors import ConfigError
from lopd_ray.startup import resolve_output_dir
from lopd_ray.utils.checkpoint import CheckpointManager
from lopd_ray.utils.run_storage import RunStorage

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "grpo_letters_cpu.yaml")


def write_part(text: str):
    def write_parts(directory: str) -> None:
        os.makedirs(os.path.join(directory, "student"))
        with open(os.path.join(directory, "student", "weights.bin"), "w") as f:
            f.write(text)
    return write_parts


def same_tree(a: str, b: str) -> bool:
    files = lambda root: sorted(os.path.relpath(os.path.join(d, n), root) for d, _, ns in os.walk(root) for n in ns)
    return files(a) == files(b) and all(filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False)
                                        for f in files(a))


def test_checkpoints_go_up_whole_pruned_ones_go_and_a_fetch_resumes_from_the_newest(tmp_path):
    staged, remote = tmp_path / "staged", tmp_path / "remote"
    storage = RunStorage(f"file://{remote}", str(staged))
    checkpoints = CheckpointManager(str(staged), keep=2)
    for step in (1, 2):
        checkpoints.save(step, write_part(f"weights {step}"), {"next_step": step})
    (staged / "metrics.jsonl").write_text('{"step": 0}\n')
    storage.upload()
    assert same_tree(staged, remote)
    checkpoints.save(3, write_part("weights 3"), {"next_step": 3})  # prunes step_1 here
    (staged / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    storage.upload()
    assert same_tree(staged, remote) and not (remote / "checkpoints" / "step_1").exists()

    fresh = tmp_path / "fresh"
    assert RunStorage(f"file://{remote}", str(fresh)).download()
    assert same_tree(fresh, remote)
    assert CheckpointManager(str(fresh)).resolve("auto") == str(fresh / "checkpoints" / "step_3")
    assert not RunStorage(f"file://{tmp_path / 'nothing'}", str(tmp_path / "x")).download()


def test_start_up_fetches_a_run_to_resume_and_refuses_a_uri_it_cannot_reach(tmp_path):
    remote = tmp_path / "remote"
    overrides = [f"run.output_dir=file://{remote}", f"run.staging_dir={tmp_path / 'staging'}"]
    cfg = load_config(RECIPE, overrides)
    assert cfg.run_dir == str(tmp_path / "staging" / cfg.run.name)
    assert cfg.run_uri == f"file://{remote}/{cfg.run.name}"
    CheckpointManager(str(remote / cfg.run.name)).save(4, write_part("w"), {"next_step": 4})
    resolve_output_dir(cfg)  # run.resume=auto with nothing staged: the run comes down
    assert CheckpointManager(cfg.run_dir).resolve("auto") == os.path.join(cfg.run_dir, "checkpoints", "step_4")

    off = load_config(RECIPE, [f"run.output_dir=file://{remote}", f"run.staging_dir={tmp_path / 'other'}",
                               "run.resume=off"])
    resolve_output_dir(off)  # a fresh start fetches nothing
    assert not os.path.exists(off.run_dir)
    with pytest.raises(ConfigError, match=r"run.output_dir='nosuchscheme://bucket/runs': no filesystem"):
        resolve_output_dir(load_config(RECIPE, ["run.output_dir=nosuchscheme://bucket/runs"]))
