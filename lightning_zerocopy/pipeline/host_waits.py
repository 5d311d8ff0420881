"""How the pipeline's host threads wait for GPU work: asleep, not spinning on a core.

By default a CUDA event or stream synchronization spins its host thread for as long as the GPU work lasts
(``cudaDeviceScheduleAuto`` spins while a process has fewer CUDA contexts than cores). The pipeline waits like that on
every batch: the trainer's slot-release thread for each step's GPU work (most of the step), the producer for each
batch's gather and copies into the slot, the sampler for its size read-backs. Those are cores kept busy beside the
trainer's launch thread, which the heavy model's step needs at full speed: a spinning thread on the same physical core
(a hyperthread sibling) slows it.

So the pipeline waits asleep, for the price of a wake-up (microseconds, against steps of milliseconds):

* on events created with ``blocking=True`` (``cudaEventBlockingSync``: the thread sleeps until the GPU signals the
  event): the trainer's slot-release events and the producer's per-batch wait (:func:`wait_event`);
* in the worker process, every wait of the process, the sampler's size read-backs on the lookahead thread included
  (they wait for the sampling kernels, which run for milliseconds beside training): the device's schedule is set to
  ``cudaDeviceScheduleBlockingSync`` when the worker starts (:func:`sleep_while_waiting`). The trainer's process keeps
  its own schedule: it is the user's.

``LIGHTNING_ZEROCOPY_SPIN_WAITS=1`` in the environment (inherited by the worker process) restores CUDA's spinning
waits, to measure the difference (``benchmarks.end_to_end``'s ``zc_gpu_mps_spin`` row).

A woken thread of the worker also waits for the interpreter's lock: the sampling thread after each of its read-backs
while the producer's thread runs Python (the assembly of a batch), for up to the interpreter's switch interval (5 ms
by default) each time. ``LIGHTNING_ZEROCOPY_WORKER_SWITCH_US=<microseconds>`` sets the worker's switch interval
(:func:`worker_switch_interval`), to measure what that lock costs the sample stage (the row ``zc_gpu_mps_switch``;
the sample's host and CPU times are in :mod:`.stage_times`).
"""

from __future__ import annotations

import math
import os
import sys
from typing import Optional

import torch

__all__ = [
    "SCHEDULES",
    "SPIN_WAITS_ENV",
    "SWITCH_US_ENV",
    "apply_worker_switch_interval",
    "sleep_while_waiting",
    "spin_waits",
    "wait_event",
    "wait_schedule",
    "worker_switch_interval",
]

#: Set to ``1`` to wait the CUDA default way (spinning).
SPIN_WAITS_ENV = "LIGHTNING_ZEROCOPY_SPIN_WAITS"
#: The worker process's interpreter switch interval, in microseconds (unset: Python's default, 5000).
SWITCH_US_ENV = "LIGHTNING_ZEROCOPY_WORKER_SWITCH_US"
#: ``cudaDeviceSchedule*`` values of a device's schedule bits, by name.
SCHEDULES = {0: "auto", 1: "spin", 2: "yield", 4: "blocking sync"}
_BLOCKING_SYNC = 4


def spin_waits() -> bool:
    """Whether :data:`SPIN_WAITS_ENV` asks for spinning waits (any value but empty or ``0``)."""
    return os.environ.get(SPIN_WAITS_ENV, "").strip() not in ("", "0")


def worker_switch_interval() -> Optional[float]:
    """The worker's interpreter switch interval in seconds that :data:`SWITCH_US_ENV` asks for (``None`` when unset).

    Raises:
        ValueError: the variable is not a positive number of microseconds.
    """
    raw = os.environ.get(SWITCH_US_ENV, "").strip()
    if not raw:
        return None
    try:
        micros = float(raw)
    except ValueError:
        micros = math.nan
    if not (math.isfinite(micros) and micros > 0):
        raise ValueError(
            f"{SWITCH_US_ENV}={raw!r}: expected the worker's interpreter switch interval in microseconds, a number "
            "above 0 (e.g. 200); unset it for Python's default (5000)"
        )
    return micros * 1e-6


def apply_worker_switch_interval() -> Optional[float]:
    """Set this process's interpreter switch interval as :data:`SWITCH_US_ENV` asks (the worker, at its start);
    returns the interval set in seconds, or ``None`` (the variable unset: the interval untouched)."""
    seconds = worker_switch_interval()
    if seconds is not None:
        sys.setswitchinterval(seconds)
    return seconds


def wait_event() -> "torch.cuda.Event":
    """A CUDA event for the host to wait on: its ``synchronize()`` sleeps until the GPU reaches it (it spins with
    :data:`SPIN_WAITS_ENV` set). Record it on a stream and synchronize it to wait for that stream's work so far."""
    return torch.cuda.Event(blocking=not spin_waits())


def _compiled() -> Optional[object]:
    from lightning_zerocopy._extension import WITH_CUDA

    if not WITH_CUDA:
        return None
    from lightning_zerocopy import _C

    return _C


def sleep_while_waiting(device: torch.device) -> Optional[str]:
    """Make every host wait of this process on ``device`` sleep (``cudaDeviceScheduleBlockingSync``; the device's
    other flags kept). For the pipeline's worker process, at its start. Returns ``None`` once set, else why it was
    not: :data:`SPIN_WAITS_ENV` asks to spin, the build has no CUDA, or the CUDA runtime refused (its error code)."""
    if spin_waits():
        return f"{SPIN_WAITS_ENV} asks for spinning waits"
    compiled = _compiled()
    if compiled is None:
        return "lightning_zerocopy._C was built without CUDA"
    index = device.index if device.index is not None else torch.cuda.current_device()
    code = int(compiled.set_wait_schedule(index, _BLOCKING_SYNC))
    return None if code == 0 else f"cudaSetDeviceFlags failed with CUDA error {code}"


def wait_schedule(device: torch.device) -> str:
    """How this process's host threads wait for ``device``: a name of :data:`SCHEDULES` (``"unknown"`` without a
    CUDA build or when the runtime cannot tell)."""
    compiled = _compiled()
    if compiled is None:
        return "unknown"
    code, schedule = compiled.wait_schedule(device.index if device.index is not None else torch.cuda.current_device())
    return SCHEDULES.get(int(schedule), "unknown") if int(code) == 0 else "unknown"
