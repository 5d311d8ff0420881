"""Node features as a 2-D host table that every local process maps without copying.

The table lives in a shared-memory segment (see :mod:`lightning_zerocopy.graph.shared_memory`) or in a
``.npy`` file mapped from disk for features larger than RAM. :meth:`HostFeatureTable.gather` copies rows with
the parallel CPU kernel into an optional preallocated (e.g. pinned) buffer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Union

import torch

from lightning_zerocopy import ops
from lightning_zerocopy.graph.shared_memory import (
    NpyTensorHandle,
    SharedTensorHandle,
    TensorHandle,
    share_tensor,
)

__all__ = ["FEATURE_DTYPES", "FeatureTableHandle", "HostFeatureTable"]

#: Feature dtypes a table may hold.
FEATURE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_features(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"`{name}` must be 2-D (num_nodes, num_features), got shape {tuple(x.shape)}")
    if x.dtype not in FEATURE_DTYPES:
        raise TypeError(f"`{name}` must be float32, float16 or bfloat16, got {x.dtype}")
    if x.device.type != "cpu":
        raise ValueError(f"`{name}` must be a host (CPU) tensor, got {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"`{name}` must be contiguous")


@dataclass(frozen=True)
class FeatureTableHandle:
    """Picklable name of a :class:`HostFeatureTable` (no data); :meth:`open` maps it in this process."""

    data: TensorHandle

    def open(self) -> "HostFeatureTable":
        return HostFeatureTable(self.data.open(), handle=self)

    def unlink(self) -> None:
        """Remove the shared segment's name (a ``.npy`` file on disk is kept)."""
        if isinstance(self.data, SharedTensorHandle):
            self.data.unlink()


class HostFeatureTable:
    """A ``(num_rows, dim)`` float32/float16/bfloat16 feature table in host memory.

    Build it with :meth:`share` (copy into shared memory), :meth:`from_npy` (map a file) or
    ``FeatureTableHandle.open()`` in another process; a table built directly from a tensor is private and
    has no handle.
    """

    def __init__(self, data: torch.Tensor, *, handle: Optional[FeatureTableHandle] = None) -> None:
        _check_features(data, "data")
        self._data = data
        self._handle = handle

    @classmethod
    def share(cls, x: torch.Tensor, *, name: str = "features") -> "HostFeatureTable":
        """Copy ``x`` into a new shared-memory segment. The caller owns it: :meth:`unlink` once every local
        process has opened the :meth:`handle`."""
        _check_features(x, "x")
        data, handle = share_tensor(x, name=name)
        return cls(data, handle=FeatureTableHandle(handle))

    @classmethod
    def from_npy(cls, path: Union[str, os.PathLike], *, dtype: Optional[torch.dtype] = None) -> "HostFeatureTable":
        """Map a 2-D ``.npy`` file copy-on-write (``dtype=torch.bfloat16`` for bf16 bits stored as int16)."""
        dtype_name = None if dtype is None else str(dtype).removeprefix("torch.")
        handle = FeatureTableHandle(NpyTensorHandle(os.fspath(path), dtype_name))
        return handle.open()

    @property
    def data(self) -> torch.Tensor:
        """The table itself (host memory)."""
        return self._data

    @property
    def num_rows(self) -> int:
        return int(self._data.shape[0])

    @property
    def dim(self) -> int:
        return int(self._data.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        return self._data.dtype

    @property
    def row_bytes(self) -> int:
        return self.dim * self._data.element_size()

    def handle(self) -> FeatureTableHandle:
        """Picklable handle for other local processes.

        Raises:
            ValueError: for a private table; build it with :meth:`share` or :meth:`from_npy`.
        """
        if self._handle is None:
            raise ValueError(
                "this HostFeatureTable is private: build it with HostFeatureTable.share(x) to get a handle"
            )
        return self._handle

    def unlink(self) -> None:
        """Remove the shared segment's name; this and other mappings stay valid until dropped."""
        if self._handle is not None:
            self._handle.unlink()

    def gather(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``table[ids]`` on the CPU, written into ``out`` when given (e.g. from :meth:`pinned_buffer`).

        Args:
            ids: int32/int64 CPU row ids, each in ``[0, num_rows)`` (checked before anything is copied).
            out: contiguous ``(len(ids), dim)`` tensor of the table's dtype, e.g. ``buffer[:len(ids)]``.
        """
        return ops.gather_rows(self._data, ids, out)

    def pinned_buffer(self, max_rows: int) -> torch.Tensor:
        """A ``(max_rows, dim)`` output buffer, page-locked when CUDA is available (else ordinary memory).

        Slice it to the batch (``buf[:len(ids)]``, still contiguous) and pass it to :meth:`gather`.
        """
        if max_rows < 0:
            raise ValueError(f"`max_rows` must be >= 0, got {max_rows}")
        return torch.empty((max_rows, self.dim), dtype=self.dtype, pin_memory=torch.cuda.is_available())

    def __repr__(self) -> str:
        where = type(self._handle.data).__name__ if self._handle is not None else "private"
        return f"HostFeatureTable(num_rows={self.num_rows}, dim={self.dim}, dtype={self.dtype}, storage={where})"
