"""How the pipeline's host threads wait for GPU work: asleep, not spinning on a core.

By default a CUDA event or stream synchronization spins its host thread for as long as the GPU work lasts
(``cudaDeviceScheduleAuto`` spins while a process has fewer CUDA contexts than cores). The pipeline waits like that on
every batch: the trainer's slot-release thread for each step's GPU work (most of the step), and the producer for each
batch's gather and copies into the slot. Those are two cores kept busy beside the trainer's launch thread, which the
heavy model's step needs at full speed: a spinning thread on the same physical core (a hyperthread sibling) slows it.

So the pipeline waits on events created with ``blocking=True`` (``cudaEventBlockingSync``): the thread sleeps until the
GPU signals the event, for the price of a wake-up (microseconds, against steps of milliseconds).
``LIGHTNING_ZEROCOPY_SPIN_WAITS=1`` in the environment (inherited by the worker process) restores CUDA's spinning
waits, to measure the difference (``benchmarks.end_to_end``'s ``zc_gpu_mps_spin`` row). Waits outside the
pipeline's loop (allocation, shutdown, a sampler's own size read-backs) are left as they are.
"""

from __future__ import annotations

import os

import torch

__all__ = ["SPIN_WAITS_ENV", "spin_waits", "wait_event"]

#: Set to ``1`` to wait the CUDA default way (spinning).
SPIN_WAITS_ENV = "LIGHTNING_ZEROCOPY_SPIN_WAITS"


def spin_waits() -> bool:
    """Whether :data:`SPIN_WAITS_ENV` asks for spinning waits (any value but empty or ``0``)."""
    return os.environ.get(SPIN_WAITS_ENV, "").strip() not in ("", "0")


def wait_event() -> "torch.cuda.Event":
    """A CUDA event for the host to wait on: its ``synchronize()`` sleeps until the GPU reaches it (it spins with
    :data:`SPIN_WAITS_ENV` set). Record it on a stream and synchronize it to wait for that stream's work so far."""
    return torch.cuda.Event(blocking=not spin_waits())
