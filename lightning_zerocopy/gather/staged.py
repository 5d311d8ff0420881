"""The copy engines' gather: host threads read a batch's rows into a pinned staging buffer, one copy moves them.

The zero-copy gather has the GPU's SMs read host memory over PCIe. Beside training that costs the training step more
than its bytes suggest: on one H200 the heavy model's step ran ×1.26 slower beside a zero-copy gather at the pipeline
worker's 10 % MPS share, at 40 GB/s and at 20 GB/s alike, and ×1.22 over consecutive rows; a host → device copy by
the copy engines cost it ×1.03 at 54 GB/s, and this gather (8 host threads, then one copy) ×1.06 at 15 GB/s
(``benchmarks.parts.contention``, docs/PERFORMANCE.md). So this path trades the gather's own speed (host threads
deliver 15-18 GB/s where the zero-copy reads deliver ~40) for a faster training step: worth it where the gather has
time to spare beside the step (``gather_mode: staged``).

Rows that a GPU hot-row cache holds are read from it on the GPU; only the others go through host threads: torch's
intra-op threads, held for each gather to ``threads`` (default: half the CPUs this process may run on). End to end
on one H200 machine with 16 CPUs (commit f693907), this gather on all 16 (torch's default in the pipeline worker)
ran the light model's step at p50 5.11 ms against 3.98 beside the zero-copy gather, where the contention benchmark's
8-thread form cost the step ×1.06: the thread count is the likeliest difference (the trainer's own thread, which
launches the step, needs a CPU too), not yet measured end to end with the cap. The result is bitwise
``table[ids]``, as every gather path's.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import torch

from lightning_zerocopy import ops
from lightning_zerocopy.options import GatherMode

__all__ = ["StagedGather", "default_threads", "staged_for"]


def staged_for(table: torch.Tensor, mode: GatherMode) -> tuple[Optional["StagedGather"], GatherMode]:
    """What a table gathering in ``mode`` reads with: the staged gather (``mode="staged"`` over a host table; a table
    in GPU memory is read in place, nothing to stage) or ``None``, and the read order of its zero-copy kernel, which
    still reads the rest (``direct`` where the mode is ``staged``)."""
    staged = StagedGather(table) if mode == "staged" and table.device.type == "cpu" else None
    return staged, "direct" if mode == "staged" else mode


def default_threads() -> int:
    """Half the CPUs this process may run on (at least one): the staged gather's default, which leaves the rest to
    the trainer's thread and the sampler."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return max(1, usable // 2)


