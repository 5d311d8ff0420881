"""The pipeline's host waits sleep (``cudaEventBlockingSync``) unless ``LIGHTNING_ZEROCOPY_SPIN_WAITS`` asks to spin."""

from __future__ import annotations

import pytest
import torch

from lightning_zerocopy.pipeline import host_waits
from lightning_zerocopy.pipeline.host_waits import SPIN_WAITS_ENV, spin_waits, wait_event


@pytest.mark.parametrize(("value", "spins"), [(None, False), ("", False), ("0", False), ("1", True), (" yes ", True)])
def test_the_environment_switches_to_spinning(value, spins, monkeypatch: pytest.MonkeyPatch):
    if value is None:
        monkeypatch.delenv(SPIN_WAITS_ENV, raising=False)
    else:
        monkeypatch.setenv(SPIN_WAITS_ENV, value)
    assert spin_waits() is spins


def test_the_wait_event_asks_for_a_blocking_sync_unless_told_to_spin(monkeypatch: pytest.MonkeyPatch):
    made = []
    monkeypatch.setattr(host_waits.torch.cuda, "Event", lambda **kwargs: made.append(kwargs) or kwargs)
    monkeypatch.delenv(SPIN_WAITS_ENV, raising=False)
    wait_event()
    monkeypatch.setenv(SPIN_WAITS_ENV, "1")
    wait_event()
    assert made == [{"blocking": True}, {"blocking": False}]


def _thread_cpu_while_waiting(monkeypatch: pytest.MonkeyPatch, spin: bool) -> tuple[float, float]:
    """(wall, this thread's CPU) seconds of waiting on a wait event behind ~0.3 s of GPU work."""
    import time

    if spin:
        monkeypatch.setenv(SPIN_WAITS_ENV, "1")
    else:
        monkeypatch.delenv(SPIN_WAITS_ENV, raising=False)
    stream = torch.cuda.Stream()
    event = wait_event()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(600_000_000)  # ~0.3 s at 2 GHz (longer at lower clocks)
    event.record(stream)
    wall, cpu = time.perf_counter(), time.thread_time()
    event.synchronize()
    return time.perf_counter() - wall, time.thread_time() - cpu


@pytest.mark.cuda
def test_on_a_gpu_the_waiting_thread_sleeps_and_spins_only_when_told(monkeypatch: pytest.MonkeyPatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    wall, cpu = _thread_cpu_while_waiting(monkeypatch, spin=False)
    assert wall > 0.1 and cpu < 0.25 * wall, (wall, cpu)  # asleep for most of the wait
    wall, cpu = _thread_cpu_while_waiting(monkeypatch, spin=True)
    assert wall > 0.1 and cpu > 0.5 * wall, (wall, cpu)  # CUDA's default: a core busy for the whole wait
