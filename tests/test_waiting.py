"""Waits on actors: progress lines while waiting, an error naming the late peers and the setting to raise."""
from __future__ import annotations

import sys
import time

import pytest
import ray

from lopd_ray.utils.waiting import DeadlineError, wait_all

pytestmark = pytest.mark.ray
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote(num_cpus=0)
def answer_after(seconds: float, value: int) -> int:
    time.sleep(seconds)
    return value


def test_a_late_peer_is_named_with_progress_lines_before_the_deadline(ray_cluster, capsys):
    refs = [answer_after.remote(0.0, 1), answer_after.remote(30.0, 2)]
    started = time.monotonic()
    with pytest.raises(DeadlineError) as info:
        wait_all(refs, 4.5, "startup of Things", ["Thing[0]", "Thing[1]"], setting="ray.startup_timeout_s",
                 log_every_s=1.0)
    assert time.monotonic() - started < 10
    assert "phase 'startup of Things' timed out after 4.5s waiting for ['Thing[1]']" in str(info.value)
    assert "raise ray.startup_timeout_s" in str(info.value)
    progress = [line for line in capsys.readouterr().err.splitlines() if "still waiting" in line]
    assert len(progress) >= 2 and all("['Thing[1]']" in line for line in progress)
    for ref in refs:
        ray.cancel(ref, force=True)


def test_answers_come_back_in_order(ray_cluster):
    refs = [answer_after.remote(0.3, 1), answer_after.remote(0.0, 2)]
    assert wait_all(refs, 30.0, "scores", ["a", "b"]) == [1, 2]


def test_a_progress_line_falling_due_between_two_clock_readings_never_asks_for_a_negative_timeout(monkeypatch):
    """The clock passes the next progress line after one wait returned early: the next wait gets 0, not < 0."""
    import lopd_ray.utils.waiting as waiting

    # start; a wait; back before the line is due (1.0); the loop's top just past it; back; past the deadline
    clock = iter([0.0, 0.5, 0.9, 1.1, 1.2, 4.5])
    monkeypatch.setattr(waiting.time, "monotonic", lambda: next(clock))
    timeouts = []

    def fake_wait(pending, num_returns, timeout):
        timeouts.append(timeout)
        return [], pending

    monkeypatch.setattr(waiting.ray, "wait", fake_wait)
    monkeypatch.setattr(waiting.ray, "get", lambda refs: [])
    with pytest.raises(DeadlineError):
        wait_all(["ref"], 4.0, "p", ["Peer[0]"], log_every_s=1.0)
    assert timeouts and min(timeouts) >= 0.0