class StagedGather:
    """Gathers rows of a host ``table`` into GPU tensors through one reusable pinned staging buffer.

    Args:
        table: the 2-D contiguous host table (CPU memory: shared, pinned or registered).
        pin: stage in page-locked memory (what lets the copy engines read it asynchronously); ``False`` only where
            no GPU exists (tests of the logic on the CPU).
        threads: host threads of each gather (default :func:`default_threads`: half the CPUs this process may use).
    """

    def __init__(self, table: torch.Tensor, *, pin: bool = True, threads: Optional[int] = None) -> None:
        if table.device.type != "cpu" or table.dim() != 2 or not table.is_contiguous():
            raise ValueError("the staged gather reads a 2-D contiguous table in host memory; a table already in GPU "
                             "memory needs no staging (gather_mode: auto)")  # fmt: skip
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"`threads` of the staged gather must be a positive int, got {threads!r}")
        self.table = table
        self.threads = default_threads() if threads is None else threads
        self._pin = pin
        self._staging = torch.empty((0, table.shape[1]), dtype=table.dtype)
        self._copied: Optional[torch.cuda.Event] = None  # the last copy out of the staging buffer

    def _buffer(self, rows: int) -> torch.Tensor:
        """The staging buffer, at least ``rows`` long (grown by a quarter beyond, so batches of varying size
        rarely grow it again); waits for the last copy out of it first."""
        if self._copied is not None:
            self._copied.synchronize()
        if self._staging.shape[0] < rows:
            size = rows + rows // 4
            self._staging = torch.empty((size, self.table.shape[1]), dtype=self.table.dtype, pin_memory=self._pin)
        return self._staging[:rows]

    def check_ids(self, ids_host: torch.Tensor) -> None:
        """Raise ``IndexError`` naming the first of ``ids_host`` (host ids) that is not a row of the table."""
        num_rows = self.table.shape[0]
        bad = ((ids_host < 0) | (ids_host >= num_rows)).nonzero()
        if bad.numel():
            pos = int(bad[0, 0])
            raise IndexError(f"gather: ids[{pos}] = {int(ids_host[pos])} is outside the table's rows [0, {num_rows})")

    def _read_into(self, ids_host: torch.Tensor, out: torch.Tensor) -> None:
        """``out[:] = table[ids_host]``: host threads into the staging buffer, then one copy on ``out``'s stream.
        The CPU kernel checks every id before it reads a row (one pass, in parallel); a bad one is named here."""
        staging = self._buffer(ids_host.numel())
        try:
            with ops.host_threads(self.threads):
                ops.gather_rows(self.table, ids_host, staging)
        except IndexError:
            self.check_ids(ids_host)
            raise
        out.copy_(staging, non_blocking=True)
        if out.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record(torch.cuda.current_stream(out.device))

    def gather(
        self,
        ids: torch.Tensor,
        out: torch.Tensor,
        on_gpu: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        gather_on_gpu: Optional[Callable[[torch.Tensor, torch.Tensor], object]] = None,
    ) -> int:
        """``out[:] = table[ids]`` on the current stream of ``out``'s device; the rows that a GPU cache serves
        (``on_gpu``) come from it, the rest from host threads and one copy.

        Args:
            ids: int32/int64 row ids (on the GPU or the CPU); each must be in ``[0, len(table))``.
            out: contiguous ``(len(ids), dim)`` tensor of the table's dtype.
            on_gpu: optional; ``on_gpu(ids)`` (the ids on ``out``'s device, checked) is the bool mask of the rows a
                GPU cache holds.
            gather_on_gpu: ``gather_on_gpu(ids, out)`` writes the rows of ``ids`` (all of them cached) into ``out``,
                e.g. the zero-copy kernel over the cache (it reads no host row when every row is cached).

        Returns:
            How many rows were read from host memory.

        Raises:
            IndexError: an id outside the table (naming it and its position); nothing is read then.
        """
        if out.shape != (ids.shape[0], self.table.shape[1]) or out.dtype != self.table.dtype:
            raise ValueError(f"`out` must be a ({ids.shape[0]}, {self.table.shape[1]}) tensor of {self.table.dtype}, "
                             f"got {tuple(out.shape)} {out.dtype}")  # fmt: skip
        if on_gpu is not None and gather_on_gpu is None:
            raise ValueError("`on_gpu` needs `gather_on_gpu`, which reads the rows it marks")
        ids_host = ids.to("cpu")  # waits for GPU ids
        if on_gpu is None:
            self._read_into(ids_host, out)
            return ids_host.numel()
        self.check_ids(ids_host)  # before the cache's lookup on the GPU reads at them
        device_ids = ids.to(out.device)
        served = on_gpu(device_ids).cpu()  # the one wait for the GPU: both index sets are split on the host
        cached, from_host = served.nonzero().view(-1), (~served).nonzero().view(-1)
        if cached.numel():
            at = cached.to(out.device)
            part = out.new_empty((cached.numel(), out.shape[1]))
            gather_on_gpu(device_ids[at], part)
            out[at] = part
        rows = out.new_empty((from_host.numel(), out.shape[1]))
        self._read_into(ids_host[from_host], rows)
        out[from_host.to(out.device)] = rows
        return from_host.numel()
