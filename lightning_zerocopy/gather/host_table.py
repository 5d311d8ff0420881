"""Node features as a 2-D host table that every local process maps without copying.

The table lives in a shared-memory segment (see :mod:`lightning_zerocopy.graph.shared_memory`) or in a
``.npy`` file mapped from disk for features larger than RAM. :meth:`HostFeatureTable.gather` copies rows with
the parallel CPU kernel into an optional preallocated (e.g. pinned) buffer.

The table may store ``bfloat16`` or ``float16`` rows of a ``float32`` dataset (``HostFeatureTable.share(x,
dtype=...)``, :func:`cast_rows_into`): half the host memory and half the bytes every gather moves over PCIe. The
cast happens once, when the table is built; a finite value it cannot hold is refused (:class:`FeatureOverflowError`),
and values it turns into 0 or subnormal ones are counted (:mod:`~lightning_zerocopy.gather.precision_loss`).
:func:`check_fits_dtype` runs the same checks for a cast made later, per batch (``x_dtype``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Union

import torch
from tqdm.auto import tqdm

from lightning_zerocopy import ops
from lightning_zerocopy.graph.shared_memory import (
    NpyTensorHandle,
    SharedTensorHandle,
    TensorHandle,
    create_shared_tensor,
    share_tensor,
)
from lightning_zerocopy.gather.precision_loss import FeatureRangeError, PrecisionLoss
from lightning_zerocopy.gather.table_shape import TableShape
from lightning_zerocopy.options import FeatureDtype, check_choice

__all__ = [
    "FEATURE_DTYPES",
    "FeatureOverflowError",
    "FeatureTableHandle",
    "HostFeatureTable",
    "cast_chunk_into",
    "cast_rows_into",
    "check_fits_dtype",
    "feature_dtype_name",
    "feature_dtype_of",
]

#: Feature dtypes a table may hold.
FEATURE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CAST_CHUNK_BYTES = 64 * 1024 * 1024  # source bytes cast per step (bounds the temporary check, drives the bar)


def feature_dtype_of(name: "FeatureDtype | torch.dtype", key: str = "feature_dtype") -> torch.dtype:
    """The torch dtype of a feature dtype name (``"float32"``, ``"bfloat16"``, ``"float16"``); a torch dtype of
    :data:`FEATURE_DTYPES` passes as it is.

    Raises:
        ValueError: any other value (naming ``key``: the argument or the YAML key).
    """
    if isinstance(name, torch.dtype) and name in FEATURE_DTYPES:
        return name
    return _BY_NAME[check_choice(name, FeatureDtype, key)]


def feature_dtype_name(dtype: torch.dtype) -> str:
    """``"float32"``, ``"bfloat16"`` or ``"float16"``: the name :func:`feature_dtype_of` maps back to ``dtype``."""
    return str(dtype).removeprefix("torch.")


class FeatureOverflowError(FeatureRangeError):
    """A finite feature value does not fit the dtype the table is cast to (e.g. above 65504 for ``float16``).

    Attributes:
        node: the first row with such a value.
        column: its first such column.
        value: the value.
    """

    def __init__(self, what: str, node: int, column: int, value: float, dtype: torch.dtype, key: str) -> None:
        self.node, self.column, self.value = node, column, value
        super().__init__(
            f"{what}: the value {value} at node {node}, column {column} does not fit {feature_dtype_name(dtype)} "
            f"(it becomes infinite); set {key} to bfloat16 (float32's range) or float32"
        )


def cast_rows_into(
    src: torch.Tensor, out: torch.Tensor, what: str = "features", key: str = "feature_dtype"
) -> torch.Tensor:
    """``out[:] = src`` cast to ``out``'s dtype, in chunks of rows (``src`` may be memory-mapped), with a progress bar
    when it takes more than a second. Returns ``out``.

    Raises:
        ValueError: the shapes differ.
        FeatureOverflowError: a finite value of ``src`` becomes infinite in ``out``'s dtype (named by node and
            column, and ``key``, the setting that chose the dtype). NaN or infinity already in ``src`` is copied.
        FeatureUnderflowError: more than :data:`~lightning_zerocopy.gather.precision_loss.REFUSE_SHARE` of the
            nonzero values become 0 or subnormal (fewer, some of them 0: a warning with the count).
    """
    if src.shape != out.shape:
        raise ValueError(f"cannot cast {what} of shape {tuple(src.shape)} into {tuple(out.shape)}")
    if src.numel() == 0:
        return out
    rows = max(1, _CAST_CHUNK_BYTES // max(1, src[0].numel() * src.element_size()))
    desc = f"casting {what} to {feature_dtype_name(out.dtype)}"
    loss = PrecisionLoss()
    with tqdm(total=src.shape[0], desc=desc, unit="rows", unit_scale=True, delay=1.0, leave=False) as bar:
        for start in range(0, src.shape[0], rows):
            stop = min(start + rows, src.shape[0])
            cast_chunk_into(src[start:stop], out[start:stop], start, what, key, loss)
            bar.update(stop - start)
    loss.check(what, out.dtype, key)
    return out


def check_fits_dtype(x: torch.Tensor, dtype: torch.dtype, what: str, key: str) -> None:
    """Whether ``dtype`` holds the values of ``x`` as :func:`cast_rows_into` would cast them (in chunks, through a
    scratch buffer): for a cast made later, e.g. each batch's ``x`` cast to ``x_dtype`` where it is built.

    Raises:
        FeatureOverflowError, FeatureUnderflowError: as :func:`cast_rows_into` (naming ``key``).
    """
    if not x.is_floating_point() or x.dtype == dtype or dtype == torch.float32 or x.numel() == 0:
        return
    flat = x.reshape(x.shape[0], -1)
    rows = max(1, _CAST_CHUNK_BYTES // max(1, flat.shape[1] * flat.element_size()))
    scratch = torch.empty((min(rows, flat.shape[0]), flat.shape[1]), dtype=dtype)
    loss = PrecisionLoss()
    for start in range(0, flat.shape[0], rows):
        chunk = flat[start : start + rows]
        cast_chunk_into(chunk, scratch[: chunk.shape[0]], start, what, key, loss)
    loss.check(what, dtype, key)


def cast_chunk_into(src: torch.Tensor, out: torch.Tensor, first_row: int, what: str, key: str,
                    loss: Optional[PrecisionLoss] = None) -> None:  # fmt: skip
    """One chunk of :func:`cast_rows_into`: rows ``first_row, ...`` of the table (for the error's node id); what it
    turns into 0 or subnormal values is counted into ``loss`` (checked by the caller once every chunk is cast)."""
    out.copy_(src)
    if out.dtype == torch.float32 or not src.is_floating_point() or src.dtype == out.dtype:
        return  # nothing overflows float32 (or a copy)
    if loss is not None:
        loss.count(src, out, first_row)
    bad = ~torch.isfinite(out)
    if not bool(bad.any()):
        return
    bad &= torch.isfinite(src)  # a NaN or infinity already in the source is not an overflow
    if bool(bad.any()):
        row, column = (int(v) for v in bad.reshape(bad.shape[0], -1).nonzero()[0])
        value = float(src[row].reshape(-1)[column])
        raise FeatureOverflowError(what, first_row + row, column, value, out.dtype, key)


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


class HostFeatureTable(TableShape):
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
    def share(
        cls, x: torch.Tensor, *, name: str = "features", dtype: Optional[torch.dtype] = None, key: str = "dtype"
    ) -> "HostFeatureTable":
        """Copy ``x`` into a new shared-memory segment, cast to ``dtype`` (``None``: ``x``'s own; see
        :func:`cast_rows_into`). The caller owns it: :meth:`unlink` once every local process has opened the
        :meth:`handle`.

        Raises:
            FeatureOverflowError: a value of ``x`` does not fit ``dtype`` (the message names ``key``).
        """
        _check_features(x, "x")
        if dtype is None or dtype == x.dtype:
            data, handle = share_tensor(x, name=name)
        else:
            data, handle = create_shared_tensor(x.shape, feature_dtype_of(dtype, key), name=name)
            try:
                cast_rows_into(x, data, key=key)
            except BaseException:
                handle.unlink()
                raise
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

    table = data  # what TableShape's num_rows, dim, dtype and row_bytes read

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
