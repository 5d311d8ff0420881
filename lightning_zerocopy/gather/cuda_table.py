"""Zero-copy GPU access to host feature tables.

:func:`register_host_tensor` pins and maps a host tensor for the GPU (``cudaHostRegister`` with the mapped
flag, in chunks, unregistered on :meth:`HostRegistration.close`). :class:`CudaFeatureTable` then gathers
rows of that host table straight into GPU memory with the ``zerocopy::gather_rows_into_ex`` kernel, which
reads host memory over PCIe: no CPU gather, no staging copy.

Random reads over a large host table are limited by address translation (see ``docs/ARCHITECTURE.md`` and
``benchmarks/NOTES.md``), so two locality levers are built in:

* address-ordered reads (``sort``): the batch's ids are sorted on the GPU, rows read in ascending address order
  and written back to their batch positions. Whether that pays depends on the table, the batch and the
  machine, so the ``auto`` mode times both ways on its first calls and keeps the faster (by measuring).
* a GPU hot-row cache: the most frequently used rows (for neighbor sampling: the nodes that appear most often
  as neighbors, :func:`most_frequent_neighbors`) are copied to GPU memory once and served from there.

Nothing touches CUDA at import; registration happens when a table is opened.
"""

from __future__ import annotations

import mmap
import resource
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Union

import torch

from lightning_zerocopy import ops
from lightning_zerocopy.gather.read_order import ReadOrderChooser
from lightning_zerocopy.graph.reorder import frequency_order, most_frequent_neighbors
from lightning_zerocopy.options import GatherMode, check_choice

if TYPE_CHECKING:
    from lightning_zerocopy.gather.host_table import HostFeatureTable

__all__ = [
    "CudaFeatureTable",
    "GatherMode",
    "frequency_order",
    "HostRegistration",
    "most_frequent_neighbors",
    "register_host_tensor",
]

_CUDA_HOST_REGISTER_PORTABLE = 0x01
_CUDA_HOST_REGISTER_MAPPED = 0x02
_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712
_DEFAULT_CHUNK_BYTES = 1 << 30


def _error_code(result: object) -> int:
    """The integer of a ``cudaError`` returned by ``torch.cuda.cudart()`` (a pybind enum or an int)."""
    try:
        return int(result)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return int(getattr(result, "value"))


def _cudart():
    cudart = torch.cuda.cudart()
    for name in ("cudaHostRegister", "cudaHostUnregister"):
        if not hasattr(cudart, name):
            raise RuntimeError(
                f"torch {torch.__version__} does not expose torch.cuda.cudart().{name}; "
                "host memory cannot be registered for zero-copy access with this torch build"
            )
    return cudart


def _memlock_text() -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    show = lambda v: "unlimited" if v == resource.RLIM_INFINITY else f"{v / 2**20:.0f} MiB"  # noqa: E731
    return f"locked-memory limit (`ulimit -l`): soft {show(soft)}, hard {show(hard)}"


@dataclass
class HostRegistration:
    """Host memory registered (pinned and mapped) for the GPU; :meth:`close` unregisters it.

    Use as a context manager, or keep it as long as any kernel may read the memory.
    """

    tensor: torch.Tensor
    #: (address, bytes) of every chunk this object registered (empty when the memory was already pinned).
    chunks: list[tuple[int, int]] = field(default_factory=list)
    closed: bool = False

    @property
    def nbytes(self) -> int:
        return sum(size for _, size in self.chunks)

    def close(self) -> None:
        """Unregister the chunks (after every queued GPU read of them has finished). Idempotent."""
        if self.closed:
            return
        self.closed = True
        if not self.chunks:
            return
        torch.cuda.synchronize()
        cudart = _cudart()
        errors = []
        for address, _ in reversed(self.chunks):
            code = _error_code(cudart.cudaHostUnregister(address))
            if code != 0:
                errors.append(code)
        self.chunks = []
        if errors:
            raise RuntimeError(f"cudaHostUnregister failed with cudaError {errors[0]} ({len(errors)} chunk(s))")

    def __enter__(self) -> "HostRegistration":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; close() explicitly
        try:
            if not self.closed and self.chunks:
                self.close()
        except Exception:
            pass


