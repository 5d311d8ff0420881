"""One layer's outputs of one node type during layer-wise inference: the table the next layer reads as its ``x``.

A :class:`LayerTable` is ``(rows, width)`` in its storage dtype, kept where :class:`TableStorage` says:

* ``host``: a shared-memory segment (:func:`~lightning_zerocopy.graph.shared_memory.create_shared_tensor`) that local
  rank 0 creates and every local rank maps, so each rank writes its destination rows into the one table; on a GPU it
  is registered (pinned and mapped), so a batch's rows go back with an asynchronous copy and the next layer reads it
  with the zero-copy gather, exactly as ``x`` is read from the feature table;
* ``gpu``: GPU memory (a one-rank run whose tables fit);
* ``file``: a ``.npy`` file on disk mapped shared by every local rank (the embeddings a run exports, which may exceed
  RAM); written as ``<path>.partial`` and renamed onto ``<path>`` once complete (:meth:`LayerTable.finish`).

Rows are the destination list's positions: node ids for a layer over every node of a type, positions in the
predicted split for a last layer over that split only.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional

import numpy as np
import torch

from lightning_zerocopy import ops
from lightning_zerocopy.graph.shared_memory import SharedTensorHandle, create_shared_tensor
from lightning_zerocopy.graph.shm_dir import SharedMemoryFullError
from lightning_zerocopy.options import RunEnvironmentError

__all__ = ["LayerTable", "LocalRanks", "TableStorage"]

#: Where a :class:`LayerTable` lives (see the module docstring).
TableStorage = Literal["host", "gpu", "file"]


def _alone(obj: Any) -> Any:
    return obj


def _no_barrier(name: str) -> None:
    return None


@dataclass
class LocalRanks:
    """The processes of one machine that share each layer's tables (one process by default).

    Attributes:
        local_rank: this process's index on the machine.
        local_world_size: processes on the machine; destination batches are dealt over them.
        barrier: waits for every process of the run (``trainer.strategy.barrier``).
        share: a collective that returns local rank 0's object on every local rank (whatever the others pass).
    """

    local_rank: int = 0
    local_world_size: int = 1
    barrier: Callable[[str], None] = field(default=_no_barrier)
    share: Callable[[Any], Any] = field(default=_alone)

    def from_rank_zero(self, make: Callable[[], Any]) -> Any:
        """``make()`` run on local rank 0 and its result shared with every local rank; an exception there is raised
        on every rank (so none waits for a table that will never come)."""
        mine: Any = None
        if self.local_rank == 0:
            try:
                mine = make()
            except Exception as exc:  # noqa: BLE001 - carried to every rank, re-raised below
                mine = exc
        shared = self.share(mine)
        if isinstance(shared, Exception):
            if self.local_rank == 0:
                raise shared
            raise RuntimeError(f"local rank 0 failed to create a layer-wise table: {shared}")
        return shared


def _file_dtype(dtype: torch.dtype) -> torch.dtype:
    """What a ``.npy`` file stores: float16 as it is, everything else as float32 (NumPy has no bfloat16)."""
    return torch.float16 if dtype == torch.float16 else torch.float32


class LayerTable:
    """One layer's output rows of one node type (see the module docstring); create it with :meth:`create`.

    Attributes:
        layer: the layer whose outputs it holds.
        node_type: their node type.
        storage: where it lives.
        compute_dtype: the dtype the model returned, what the next layer's ``x`` is cast back to.
        path: the file of ``file`` storage.
    """

    def __init__(self, data: torch.Tensor, storage: TableStorage, layer: int, node_type: str,
                 compute_dtype: torch.dtype, path: Optional[Path] = None, array: Any = None) -> None:  # fmt: skip
        self.data: Optional[torch.Tensor] = data
        self.storage: TableStorage = storage
        self.layer, self.node_type, self.compute_dtype, self.path = layer, node_type, compute_dtype, path
        self._array = array  # the numpy memmap of a file table (flushed by finish)
        self._registration: Any = None
        self._reader: Any = None  # the zero-copy gather of a registered host table
        self.rows_read = 0
        self.bytes_read = 0

    # ---- creation ---------------------------------------------------------------------------------------------

    @classmethod
    def create(cls, rows: int, width: int, dtype: torch.dtype, storage: TableStorage, ranks: LocalRanks, *,
               layer: int, node_type: str, compute_dtype: torch.dtype, device: Optional[torch.device] = None,
               path: Optional[Path] = None) -> "LayerTable":  # fmt: skip
        """A table of ``(rows, width)`` (``file``: at ``path``, float32 or float16), on every local rank of ``ranks``.

        Raises:
            RunEnvironmentError: shared memory or the disk cannot hold it (one line: bytes needed and free, the key).
        """
        shape = (int(rows), int(width))
        if storage == "gpu":
            return cls(torch.empty(shape, dtype=dtype, device=device), "gpu", layer, node_type, compute_dtype)
        if storage == "file":
            assert path is not None
            dtype = _file_dtype(dtype)
            ranks.from_rank_zero(lambda: _create_npy(path, shape, dtype))
            array = np.load(_partial(path), mmap_mode="r+")
            table = cls(torch.from_numpy(array), "file", layer, node_type, compute_dtype, path, array)
            ranks.barrier(f"lightning_zerocopy.layerwise.file{layer}")
            return table
        name = f"layer{layer}_{node_type}" if re.fullmatch(r"[A-Za-z0-9_.]+", node_type) else f"layer{layer}"
        handle: SharedTensorHandle = ranks.from_rank_zero(lambda: _create_segment(shape, dtype, name, layer))
        data = handle.open()
        ranks.barrier(f"lightning_zerocopy.layerwise.mapped{layer}")
        if ranks.local_rank == 0:
            handle.unlink()  # every local rank mapped it: the memory lives as long as some rank maps it
        return cls(data, "host", layer, node_type, compute_dtype)

    # ---- shape ------------------------------------------------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        return self._live().dtype

    @property
    def nbytes(self) -> int:
        data = self._live()
        return data.numel() * data.element_size()

    @property
    def row_bytes(self) -> int:
        data = self._live()
        return data.shape[1] * data.element_size()

    # ---- reading and writing ----------------------------------------------------------------------------------

    def gather(self, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Rows ``ids`` on ``device``, cast to :attr:`compute_dtype` (the next layer's ``x``)."""
        data = self._live()
        self.rows_read += int(ids.numel())
        self.bytes_read += int(ids.numel()) * self.row_bytes
        if self.storage == "gpu":
            rows = torch.index_select(data, 0, ids.to(data.device))
        elif device.type != "cuda":
            rows = ops.gather_rows(data, ids.cpu())
        elif self.storage == "host":
            rows = self._zero_copy(device).gather(ids.to(device))
        else:  # a file on disk is not pinned: CPU threads gather, one pinned copy goes over
            from lightning_zerocopy.data.assemble import host_gather_to

            rows = host_gather_to(data, ids, None, device)
        return rows.to(self.compute_dtype)

    def write(self, start: int, rows: torch.Tensor) -> None:
        """``rows`` into positions ``[start, start + len(rows))`` in the table's dtype; from a GPU into host memory
        the copy is asynchronous on the current stream (call :func:`torch.cuda.synchronize` before others read)."""
        data = self._live()
        target = data[start : start + rows.shape[0]]
        rows = rows.detach().to(data.dtype)
        if not rows.is_cuda or self.storage == "gpu":
            target.copy_(rows)
            return
        if self.storage == "host":
            self._register(rows.device)
            _copy_within_chunks(target, rows, self._registration.chunks)
            return
        target.copy_(rows)  # a file page: a synchronous copy

    # ---- lifecycle --------------------------------------------------------------------------------------------

    def finish(self) -> Optional[Path]:
        """A ``file`` table: flush it and rename ``<path>.partial`` onto ``<path>`` (call on one rank, after every
        rank has written). Returns the path (``None`` for other storage)."""
        if self.storage != "file" or self._array is None:
            return None
        self._array.flush()
        assert self.path is not None
        os.replace(_partial(self.path), self.path)
        return self.path

    def close(self) -> None:
        """Drop the GPU reader and registration and this process's mapping (idempotent): a host table's memory is
        freed once every local rank has closed it."""
        reader, registration, self._reader, self._registration = self._reader, self._registration, None, None
        if reader is not None:
            reader.close()
        if registration is not None:
            registration.close()
        if self._array is not None:
            self._array.flush()
        self.data, self._array = None, None

    @property
    def closed(self) -> bool:
        return self.data is None

    def _live(self) -> torch.Tensor:
        if self.data is None:
            raise RuntimeError(f"the layer-wise table of layer {self.layer} ({self.node_type}) is closed")
        return self.data

    def _register(self, device: torch.device) -> None:
        if self._registration is None:
            from lightning_zerocopy.graph.host_registration import register_host_tensor

            with torch.cuda.device(device):
                self._registration = register_host_tensor(self._live(), name=f"layer {self.layer} outputs")

    def _zero_copy(self, device: torch.device) -> Any:
        if self._reader is None:
            from lightning_zerocopy.gather.cuda_table import CudaFeatureTable

            self._register(device)
            with torch.cuda.device(device):
                self._reader = CudaFeatureTable(self._registration.tensor, device, mode="auto", register=False)
        return self._reader

    def __repr__(self) -> str:
        shape = None if self.data is None else tuple(self.data.shape)
        return f"LayerTable(layer={self.layer}, node_type={self.node_type!r}, storage={self.storage!r}, shape={shape})"


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


