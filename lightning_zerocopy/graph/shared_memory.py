"""Host tensors that every process on one machine maps without copying.

A shared tensor is a file in a memory-backed directory (``/dev/shm`` by default) mapped with
``torch.from_file(path, shared=True)``. Every process that opens it maps the same physical pages, so a
graph or feature table exists once per machine however many ranks or workers use it.

Lifecycle (what the DataModule does across DDP ranks):

1. the creator calls :func:`create_shared_tensor` or :func:`share_tensor` and gets ``(tensor, handle)``;
2. it sends the handle (a small picklable dataclass, no data) to every other local process, each of which
   calls ``handle.open()``;
3. once every process has opened it (a barrier), the creator calls ``handle.unlink()``. The name disappears
   from the directory but the memory stays alive while any mapping exists, and the kernel frees it when the
   last process drops its tensor or exits -- so a crash after step 3 leaks nothing.

A crash between steps 1 and 3 would leave a file behind: each creating process has a guardian process
(:mod:`~lightning_zerocopy.graph.segment_guardian`) that unlinks the creator's segments still named when the
creator dies, however it dies. Names also carry the creator's pid (``lzc-<pid>-<uuid>-<name>``), so
:func:`~lightning_zerocopy.graph.stale_segments.cleanup_stale_segments` removes the files of dead creators should the
guardian have been killed too. Where segments live, and the errors for a folder that cannot hold them:
:mod:`~lightning_zerocopy.graph.shm_dir`.

``multiprocessing.shared_memory`` is deliberately not used: on Python 3.11/3.12 its resource tracker unlinks
segments when the creating process exits, behind the back of the processes still using them.

Features larger than RAM can stay on disk as a ``.npy`` file: :func:`open_npy_memmap` maps it copy-on-write
(never modifying the file), and :class:`NpyTensorHandle` opens the same file in another process, which then
shares the page cache.
"""

from __future__ import annotations

import errno
import math
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

from lightning_zerocopy.graph import segment_guardian
from lightning_zerocopy.graph.shm_dir import SHM_DIR_ENV, SharedMemoryFullError, no_room, shared_memory_dir

__all__ = [
    "SEGMENT_PREFIX",
    "SEGMENT_RE",
    "SHM_DIR_ENV",
    "NpyTensorHandle",
    "SharedMemoryFullError",
    "SharedTensorHandle",
    "TensorHandle",
    "TensorSliceHandle",
    "create_shared_tensor",
    "mapped_footprint",
    "open_npy_memmap",
    "save_npy",
    "share_tensor",
    "shared_memory_dir",
]

#: Every segment file name starts with this prefix, then the creator's pid.
SEGMENT_PREFIX = "lzc"
#: A segment's file name: the creator's pid is group 1.
SEGMENT_RE = re.compile(rf"^{SEGMENT_PREFIX}-(\d+)-[0-9a-f]{{32}}(-.*)?$")
#: Copies above this many bytes show a progress bar.
_PROGRESS_BYTES = 512 * 1024 * 1024
_COPY_CHUNK_BYTES = 64 * 1024 * 1024


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype name {name!r}")
    return dtype


