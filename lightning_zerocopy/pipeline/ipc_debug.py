"""Reading torch's CUDA IPC reference counters of the trainer's slots (``LZC_DEBUG_IPC=1``), to find which block
would bring "Producer process has been terminated before all shared CUDA tensors released" at the trainer's exit.

torch gives every CUDA storage a process sends a counter in a shared-memory file: each send adds one, a receiver
subtracts one when its copy is freed (or at once when it already had that storage open). A block whose counter is
above zero when the sender frees it waits in torch's limbo, and one still there at exit brings the warning. The
counter of a live storage can be read only by sharing it once more (``_share_cuda_`` names the file and offset),
so :func:`slot_counters` does that and gives its own reference back.
"""

from __future__ import annotations

import mmap
import os
import sys
from typing import Iterable

import torch

__all__ = ["DEBUG_IPC_ENV", "debug_ipc", "report_slot_counters", "slot_counters"]

#: Set to 1: a worker lists the CUDA tensors it still holds before it exits, and the trainer the IPC counters of
#: its slots once the worker has gone (what would keep a block in torch's limbo until the trainer's exit).
DEBUG_IPC_ENV = "LZC_DEBUG_IPC"


def debug_ipc() -> bool:
    """Whether ``LZC_DEBUG_IPC`` asks for the reports."""
    return os.environ.get(DEBUG_IPC_ENV, "") not in ("", "0")


def _counter(handle: bytes, offset: int) -> int:
    path = "/dev/shm/" + handle.decode().lstrip("/")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return int.from_bytes(m[offset * 8 : offset * 8 + 8], sys.byteorder, signed=True)


def slot_counters(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, int]]:
    """``(name, references not yet released by receivers)`` of each CUDA tensor in ``named`` that was shared."""
    out = []
    for name, tensor in named:
        storage = tensor.untyped_storage()
        if not tensor.is_cuda or storage.nbytes() == 0:
            continue
        shared = storage._share_cuda_()
        handle, offset, device = shared[4], shared[5], shared[0]
        try:
            out.append((name, _counter(handle, offset) - 1))  # less the reference this read added
        except OSError as exc:
            out.append((f"{name} (counter unreadable: {exc})", -1))
        finally:
            torch.UntypedStorage._release_ipc_counter(handle, offset, device=device)
    return out


def report_slot_counters(named: Iterable[tuple[str, torch.Tensor]], who: str) -> None:
    """Print the slots whose counters are not zero (receivers that did not release them), or that none is."""
    counters = slot_counters(named)
    held = [(n, c) for n, c in counters if c != 0]
    print(f"[lightning-zerocopy {who}] {len(counters)} shared slot tensor(s), {len(held)} not released by the "
          f"worker: {held[:20]}", file=sys.stderr)  # fmt: skip
