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

The sampler's waits are the GPU's, not the host's: on one H200 (2026-11-30) its thread used 0.9 ms of CPU in a 5.1-ms
heavy sample asleep and spun through all of it when spinning, and a 200-us interpreter switch interval changed nothing.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

__all__ = ["SCHEDULES", "SPIN_WAITS_ENV", "sleep_while_waiting", "spin_waits", "wait_event", "wait_schedule"]

#: Set to ``1`` to wait the CUDA default way (spinning).
SPIN_WAITS_ENV = "LIGHTNING_ZEROCOPY_SPIN_WAITS"
#: ``cudaDeviceSchedule*`` values of a device's schedule bits, by name.
SCHEDULES = {0: "auto", 1: "spin", 2: "yield", 4: "blocking sync"}
_BLOCKING_SYNC = 4


def spin_waits() -> bool:
    """Whether :data:`SPIN_WAITS_ENV` asks for spinning waits (any value but empty or ``0``)."""
    return os.environ.get(SPIN_WAITS_ENV, "").strip() not in ("", "0")


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
