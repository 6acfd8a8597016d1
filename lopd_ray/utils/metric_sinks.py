"""Where a run's per-step metrics go besides metrics.jsonl, chosen by `run.loggers`. Each writes under the run
directory and needs no server: TensorBoard event files, Weights & Biases in offline mode (`wandb sync` uploads it
later), an MLflow store in a local directory (`mlflow ui --backend-store-uri <run>/mlflow`)."""
from __future__ import annotations

import os
import time


class TensorBoardSink:
    def __init__(self, run_dir: str, name: str, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(run_dir, "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: str, name: str, config: dict):
        import wandb

        self.run = wandb.init(project="lopd_ray", name=name, dir=run_dir, mode="offline", config=config,
                              settings=wandb.Settings(console="off", silent=True))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    def __init__(self, run_dir: str, name: str, config: dict):
        import mlflow

        # MLflow 3 keeps its directory store only behind this opt-in; the database stores need the full package.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = mlflow.MlflowClient(tracking_uri="file:" + os.path.join(run_dir, "mlflow"))
        experiment = self.client.get_experiment_by_name("lopd_ray")
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("lopd_ray")
        self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        for key, value in config.items():
            self.client.log_param(self.run_id, key, str(value)[:500])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(key, float(value), now, step) for key, value in metrics.items()]
        self.client.log_batch(self.run_id, metrics=rows)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


METRIC_SINKS = {"tensorboard": TensorBoardSink, "wandb": WandbSink, "mlflow": MlflowSink}
# The package each sink imports: checked before the run starts.
SINK_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
