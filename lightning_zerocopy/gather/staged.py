"""The copy engines' gather: host threads read a batch's rows into a pinned staging buffer, one copy moves them.

The zero-copy gather has the GPU's SMs read host memory over PCIe. Beside training that costs the training step more
than its bytes suggest: on one H200 the heavy model's step ran ×1.26 slower beside a zero-copy gather at the pipeline
worker's 10 % MPS share, at 40 GB/s and at 20 GB/s alike, and ×1.22 over consecutive rows; a host → device copy by
the copy engines cost it ×1.03 at 54 GB/s, and this gather (8 host threads, then one copy) ×1.06 at 15 GB/s
(``benchmarks.parts.contention``, docs/PERFORMANCE.md). So this path trades the gather's own speed (host threads
deliver 15-18 GB/s where the zero-copy reads deliver ~40) for a faster training step: worth it where the gather has
time to spare beside the step (``gather_mode: staged``).

Rows that a GPU hot-row cache holds are read from it on the GPU; only the others go through host threads (the
process's torch intra-op threads, ``torch.set_num_threads``; in the pipeline worker, the worker's). The result is
bitwise ``table[ids]``, as every gather path's.
"""

from __future__ import annotations

from typing import Optional

import torch

from lightning_zerocopy import ops

__all__ = ["StagedGather"]


class StagedGather:
    """Gathers rows of a host ``table`` into GPU tensors through one reusable pinned staging buffer.

    Args:
        table: the 2-D contiguous host table (CPU memory: shared, pinned or registered).
        pin: stage in page-locked memory (what lets the copy engines read it asynchronously); ``False`` only where
            no GPU exists (tests of the logic on the CPU).
    """

    def __init__(self, table: torch.Tensor, *, pin: bool = True) -> None:
        if table.device.type != "cpu" or table.dim() != 2 or not table.is_contiguous():
            raise ValueError("the staged gather reads a 2-D contiguous table in host memory; a table already in GPU "
                             "memory needs no staging (gather_mode: auto)")  # fmt: skip
        self.table = table
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

    def _check_ids(self, ids: torch.Tensor) -> None:
        num_rows = self.table.shape[0]
        bad = ((ids < 0) | (ids >= num_rows)).nonzero()
        if bad.numel():
            pos = int(bad[0, 0])
            raise IndexError(f"gather: ids[{pos}] = {int(ids[pos])} is outside the table's rows [0, {num_rows})")

    def gather(
        self,
        ids: torch.Tensor,
        out: torch.Tensor,
        cache_slot: Optional[torch.Tensor] = None,
        cache: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``out[:] = table[ids]`` on the current stream of ``out``'s device; rows whose ``cache_slot`` entry is
        ``>= 0`` are read from ``cache`` there, the rest by host threads and one copy.

        Args:
            ids: int32/int64 row ids (on the GPU or the CPU); each must be in ``[0, len(table))``.
            out: contiguous ``(len(ids), dim)`` tensor of the table's dtype.
            cache_slot, cache: an optional hot-row cache as :func:`lightning_zerocopy.ops.gather_rows` takes it.

        Raises:
            IndexError: an id outside the table (naming it and its position); nothing is read then.
        """
        if out.shape != (ids.shape[0], self.table.shape[1]) or out.dtype != self.table.dtype:
            raise ValueError(f"`out` must be a ({ids.shape[0]}, {self.table.shape[1]}) tensor of {self.table.dtype}, "
                             f"got {tuple(out.shape)} {out.dtype}")  # fmt: skip
        ids_host = ids.to("cpu", torch.int64)  # waits for the ids on the GPU
        self._check_ids(ids_host)
        if cache_slot is None:
            rows = ops.gather_rows(self.table, ids_host, self._buffer(ids_host.numel()))
            out.copy_(rows, non_blocking=True)
        else:
            device_ids = ids.to(out.device, torch.int64)
            slot = cache_slot[device_ids].to(torch.int64)
            hit = slot >= 0
            out[hit] = cache[slot[hit]]
            miss = (~hit).cpu()
            rows = ops.gather_rows(self.table, ids_host[miss], self._buffer(int(miss.sum())))
            out[miss.to(out.device)] = rows.to(out.device, non_blocking=True)
        if out.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record(torch.cuda.current_stream(out.device))
        return out
