"""What a killed run leaves behind: a crash mid-save leaves `latest` on the last complete checkpoint, old
checkpoints are pruned to `run.keep_checkpoints`, and a metrics line cut short does not stop the resume. A checkpoint
damaged after it was written (a flipped byte, a truncated file, `latest` naming a deleted directory) is refused, and
`run.resume=auto` falls back to the newest intact one."""
from __future__ import annotations

import os

import pytest

from lopd_ray.errors import ConfigError
from lopd_ray.utils.checkpoint import CheckpointManager
from lopd_ray.utils.metrics import MetricsLogger, read_metrics


def write_marker(directory: str) -> None:
    with open(os.path.join(directory, "part.txt"), "w") as f:
        f.write(os.path.basename(directory))


def crash(directory: str) -> None:
    write_marker(directory)
    raise KeyboardInterrupt  # stands in for a kill between the actors' parts and the rename


def test_a_crash_mid_save_leaves_the_previous_checkpoint_pointed_to(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    manager.save(1, write_marker, {"next_step": 1})
    with pytest.raises(KeyboardInterrupt):
        manager.save(2, crash, {"next_step": 2})
    directory = manager.resolve("auto")
    assert directory.endswith("step_1")
    assert CheckpointManager.load_controller_state(directory) == {"next_step": 1}
    assert not os.path.exists(os.path.join(tmp_path, "checkpoints", "step_2"))
    manager.save(2, write_marker, {"next_step": 2})  # the leftover temporary directory does not get in the way
    assert manager.resolve("auto").endswith("step_2")


@pytest.mark.parametrize("keep,left", [(0, [1, 2, 3, 4]), (1, [4]), (2, [3, 4])])
def test_old_checkpoints_are_pruned(tmp_path, keep, left):
    manager = CheckpointManager(str(tmp_path), keep=keep)
    for step in (1, 2, 3, 4):
        manager.save(step, write_marker, {"next_step": step})
    names = sorted(n for n in os.listdir(os.path.join(tmp_path, "checkpoints")) if n.startswith("step_"))
    assert names == [f"step_{s}" for s in left]
    assert manager.resolve("auto").endswith("step_4")


def test_a_resaved_older_step_is_kept_as_latest(tmp_path):
    """After a resume from step 2 of 4, saving step 3 again must not prune the checkpoint `latest` names."""
    manager = CheckpointManager(str(tmp_path), keep=1)
    for step in (2, 4):
        manager.save(step, write_marker, {"next_step": step})
    manager.save(3, write_marker, {"next_step": 3})
    assert manager.resolve("auto").endswith("step_3")
    assert os.path.exists(os.path.join(manager.resolve("auto"), "part.txt"))


def write_weights(directory: str) -> None:
    os.makedirs(os.path.join(directory, "student"))
    with open(os.path.join(directory, "student", "weights.bin"), "wb") as f:
        f.write(bytes(range(256)) * 64)


def flip_a_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0x01]))


def truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(100)


DAMAGE = {"flipped byte": (flip_a_byte, "student/weights.bin", "corrupted"),
          "truncated file": (truncate, "student/weights.bin", "truncated"),
          "deleted file": (os.remove, "controller_state.pt", "is missing")}


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_checkpoint_is_refused_and_auto_falls_back_to_the_previous(tmp_path, kind, caplog):
    damage, name, said = DAMAGE[kind]
    manager = CheckpointManager(str(tmp_path), keep=2)
    for step in (1, 2):
        manager.save(step, write_weights, {"next_step": step})
    newest = os.path.join(tmp_path, "checkpoints", "step_2")
    damage(os.path.join(newest, name))
    with pytest.raises(ConfigError, match=said) as info:
        manager.resolve(newest)
    assert name in str(info.value) and "\n" not in str(info.value)
    assert manager.resolve("auto").endswith("step_1")
    assert "step_2 is damaged" in caplog.text


def test_latest_naming_a_deleted_checkpoint_falls_back_and_nothing_intact_is_an_error(tmp_path):
    import shutil

    manager = CheckpointManager(str(tmp_path), keep=2)
    for step in (1, 2):
        manager.save(step, write_weights, {"next_step": step})
    shutil.rmtree(os.path.join(tmp_path, "checkpoints", "step_2"))
    assert manager.resolve("auto").endswith("step_1")
    flip_a_byte(os.path.join(tmp_path, "checkpoints", "step_1", "student", "weights.bin"))
    with pytest.raises(ConfigError, match="no intact checkpoint under .*run.resume=off"):
        manager.resolve("auto")


def test_a_metrics_line_cut_short_is_dropped_on_resume(tmp_path):
    logger = MetricsLogger(str(tmp_path))
    for step in range(3):
        logger.log(step, {"loss": float(step)})
    logger.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "lo')  # the kill landed mid-write
    assert [row["step"] for row in read_metrics(str(tmp_path))] == [0, 1, 2]
    resumed = MetricsLogger(str(tmp_path), resume_step=2)
    resumed.log(2, {"loss": 5.0})
    resumed.close()
    assert read_metrics(str(tmp_path)) == [{"step": 0, "loss": 0.0}, {"step": 1, "loss": 1.0}, {"step": 2, "loss": 5.0}]


TORN = {"cut short": '{"step": 2, "di', "empty": "", "no dir": '{"step": 2}', "binary": "\x00\x07\x00"}


@pytest.mark.parametrize("kind", TORN)
def test_a_torn_latest_falls_back_to_the_newest_intact_checkpoint_saying_so_once(tmp_path, caplog, kind):
    manager = CheckpointManager(str(tmp_path), keep=0)
    for step in (1, 2, 3):
        manager.save(step, write_weights, {"next_step": step})
    flip_a_byte(os.path.join(tmp_path, "checkpoints", "step_3", "student", "weights.bin"))
    (tmp_path / "checkpoints" / "latest").write_text(TORN[kind])
    for _ in range(2):  # start-up's check, then the controller's restore
        assert manager.resolve("auto") == os.path.join(tmp_path, "checkpoints", "step_2")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert warnings[0].startswith(f"{tmp_path}/checkpoints/latest is torn (")
    assert warnings[0].endswith(f"resuming from {tmp_path}/checkpoints/step_2, the newest intact checkpoint")


@pytest.mark.slow
def test_train_check_on_a_torn_latest_says_the_fallback_in_one_line(tmp_path):
    import subprocess
    import sys

    manager = CheckpointManager(str(tmp_path / "torn"))
    for step in (1, 2):
        manager.save(step, write_weights, {"next_step": step})
    (tmp_path / "torn" / "checkpoints" / "latest").write_text('{"step": 2, "dir": "st')
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "lopd_ray.train", "recipes/grpo_letters_cpu.yaml", "--check",
                           f"run.output_dir={tmp_path}", "run.name=torn"], cwd=repo, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1", RAY_ADDRESS=""), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "latest is torn" in line]
    assert len(said) == 1 and said[0].endswith(f"resuming from {tmp_path}/torn/checkpoints/step_2, the newest "
                                               f"intact checkpoint"), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_save_removes_what_an_interrupted_save_left_behind(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    manager.save(1, write_weights, {"next_step": 1})
    # a learner that went on writing after the driver removed the partial checkpoint (or a driver killed mid-save)
    leftover = tmp_path / "checkpoints" / ".step_2.tmp-k3j9x2" / "student"
    leftover.mkdir(parents=True)
    (leftover / "mp_rank_00_model_states.pt").write_bytes(b"\0" * 4096)
    manager.save(2, write_weights, {"next_step": 2})
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["latest", "step_1", "step_2"]
