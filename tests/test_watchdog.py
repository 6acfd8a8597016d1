"""The step watchdog: a driver that marks progress is left alone however long it runs; one without progress for
timeout_s is interrupted (also in a blocking call) knowing the step and the stage; one that does not take the
interrupt is ended after grace_s with one line."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from lopd_ray.utils.timing import StageTimer
from lopd_ray.utils.watchdog import StepWatchdog, mark_progress


def test_progress_keeps_the_watchdog_quiet_and_a_stall_is_interrupted_naming_the_stage():
    with StepWatchdog(timeout_s=1.0, poll_s=0.05) as watchdog:
        mark_progress(step=4)
        timer = StageTimer()
        for _ in range(4):  # 2 s of stages of 0.5 s each: never 1 s without progress
            with timer("rollout"):
                time.sleep(0.5)
        assert not watchdog.fired
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            with timer("learn"):
                time.sleep(30)  # blocked in a system call, as a driver in ray.get
        waited = time.monotonic() - started
    assert watchdog.fired and 1.0 <= waited < 5.0, waited
    assert watchdog.where() == "step 4, stage 'learn'"


def test_a_driver_that_does_not_take_the_interrupt_is_ended_with_one_line():
    code = ("import time; from lopd_ray.utils.watchdog import StepWatchdog, mark_progress\n"
            "with StepWatchdog(timeout_s=0.5, grace_s=1.0, poll_s=0.05):\n"
            "    mark_progress('sync_weights', 7)\n"
            "    while True:\n"
            "        try:\n"
            "            time.sleep(60)\n"
            "        except KeyboardInterrupt:\n"
            "            pass\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "step stalled: no progress for run.step_timeout_s=0.5s at step 7, stage 'sync_weights', and the driver did "
        "not stop within 1s of its interrupt; the actors' logs are under the run's logs/"]