def register_host_tensor(
    tensor: torch.Tensor, *, chunk_bytes: Optional[int] = None, name: str = "tensor"
) -> HostRegistration:
    """Pin and map the memory of a CPU tensor so CUDA kernels can read it in place (zero-copy).

    The page-aligned range is registered (portable + mapped) with one ``cudaHostRegister`` call; if that call
    fails on a range larger than 1 GiB, or when ``chunk_bytes`` is given, it is registered in pieces of that
    size instead. Kernels read across piece boundaries without trouble (the device address of registered
    memory is its host address), but one ``cudaMemcpy`` may not span two pieces, so one piece is preferred.
    Memory that is already pinned (``pin_memory()``) or registered is left as it is. Registration works on
    whole pages: a tensor that shares a page with another registered tensor shares that registration.

    Args:
        tensor: contiguous CPU tensor (e.g. a shared-memory feature table or CSC array).
        chunk_bytes: register in pieces of this many bytes (a multiple of the page size); ``None`` = one piece,
            falling back to 1 GiB pieces if one call fails.
        name: what to call the tensor in error messages.

    Returns:
        A :class:`HostRegistration`; keep it alive while kernels read the memory, then ``close()`` it.

    Raises:
        ValueError: ``tensor`` is not a contiguous CPU tensor, or ``chunk_bytes`` is not a page multiple.
        RuntimeError: CUDA is unavailable or pinning failed (the message gives the ``ulimit -l`` limit).
    """
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
        raise ValueError(f"`{name}` must be a CPU tensor to register it for zero-copy access")
    if not tensor.is_contiguous():
        raise ValueError(f"`{name}` must be contiguous to register it for zero-copy access")
    if not torch.cuda.is_available():
        raise RuntimeError(f"cannot register `{name}` for zero-copy access: no CUDA device is available")
    page = mmap.PAGESIZE
    if chunk_bytes is not None and (chunk_bytes <= 0 or chunk_bytes % page):
        raise ValueError(f"`chunk_bytes` must be a positive multiple of the page size {page}, got {chunk_bytes}")
    registration = HostRegistration(tensor)
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return registration
    torch.cuda.init()
    if tensor.is_pinned():
        return registration
    cudart = _cudart()
    start = tensor.data_ptr() // page * page
    end = -(-(tensor.data_ptr() + nbytes) // page) * page
    flags = _CUDA_HOST_REGISTER_PORTABLE | _CUDA_HOST_REGISTER_MAPPED

    def register_range(piece: int) -> tuple[int, int]:
        """Registers [start, end) in pieces; returns (0, done) or (cudaError, bytes done before it)."""
        address = start
        while address < end:
            size = min(piece, end - address)
            code = _error_code(cudart.cudaHostRegister(address, size, flags))
            if code == _CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
                address += size  # someone else's registration: leave it to them
                continue
            if code != 0:
                return code, address - start
            registration.chunks.append((address, size))
            address += size
        return 0, end - start

    code, done = register_range(chunk_bytes or (end - start))
    if code != 0 and chunk_bytes is None and end - start > _DEFAULT_CHUNK_BYTES:
        code, done = register_range(_DEFAULT_CHUNK_BYTES)
    if code != 0:
        try:
            registration.close()
        finally:
            raise RuntimeError(
                f"cudaHostRegister of `{name}` failed with cudaError {code} after {done / 2**30:.2f} of "
                f"{(end - start) / 2**30:.2f} GiB; pinning host memory needs the {_memlock_text()}. Raise it "
                "(`ulimit -l unlimited`, or memlock in /etc/security/limits.conf / the container's "
                "--ulimit memlock=-1) or register a smaller table."
            )
    return registration


class CudaFeatureTable:
    """A host feature table that the GPU reads in place, with an optional GPU hot-row cache.

    Args:
        table: a :class:`~lightning_zerocopy.gather.HostFeatureTable`, a 2-D contiguous CPU tensor (shared-memory
            or pinned), or a CUDA tensor (then rows come from GPU memory and registration is skipped).
        device: the GPU that gathers (default: the current one).
        mode: ``"direct"`` (rows read in batch order), ``"sorted"`` (rows read in ascending address order and
            written back to their batch positions) or ``"auto"`` (time both on the first ``2 * trial_calls``
            gathers, then keep the faster per row).
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
        if not isinstance(table, torch.Tensor) and isinstance(getattr(table, "data", None), torch.Tensor):
            table = table.data  # a HostFeatureTable
        if not isinstance(table, torch.Tensor) or table.dim() != 2:
            raise ValueError("`table` must be a 2-D tensor (num_rows, dim) or a HostFeatureTable")
        if not table.is_contiguous():
            raise ValueError("`table` must be contiguous")
        check_choice(mode, GatherMode, "mode")
        if trial_calls < 1:
            raise ValueError(f"`trial_calls` must be >= 1, got {trial_calls}")
        if not torch.cuda.is_available():
            raise RuntimeError("CudaFeatureTable needs a CUDA device")
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"`device` must be a CUDA device, got {self.device}")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.table = table
        self.mode: GatherMode = mode
        self.trial_calls = trial_calls
        self._registration: Optional[HostRegistration] = None
        if table.device.type == "cpu" and register:
            with torch.cuda.device(self.device):
                self._registration = register_host_tensor(table, name="table")
        self._cache_slot: Optional[torch.Tensor] = None
        self._cache: Optional[torch.Tensor] = None
        self._order = ReadOrderChooser(mode, trial_calls)
        if hot_rows is not None:
            self.set_hot_rows(hot_rows)

    # ------------------------------------------------------------------------------------------ properties

    @property
    def num_rows(self) -> int:
        return int(self.table.shape[0])

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        return self.table.dtype

    @property
    def row_bytes(self) -> int:
        return self.dim * self.table.element_size()

    @property
    def num_hot_rows(self) -> int:
        return 0 if self._cache is None else int(self._cache.shape[0])

    @property
    def chosen_mode(self) -> Optional[str]:
        """``"direct"`` or ``"sorted"`` once decided (immediately unless ``mode="auto"``), else None."""
        return self._order.chosen

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
            ops.gather_rows_ex(self.table, rows, cache)
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
            if ids.device != self.device:
                ids = ids.to(self.device, non_blocking=True)
            if out is None:
                out = torch.empty((ids.shape[0], self.dim), dtype=self.dtype, device=self.device)

            def gather(sort_ids: bool) -> None:
                ops.gather_rows_ex(self.table, ids, out, sort_ids=sort_ids, cache_slot=self._cache_slot,
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