@dataclass(frozen=True)
class SharedTensorHandle:
    """Picklable name of a shared tensor: where it lives, its shape and dtype (no data).

    Attributes:
        path: file of the segment (in :func:`shared_memory_dir`).
        shape: tensor shape.
        dtype: torch dtype name, e.g. ``"float32"``.
    """

    path: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def torch_dtype(self) -> torch.dtype:
        return _torch_dtype(self.dtype)

    @property
    def nbytes(self) -> int:
        return math.prod(map(int, self.shape)) * self.torch_dtype.itemsize

    def exists(self) -> bool:
        """Whether the segment still has a name (it is gone after :meth:`unlink`)."""
        return os.path.exists(self.path)

    def open(self) -> torch.Tensor:
        """Map the segment; writes are seen by every process that mapped it.

        Raises:
            FileNotFoundError: if the segment was already unlinked (open it before the creator unlinks).
        """
        if not os.path.exists(self.path):
            raise FileNotFoundError(
                errno.ENOENT,
                "shared tensor segment is gone: it was unlinked (every process must open it before the "
                "creator calls unlink()) or its creator crashed",
                self.path,
            )
        flat = torch.from_file(self.path, shared=True, size=math.prod(map(int, self.shape)), dtype=self.torch_dtype)
        return flat.view(self.shape)

    def unlink(self, missing_ok: bool = True) -> None:
        """Remove the segment's name. Existing mappings stay valid; memory is freed when the last goes."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise
        finally:
            segment_guardian.forget(self.path)


@dataclass(frozen=True)
class NpyTensorHandle:
    """Picklable name of a ``.npy`` file opened as a copy-on-write memory map.

    Attributes:
        path: the ``.npy`` file.
        dtype: torch dtype to view the data as, when numpy cannot store it (``"bfloat16"`` is stored as
            ``uint16``/``int16``); ``None`` keeps the file's dtype.
    """

    path: str
    dtype: Optional[str] = None

    @property
    def nbytes(self) -> int:
        """Bytes of the array (the file less its header); reads only the header."""
        return int(np.load(self.path, mmap_mode="r").nbytes)

    def open(self) -> torch.Tensor:
        """Map the file; see :func:`open_npy_memmap`."""
        return open_npy_memmap(self.path, dtype=None if self.dtype is None else _torch_dtype(self.dtype))


@dataclass(frozen=True)
class TensorSliceHandle:
    """Picklable name of the rows ``[start, stop)`` of the tensor another handle names: no memory of its own (the
    base's owner unlinks it), so two views of one array (a typed graph's per-edge-type ``edge_perm`` inside the fused
    one) are held once.

    Attributes:
        base: the whole tensor's handle.
        start, stop: the rows.
    """

    base: Union[SharedTensorHandle, NpyTensorHandle]
    start: int
    stop: int

    @property
    def path(self) -> str:
        return self.base.path

    @property
    def nbytes(self) -> int:
        return 0  # counted with its base

    def open(self) -> torch.Tensor:
        return self.base.open()[self.start : self.stop]


#: Anything with an ``open() -> torch.Tensor`` that pickles without data.
TensorHandle = Union[SharedTensorHandle, NpyTensorHandle, TensorSliceHandle]


def _segment_path(directory: Path, name: str) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9_.]*", name):
        raise ValueError(f"`name` may hold only letters, digits, '_' and '.', got {name!r}")
    stem = f"{SEGMENT_PREFIX}-{os.getpid()}-{uuid.uuid4().hex}"
    return directory / (f"{stem}-{name}" if name else stem)


def create_shared_tensor(
    shape: Sequence[int],
    dtype: torch.dtype,
    *,
    name: str = "",
    directory: Union[str, os.PathLike, None] = None,
) -> tuple[torch.Tensor, SharedTensorHandle]:
    """Create an uninitialised shared tensor and its handle.

    The memory is reserved up front (``posix_fallocate``), so a full ``/dev/shm`` raises
    :class:`~lightning_zerocopy.graph.shm_dir.SharedMemoryFullError` here (naming the bytes needed and free) instead
    of killing the process with SIGBUS on first write.

    Args:
        shape: tensor shape.
        dtype: any torch dtype.
        name: a readable tag appended to the job-unique file name (letters, digits, ``_``, ``.``).
        directory: where to create it (default :func:`shared_memory_dir`).

    Returns:
        ``(tensor, handle)``; the caller owns the segment and must eventually call ``handle.unlink()``.
    """
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"`shape` must be non-negative, got {shape}")
    handle = SharedTensorHandle(str(_segment_path(shared_memory_dir(directory), name)), shape, _dtype_name(dtype))
    nbytes = handle.nbytes
    segment_guardian.guard(handle.path)  # before the file exists: a death from here on leaves no name behind
    fd = os.open(handle.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if nbytes > 0:
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EFBIG):
                    raise no_room(nbytes, handle.path, exc) from exc  # one line: needed, free, the fix
                os.ftruncate(fd, nbytes)  # filesystems without fallocate
    except BaseException:
        os.close(fd)
        handle.unlink()
        raise
    os.close(fd)
    try:
        tensor = handle.open()
    except BaseException:
        handle.unlink()
        raise
    return tensor, handle


def _copy_chunked(dst: torch.Tensor, src: torch.Tensor, desc: str) -> None:
    """``dst.copy_(src)`` in row chunks, with a progress bar when it is large."""
    if src.dim() == 0 or src.numel() == 0:
        dst.copy_(src)
        return
    row_bytes = max(1, src[0].numel() * src.element_size())
    rows_per_chunk = max(1, _COPY_CHUNK_BYTES // row_bytes)
    total_bytes = src.numel() * src.element_size()
    bar = None
    if total_bytes > _PROGRESS_BYTES:
        from tqdm.auto import tqdm

        bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc=desc, leave=False)
    try:
        for start in range(0, src.shape[0], rows_per_chunk):
            stop = min(start + rows_per_chunk, src.shape[0])
            dst[start:stop].copy_(src[start:stop])
            if bar is not None:
                bar.update((stop - start) * row_bytes)
    finally:
        if bar is not None:
            bar.close()


def share_tensor(
    tensor: torch.Tensor,
    *,
    name: str = "",
    directory: Union[str, os.PathLike, None] = None,
) -> tuple[torch.Tensor, SharedTensorHandle]:
    """Copy a CPU tensor into a new shared segment (chunked, with a progress bar when large).

    Returns:
        ``(shared_tensor, handle)``: ``shared_tensor`` is contiguous and equal to ``tensor``.
    """
    if tensor.device.type != "cpu":
        raise ValueError(f"`tensor` must be on the CPU, got {tensor.device}")
    shared, handle = create_shared_tensor(tensor.shape, tensor.dtype, name=name, directory=directory)
    try:
        _copy_chunked(shared, tensor, desc=f"sharing {name or 'tensor'}")
    except BaseException:
        handle.unlink()
        raise
    return shared, handle


def mapped_footprint(paths: Sequence[Union[str, os.PathLike]]) -> Optional[tuple[int, int]]:
    """(PSS, RSS) in bytes of this process's mappings of the files ``paths`` (e.g. the segments of a host copy).

    PSS divides each resident page by the number of processes mapping it, so the PSS of every rank that maps one
    shared host copy adds up to about one copy, while RSS counts it in full in each. Only pages this process has
    touched count. None where ``/proc/self/smaps`` does not exist (not Linux).
    """
    wanted = {os.fspath(p) for p in paths}
    pss = rss = 0
    current: Optional[str] = None
    try:
        with open("/proc/self/smaps", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping: range perms offset dev inode [path]
                    current = fields[5] if len(fields) > 5 else None
                elif current in wanted and fields:
                    if fields[0] == "Pss:":
                        pss += int(fields[1]) * 1024
                    elif fields[0] == "Rss:":
                        rss += int(fields[1]) * 1024
    except FileNotFoundError:
        return None
    return pss, rss


def open_npy_memmap(path: Union[str, os.PathLike], *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Open a ``.npy`` file as a tensor backed by a copy-on-write memory map.

    Pages are read from disk on demand and shared through the page cache between processes; writes to the
    tensor stay private to the process and never reach the file.

    Args:
        path: the ``.npy`` file (C order).
        dtype: view the data as this torch dtype (same item size), e.g. ``torch.bfloat16`` for a file that
            stores bf16 bits as ``uint16``/``int16``.
    """
    array = np.load(os.fspath(path), mmap_mode="c")
    if not array.flags.c_contiguous:
        raise ValueError(f"`path` {os.fspath(path)!r} must hold a C-ordered array (it is Fortran-ordered)")
    tensor = torch.from_numpy(array)
    if dtype is not None and dtype != tensor.dtype:
        if dtype.itemsize != tensor.element_size():
            raise TypeError(
                f"`dtype` {dtype} has {dtype.itemsize} bytes per item but {os.fspath(path)!r} stores "
                f"{array.dtype} ({tensor.element_size()} bytes)"
            )
        tensor = tensor.view(dtype)
    return tensor


_NUMPY_STORAGE = {torch.bfloat16: torch.int16}


def save_npy(tensor: torch.Tensor, path: Union[str, os.PathLike]) -> NpyTensorHandle:
    """Write a CPU tensor to a ``.npy`` file (chunked; bf16 stored as its int16 bits).

    Returns:
        A handle that opens the file again with the tensor's dtype.
    """
    storage_dtype = _NUMPY_STORAGE.get(tensor.dtype, tensor.dtype)
    source = tensor.view(storage_dtype) if storage_dtype != tensor.dtype else tensor
    np_dtype = torch.empty((), dtype=storage_dtype).numpy().dtype
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np_dtype, shape=tuple(tensor.shape))
    try:
        if tensor.numel() > 0:
            _copy_chunked(torch.from_numpy(array), source, desc=f"writing {os.path.basename(path)}")
        array.flush()
        del array
        os.replace(tmp, path)  # readers never see a half-written file
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return NpyTensorHandle(path, None if storage_dtype == tensor.dtype else _dtype_name(tensor.dtype))
