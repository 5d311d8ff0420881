"""The wait for one batch (``pipeline/batch_timeout.py``): derived from the slowest build measured so far with a
floor, so a frozen worker is named within about a minute (it was a fixed 10 minutes), with its pid and state."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from lightning_zerocopy.pipeline import batch_timeout
from lightning_zerocopy.pipeline.batch_timeout import FIRST_BATCH_S, FLOOR_S, BatchTimeout, process_state
from lightning_zerocopy.pipeline.client import PipelineClient, PipelineError


def test_the_limit_follows_the_slowest_build_with_a_floor_and_a_given_number_wins() -> None:
    derived = BatchTimeout()
    assert derived.seconds == FIRST_BATCH_S  # nothing measured yet: the worker's start, the first slots
    derived.record(0.05)
    assert derived.seconds == FLOOR_S == 60.0
    derived.record(4.0)
    derived.record(1.0)
    assert derived.seconds == 80.0 and "the slowest batch built so far (4.00 s)" in derived.describe()
    assert BatchTimeout(7.5).seconds == 7.5
    with pytest.raises(ValueError, match="positive number of seconds or None"):
        BatchTimeout(0)


class _SilentWorker:
    """A transport whose producer is alive (a real process, here stopped) and never answers."""

    interprocess = True
    starting = False

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def recv(self, timeout: float):
        time.sleep(min(timeout, 0.05))
        return None

    def check_alive(self, waiting_for: str) -> None:
        pass


def test_a_stopped_worker_is_named_with_its_pid_and_state(monkeypatch) -> None:
    monkeypatch.setattr(batch_timeout, "FLOOR_S", 0.3)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        sleeper.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while process_state(sleeper.pid) != "T (stopped)" and time.monotonic() < deadline:
            time.sleep(0.01)
        client = PipelineClient(_SilentWorker(sleeper.pid))
        client.timeout.record(0.001)  # a fast run so far: the floor applies
        start = time.monotonic()
        with pytest.raises(PipelineError) as info:
            client._pump(lambda: False, "train batch 3 of epoch 0")
        assert time.monotonic() - start < 5
        assert str(info.value) == (
            f"the pipeline worker (pid {sleeper.pid}, state T (stopped)) did not deliver train batch 3 of epoch 0 "
            "within 0.3 s although it is alive (the limit: 20 x the slowest batch built so far (0.00 s), at least 0.3 s; "
            f"set PipelineCallback(timeout=...) for batches this slow); `kill -CONT {sleeper.pid}` resumes a stopped "
            "worker"
        )
    finally:
        sleeper.kill()
        sleeper.wait()
