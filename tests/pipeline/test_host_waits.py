"""The pipeline's host waits sleep (``cudaEventBlockingSync``) unless ``LIGHTNING_ZEROCOPY_SPIN_WAITS`` asks to spin."""

from __future__ import annotations

import pytest
import torch

from lightning_zerocopy.pipeline import host_waits
from lightning_zerocopy.pipeline.host_waits import (
    SPIN_WAITS_ENV,
    spin_waits,
    wait_event,
)


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


class _FakeC:
    def __init__(self, code: int) -> None:
        self.code, self.calls = code, []

    def set_wait_schedule(self, device: int, schedule: int) -> int:
        self.calls.append((device, schedule))
        return self.code

    def wait_schedule(self, device: int) -> tuple[int, int]:
        return self.code, 4


def test_the_worker_sets_its_devices_schedule_to_blocking_sync(monkeypatch: pytest.MonkeyPatch):
    fake = _FakeC(0)
    monkeypatch.setattr(host_waits, "_compiled", lambda: fake)
    monkeypatch.delenv(SPIN_WAITS_ENV, raising=False)
    assert host_waits.sleep_while_waiting(torch.device("cuda", 1)) is None
    assert fake.calls == [(1, 4)]  # cudaDeviceScheduleBlockingSync on the worker's device
    assert host_waits.wait_schedule(torch.device("cuda", 1)) == "blocking sync"
    monkeypatch.setenv(SPIN_WAITS_ENV, "1")
    assert host_waits.sleep_while_waiting(torch.device("cuda", 1)) == f"{SPIN_WAITS_ENV} asks for spinning waits"
    assert fake.calls == [(1, 4)]  # left as it is


def test_a_refusal_of_the_runtime_is_named(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(host_waits, "_compiled", lambda: _FakeC(708))
    monkeypatch.delenv(SPIN_WAITS_ENV, raising=False)
    assert host_waits.sleep_while_waiting(torch.device("cuda", 0)) == "cudaSetDeviceFlags failed with CUDA error 708"
    assert host_waits.wait_schedule(torch.device("cuda", 0)) == "unknown"


_PROBE = r"""
import time, torch
from lightning_zerocopy.pipeline.host_waits import sleep_while_waiting, wait_schedule
dev = torch.device("cuda", 0)
why = sleep_while_waiting(dev)
x = torch.ones(1, device=dev)
(x + 1).item()  # loads the add kernel now: a first launch loads its module, which waits for the device to be idle
torch.cuda.synchronize()
torch.cuda._sleep(600_000_000)  # ~0.3 s at 2 GHz
y = x + 1
wall, cpu = time.perf_counter(), time.thread_time()
y.item()  # an implicit wait, as the sampler's size read-backs
print("|".join([repr(why), wait_schedule(dev), str(time.perf_counter() - wall), str(time.thread_time() - cpu)]))
"""


def _probe(spin: bool) -> tuple[str, str, float, float]:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != SPIN_WAITS_ENV}
    if spin:
        env[SPIN_WAITS_ENV] = "1"
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    why, schedule, wall, cpu = done.stdout.strip().splitlines()[-1].split("|")
    return why, schedule, float(wall), float(cpu)


@pytest.mark.cuda
def test_on_a_gpu_the_worker_processs_implicit_waits_sleep_too():
    """In a process of its own, as the worker: after :func:`sleep_while_waiting` a read-back behind GPU work sleeps;
    with the spin switch it spins as CUDA's default does."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    why, schedule, wall, cpu = _probe(spin=False)
    assert why == "None" and schedule == "blocking sync", (why, schedule)
    assert wall > 0.1 and cpu < 0.25 * wall, (wall, cpu)
    why, schedule, wall, cpu = _probe(spin=True)
    assert schedule in ("auto", "spin") and wall > 0.1 and cpu > 0.5 * wall, (why, schedule, wall, cpu)
