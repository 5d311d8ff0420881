"""Zero-copy GPU access to host feature tables.

:func:`~lightning_zerocopy.graph.host_registration.register_host_tensor` pins and maps a host tensor for the
GPU. :class:`CudaFeatureTable` then gathers rows of that host table straight into GPU memory with the
``zerocopy::gather_rows_into`` kernel, which reads host memory over PCIe: no CPU gather, no staging copy.

Random reads over a large host table are limited by address translation (see ``docs/ARCHITECTURE.md`` and
``docs/BENCHMARK_NOTES.md``), so two locality levers are built in:

* address-ordered reads (``sort``): the batch's ids are sorted on the GPU, rows read in ascending address order
  and written back to their batch positions. Whether that pays depends on the table, the batch and the
  machine, so the ``auto`` mode times both ways on its first calls and keeps the faster (by measuring).
* a GPU hot-row cache: the most frequently used rows (for neighbor sampling: the nodes that appear most often
  as neighbors, :func:`most_frequent_neighbors`) are copied to GPU memory once and served from there.

Nothing touches CUDA at import; registration happens when a table is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

import torch

from lightning_zerocopy import ops
from lightning_zerocopy.gather.table_shape import TableShape, cuda_device, feature_table_tensor
from lightning_zerocopy.gather.read_order import ReadOrderChooser
from lightning_zerocopy.gather.staged import staged_for
from lightning_zerocopy.graph.reorder import frequency_order, most_frequent_neighbors
from lightning_zerocopy.options import GatherMode, check_choice
from lightning_zerocopy.graph.host_registration import HostRegistration, register_host_tensor

if TYPE_CHECKING:
    from lightning_zerocopy.gather.host_table import HostFeatureTable

__all__ = [
    "CudaFeatureTable",
    "GatherMode",
    "frequency_order",
    "most_frequent_neighbors",
]



class CudaFeatureTable(TableShape):
    """A host feature table that the GPU reads in place, with an optional GPU hot-row cache.

    Args:
        table: a :class:`~lightning_zerocopy.gather.HostFeatureTable`, a 2-D contiguous CPU tensor (shared-memory
            or pinned), or a CUDA tensor (then rows come from GPU memory and registration is skipped).
        device: the GPU that gathers (default: the current one).
        mode: ``"direct"`` (rows read in batch order), ``"sorted"`` (rows read in ascending address order and
            written back to their batch positions), ``"auto"`` (time both on the first ``2 * trial_calls``
            gathers, then keep the faster per row), or ``"staged"``: no zero-copy reads, host threads gather the
            rows the cache does not hold into a pinned buffer and the copy engines move it
            (:class:`~lightning_zerocopy.gather.staged.StagedGather`; needs a host table).
        hot_rows: optional int64 row ids to serve from a GPU copy (e.g. :func:`most_frequent_neighbors`).
        trial_calls: gathers per mode that ``auto`` times before choosing.
        register: register a CPU table for zero-copy access here (set False if the caller registered it).
    """

    def __init__(
        self,
        table: Union[torch.Tensor, "HostFeatureTable"],
        device: Union[torch.device, str, int, None] = None,
        *,
        mode: GatherMode = "auto",
        hot_rows: Optional[torch.Tensor] = None,
        trial_calls: int = 3,
        register: bool = True,
    ) -> None:
        table = feature_table_tensor(table)
        check_choice(mode, GatherMode, "mode")
        if trial_calls < 1:
            raise ValueError(f"`trial_calls` must be >= 1, got {trial_calls}")
        self.device = cuda_device(device, "CudaFeatureTable needs a CUDA device")
        self.table = table
        self.mode: GatherMode = mode
        self.trial_calls = trial_calls
        self._registration: Optional[HostRegistration] = None
        if table.device.type == "cpu" and register:
            with torch.cuda.device(self.device):
                self._registration = register_host_tensor(table, name="table")
            self.table = self._registration.tensor  # `table`, or its page-aligned copy
        self._cache_slot: Optional[torch.Tensor] = None
        self._cache: Optional[torch.Tensor] = None
        self._staged, order = staged_for(self.table, mode)
        self._order = ReadOrderChooser(order, trial_calls)
        if hot_rows is not None:
            self.set_hot_rows(hot_rows)

    # ------------------------------------------------------------------------------------------ properties

    @property
    def num_hot_rows(self) -> int:
        return 0 if self._cache is None else int(self._cache.shape[0])

    @property
    def chosen_mode(self) -> Optional[str]:
        """``"direct"``, ``"sorted"`` or ``"staged"`` once decided (immediately unless ``mode="auto"``), else None."""
        return "staged" if self._staged is not None else self._order.chosen

    @property
    def trial_times(self) -> dict[str, list[float]]:
        """Per-row seconds measured for each mode during the ``auto`` trials."""
        return self._order.trial_times

    # --------------------------------------------------------------------------------------------- cache

    def set_hot_rows(self, rows: Optional[torch.Tensor]) -> None:
        """Serve ``rows`` (int64 ids, unique) from a GPU copy; ``None`` or empty drops the cache."""
        if rows is None or rows.numel() == 0:
            self._cache_slot, self._cache = None, None
            return
        rows = rows.to(device=self.device, dtype=torch.int64).contiguous()
        if rows.dim() != 1:
            raise ValueError("`hot_rows` must be 1-D")
        if bool(((rows < 0) | (rows >= self.num_rows)).any()):
            raise IndexError(f"`hot_rows` holds ids outside [0, {self.num_rows})")
        if torch.unique(rows).numel() != rows.numel():
            raise ValueError("`hot_rows` must be unique")
        with torch.cuda.device(self.device):
            cache = torch.empty((rows.numel(), self.dim), dtype=self.dtype, device=self.device)
            ops.gather_rows(self.table, rows, cache)
            slot = torch.full((self.num_rows,), -1, dtype=torch.int32, device=self.device)
            slot[rows] = torch.arange(rows.numel(), dtype=torch.int32, device=self.device)
        self._cache_slot, self._cache = slot, cache

    # -------------------------------------------------------------------------------------------- gather

    def gather(
        self,
        ids: torch.Tensor,
        out: Optional[torch.Tensor] = None,
        stream: Optional[torch.cuda.Stream] = None,
    ) -> torch.Tensor:
        """``table[ids]`` into GPU memory.

        Args:
            ids: int32/int64 row ids on this table's GPU (a CPU tensor is copied there first).
            out: contiguous ``(len(ids), dim)`` CUDA tensor of the table's dtype to write into (a view of a
                larger buffer is fine), else a new tensor.
            stream: CUDA stream to run on (default: the current stream). The call returns once the rows are in
                ``out`` (it waits for that stream, to check the ids).

        Raises:
            IndexError: an id is out of range (naming it and its position); nothing outside the table is read.
        """
        stream = torch.cuda.current_stream(self.device) if stream is None else stream
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            if out is None:
                out = torch.empty((ids.shape[0], self.dim), dtype=self.dtype, device=self.device)
            if self._staged is not None:  # host ids stay on the host: the staged gather reads them there
                if self._cache_slot is None:
                    self._staged.gather(ids, out)
                else:
                    self._staged.gather(ids, out, lambda i: self._cache_slot[i] >= 0, lambda i, o: ops.gather_rows(
                        self.table, i, o, cache_slot=self._cache_slot, cache=self._cache))  # every row cached
                stream.synchronize()  # as the zero-copy path: the rows are in `out` on return
                return out
            if ids.device != self.device:
                ids = ids.to(self.device, non_blocking=True)

            def gather(sort_ids: bool) -> None:
                ops.gather_rows(self.table, ids, out, sort_ids=sort_ids, cache_slot=self._cache_slot,
                                   cache=self._cache)  # fmt: skip

            self._order.run(gather, ids.numel(), stream)
        return out

    # ------------------------------------------------------------------------------------------- cleanup

    def close(self) -> None:
        """Drop the cache and unregister the host table (if this object registered it)."""
        self._cache_slot, self._cache = None, None
        if self._registration is not None:
            self._registration.close()
            self._registration = None

    def __enter__(self) -> "CudaFeatureTable":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"CudaFeatureTable(num_rows={self.num_rows}, dim={self.dim}, dtype={self.dtype}, device={self.device}, "
            f"mode={self.mode!r}, chosen={self.chosen_mode!r}, hot_rows={self.num_hot_rows})"
        )