def _create_segment(shape: tuple[int, int], dtype: torch.dtype, name: str, layer: int) -> SharedTensorHandle:
    try:
        _, handle = create_shared_tensor(shape, dtype, name=name)
    except SharedMemoryFullError as exc:
        raise RunEnvironmentError(exc.errno or errno.ENOSPC, f"{exc.strerror}; for layer {layer}'s outputs also "
                                  "data.init_args.layerwise.dtype: bfloat16 halves them") from None  # fmt: skip
    return handle


def _create_npy(path: Path, shape: tuple[int, int], dtype: torch.dtype) -> Path:
    """The ``.npy`` file of an embeddings table, its bytes reserved on disk (one line if they do not fit)."""
    np_dtype = np.float16 if dtype == torch.float16 else np.float32
    nbytes = shape[0] * shape[1] * np.dtype(np_dtype).itemsize
    key = "data.init_args.layerwise.embeddings_path"
    folder = path.parent
    free = shutil.disk_usage(folder).free if folder.is_dir() else None
    if free is not None and free < nbytes:
        raise _no_disk(path, nbytes, free, key)
    partial = _partial(path)
    try:
        array = np.lib.format.open_memmap(partial, mode="w+", dtype=np_dtype, shape=shape)
        header = int(array.offset)
        del array
        with open(partial, "r+b") as f:  # reserve the blocks: a full disk fails here, not with SIGBUS mid-layer
            if nbytes:
                os.posix_fallocate(f.fileno(), header, nbytes)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise _no_disk(path, nbytes, shutil.disk_usage(folder).free, key) from None
        raise RunEnvironmentError(exc.errno or errno.EIO, f"{key} {path} cannot be written ({exc.strerror or exc}): "
                                  "name a file in a folder this user can write") from None  # fmt: skip
    return path


def _no_disk(path: Path, nbytes: int, free: int, key: str) -> RunEnvironmentError:
    return RunEnvironmentError(errno.ENOSPC, f"{key} {path} cannot hold the embeddings: they need {nbytes:,} bytes and "
                               f"{path.parent} has {free:,} free; name a path on a larger disk")  # fmt: skip


def _copy_within_chunks(target: torch.Tensor, rows: torch.Tensor, chunks: list[tuple[int, int]]) -> None:
    """``target.copy_(rows, non_blocking=True)`` from a GPU into registered host memory, split where the registration's
    page ranges meet (one ``cudaMemcpy`` may not span two of them)."""
    start = target.data_ptr()
    end = start + target.numel() * target.element_size()
    cuts = sorted({a for a, _ in chunks if start < a < end})
    if not cuts:
        target.copy_(rows, non_blocking=True)
        return
    dst, src = target.reshape(-1).view(torch.uint8), rows.contiguous().reshape(-1).view(torch.uint8)
    edges = [0, *(c - start for c in cuts), dst.numel()]
    for lo, hi in zip(edges, edges[1:]):
        dst[lo:hi].copy_(src[lo:hi], non_blocking=True)
