"""How the worker's sampling kernels get multiprocessors while its gather runs.

The worker samples batch ``t + 2`` on one stream while it gathers batch ``t + 1`` on another, both inside its small
MPS share. A gather kernel launches up to 32 blocks per multiprocessor, each looping over its part of the rows, so its
blocks hold every multiprocessor of the share for most of the gather; the GPU's block scheduler hands a sampling
kernel launched meanwhile a multiprocessor only as gather blocks retire. Two measured levers (the e2e rows
``zc_gpu_mps_prio`` and ``zc_gpu_mps_short``):

* ``LIGHTNING_ZEROCOPY_SAMPLE_PRIORITY=high``: the sampling thread's stream has CUDA's high priority, so the block
  scheduler places its blocks before the gather's pending ones (running blocks are never preempted);
* ``LIGHTNING_ZEROCOPY_GATHER_BLOCKS_PER_SM=<n>``: the gather kernels' grid bound in blocks per multiprocessor
  (default 32): more, shorter-lived blocks retire sooner.

Both apply to the worker process; the trainer checks them before it starts one (:func:`check_kernel_scheduling`), so
a bad value fails by name before any process exists.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import torch

__all__ = [
    "GATHER_BLOCKS_ENV",
    "SAMPLE_PRIORITY_ENV",
    "apply_gather_blocks",
    "check_kernel_scheduling",
    "gather_blocks_per_sm",
    "high_priority_sampling",
    "sampling_stream_factory",
]

#: ``high`` or ``normal`` (unset: normal): the CUDA priority of the worker's sampling stream.
SAMPLE_PRIORITY_ENV = "LIGHTNING_ZEROCOPY_SAMPLE_PRIORITY"
#: The gather kernels' most blocks per multiprocessor in the worker (unset: the build's default, 32).
GATHER_BLOCKS_ENV = "LIGHTNING_ZEROCOPY_GATHER_BLOCKS_PER_SM"
_PRIORITIES = ("high", "normal")
_MAX_BLOCKS = 65536
_HIGHEST = -64  # torch maps a priority beyond the device's range to the nearest one it allows: the highest


def high_priority_sampling() -> bool:
    """Whether :data:`SAMPLE_PRIORITY_ENV` asks for a high-priority sampling stream.

    Raises:
        ValueError: the variable is neither ``high`` nor ``normal``.
    """
    raw = os.environ.get(SAMPLE_PRIORITY_ENV, "").strip().lower()
    if raw and raw not in _PRIORITIES:
        raise ValueError(
            f"{SAMPLE_PRIORITY_ENV}={raw!r}: expected 'high' (the worker samples on a high-priority CUDA stream) or "
            "'normal'; unset it for normal"
        )
    return raw == "high"


def gather_blocks_per_sm() -> Optional[int]:
    """The gather grid bound :data:`GATHER_BLOCKS_ENV` asks for (``None`` when unset).

    Raises:
        ValueError: the variable is not a whole number in ``[1, 65536]``.
    """
    raw = os.environ.get(GATHER_BLOCKS_ENV, "").strip()
    if not raw:
        return None
    try:
        blocks = int(raw)
    except ValueError:
        blocks = 0
    if not 1 <= blocks <= _MAX_BLOCKS:
        raise ValueError(
            f"{GATHER_BLOCKS_ENV}={raw!r}: expected the gather kernels' most blocks per multiprocessor, a whole number "
            f"in [1, {_MAX_BLOCKS}] (e.g. 256); unset it for the default, 32"
        )
    return blocks


def check_kernel_scheduling() -> None:
    """Validate both variables (the trainer calls this before it starts a worker).

    Raises:
        ValueError: naming the variable with a bad value.
    """
    high_priority_sampling()
    gather_blocks_per_sm()


def apply_gather_blocks() -> Optional[int]:
    """Set this process's gather grid bound from :data:`GATHER_BLOCKS_ENV` (the worker, at start); the value set, or
    ``None`` when the variable is unset or the build has no CUDA kernels."""
    blocks = gather_blocks_per_sm()
    if blocks is None:
        return None
    from lightning_zerocopy import ops

    if not ops.WITH_CUDA:
        return None
    ops.set_gather_blocks_per_sm(blocks)
    return blocks


def sampling_stream_factory(
    device: torch.device, make_stream: Callable[[], torch.cuda.Stream], shared: bool
) -> Callable[[], torch.cuda.Stream]:
    """What makes the sampling thread's stream: ``make_stream`` itself, or, with :data:`SAMPLE_PRIORITY_ENV` ``high``
    and a plain device stream (``shared`` false: not an SM share's green-context stream), a stream of the highest
    priority the device allows."""
    if shared or not high_priority_sampling():
        return make_stream
    return lambda: torch.cuda.Stream(device, priority=_HIGHEST)
