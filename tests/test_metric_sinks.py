"""run.loggers: every sink receives every step's metrics, read back from what it wrote under the run directory."""
from __future__ import annotations

import struct

import pytest

from lopd_ray.config import load_config
from lopd_ray.errors import ConfigError
from lopd_ray.preflight import check_registries
from lopd_ray.utils.metrics import MetricsLogger

STEPS = [{"rollout/reward_mean": 0.25 * s, "lopd/kl": 1.0 / (s + 1)} for s in range(3)]


def wandb_history(path) -> list[dict]:
    """The history rows of an offline .wandb file: a 7-byte header, then LevelDB-log records (32 KiB blocks; each
    record a 7-byte header of crc, length and type: full, first, middle, last) holding wandb's protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    raw, pos, pending, rows = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(raw):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        pending, pos = pending + raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4) and pending:
            record = wandb_internal_pb2.Record.FromString(pending)
            if record.WhichOneof("record_type") == "history":
                keys_and_values = [(item.key or "/".join(item.nested_key), item.value_json)
                                   for item in record.history.item]
                rows.append({key: float(value) for key, value in keys_and_values if not key.startswith("_")})
            pending = b""
    return rows


def test_tensorboard_wandb_and_mlflow_each_hold_every_step(tmp_path):
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = MetricsLogger(str(tmp_path), ["tensorboard", "wandb", "mlflow"], 0, {"learner.lr": 0.001})
    for step, metrics in enumerate(STEPS):
        logger.log(step, metrics)
    logger.close()

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("lopd/kl")] == [(s, pytest.approx(m["lopd/kl"]))
                                                                      for s, m in enumerate(STEPS)]
    (wandb_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    assert wandb_history(wandb_file) == [pytest.approx(m) for m in STEPS]
    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'mlflow'}")
    (run,) = client.search_runs([client.get_experiment_by_name("lopd_ray").experiment_id])
    assert run.data.params == {"learner.lr": "0.001"}
    history = client.get_metric_history(run.info.run_id, "rollout/reward_mean")
    assert [(m.step, m.value) for m in history] == [(s, m["rollout/reward_mean"]) for s, m in enumerate(STEPS)]


def test_an_unknown_logger_is_a_config_error():
    with pytest.raises(ConfigError, match="run.loggers: 'neptune' is not registered"):
        check_registries(load_config(None, ["run.loggers=[tensorboard,neptune]"]))
