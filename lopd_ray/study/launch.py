"""Where a study's runs run: here, each in a process of its own (`Local`), or as Ray jobs on a cluster (`Jobs`,
through the Job Submission API of the address given), uploading the folder the study runs in as the job's working
directory (less JOB_UPLOAD_EXCLUDES), so that the runs import the same code and the user's own envs."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from typing import Optional

from lopd_ray.errors import ConfigError
from lopd_ray.study.spec import RunSpec
from lopd_ray.utils.runtime import job_runtime_env

# A job's states once it has ended (ray.job_submission.JobStatus's values).
ENDED = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 1}
PROBE_TIMEOUT_S = 300.0


class Local:
    """Each run as `python -m lopd_ray.train ...` in a process of this machine; no resource bound of its own."""

    where = "here"

    def capacity(self) -> Optional[dict[str, float]]:
        return None

    def start(self, run: RunSpec, log_path: str):
        with open(log_path, "a") as log:
            return subprocess.Popen([sys.executable, *run.command], stdout=log, stderr=subprocess.STDOUT)

    def exit_code(self, process, log_path: str) -> Optional[int]:
        return process.poll()


class Jobs:
    """Each run as a Ray job of the cluster whose job API is `address` (http://HOST:DASHBOARD_PORT)."""

    def __init__(self, address: str):
        from ray.job_submission import JobSubmissionClient

        try:
            self.client = JobSubmissionClient(address)
        except Exception as exc:  # Ray's own errors span several lines
            raise ConfigError(f"--address {address}: no Ray job API answers there ({str(exc).splitlines()[0]}); give "
                              f"the dashboard's address, e.g. the JOB_ADDRESS that cluster/start_head.sh records") \
                from None
        self.where = address
        self.runtime_env = job_runtime_env(os.getcwd())

    def submit(self, argv: list[str], name: str) -> str:
        return self.client.submit_job(entrypoint=shlex.join(["python", *argv]), runtime_env=self.runtime_env,
                                      submission_id=f"{name}-{uuid.uuid4().hex[:8]}")

    def capacity(self) -> dict[str, float]:
        """The cluster's CPUs and GPUs, as a job on it sees them."""
        probe = "import json, ray; ray.init(); print('RESOURCES', json.dumps(ray.cluster_resources()))"
        job = self.submit(["-c", probe], "resources")
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while self.client.get_job_status(job).value not in ENDED:
            if time.monotonic() > deadline:
                raise ConfigError(f"--address {self.where}: a job asking the cluster's resources did not end in "
                                  f"{PROBE_TIMEOUT_S:g} s: see `ray job logs {job}`")
            time.sleep(1.0)
        logs = self.client.get_job_logs(job)
        line = next((line for line in logs.splitlines() if line.startswith("RESOURCES ")), None)
        if line is None:
            raise ConfigError(f"--address {self.where}: a job asking the cluster's resources failed: "
                              f"{logs.strip().splitlines()[-1] if logs.strip() else 'no output'}")
        resources = json.loads(line[len("RESOURCES "):])
        return {"CPU": resources.get("CPU", 0.0), "GPU": resources.get("GPU", 0.0)}

    def start(self, run: RunSpec, log_path: str) -> str:
        inside = os.path.relpath(run.recipe)  # the recipe as the uploaded folder has it, where it is in it
        recipe = run.recipe if inside.startswith("..") else inside
        return self.submit(["-m", "lopd_ray.train", recipe, *run.overrides], f"study-{run.run_id}")

    def exit_code(self, job: str, log_path: str) -> Optional[int]:
        status = self.client.get_job_status(job).value
        if status not in ENDED:
            return None
        with open(log_path, "a") as log:
            log.write(self.client.get_job_logs(job))
        return ENDED[status]
