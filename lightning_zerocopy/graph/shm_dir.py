"""Where shared segments live, and the one-line errors for a folder that cannot hold them.

``/dev/shm`` by default; ``$LZC_SHM_DIR`` names another folder. A folder named by the variable must exist: one that
does not was created on disk before (not memory-backed: every gather then reads a file), so it is refused now, and a
folder that exists but is not memory-backed (tmpfs, ramfs, hugetlbfs) is a warning. A folder too small for a segment
is :class:`SharedMemoryFullError`: one line with the bytes needed, the bytes free and the fix.

This module imports only the standard library and :mod:`lightning_zerocopy.options`.
"""

from __future__ import annotations

import errno
import os
import tempfile
import warnings
from pathlib import Path
from typing import Optional, Union

from lightning_zerocopy.options import RunEnvironmentError

__all__ = ["SHM_DIR_ENV", "HostMemoryError", "SharedMemoryFullError", "no_room", "shared_memory_dir"]

#: Environment variable naming the directory for segments (default ``/dev/shm``).
SHM_DIR_ENV = "LZC_SHM_DIR"
_MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "hugetlbfs")
_warned: set[str] = set()


class HostMemoryError(RunEnvironmentError):
    """The machine's shared memory cannot hold the run's host copy (the ``lightning-zerocopy`` command prints it as one
    line and exits with status 2)."""


class SharedMemoryFullError(HostMemoryError):
    """A shared segment does not fit the free space of its folder."""


def shared_memory_dir(directory: Union[str, os.PathLike, None] = None) -> Path:
    """The directory that holds shared segments.

    ``directory`` if given (created if missing), else ``$LZC_SHM_DIR`` (which must exist; a warning when it is not
    memory-backed), else ``/dev/shm``, else (machines without ``/dev/shm``, e.g. macOS) ``<tmpdir>/lzc-shm``, which
    is file-backed rather than memory-backed.

    Raises:
        HostMemoryError: ``$LZC_SHM_DIR`` names no directory.
    """
    if directory is not None:
        path = Path(directory)
    elif os.environ.get(SHM_DIR_ENV):
        path = Path(os.environ[SHM_DIR_ENV])
        if not path.is_dir():
            raise HostMemoryError(
                errno.ENOENT,
                f"{SHM_DIR_ENV}={path} is not a directory: create it on a memory-backed filesystem (e.g. `mount -t "
                f"tmpfs -o size=64g tmpfs {path}`), or unset {SHM_DIR_ENV} to use /dev/shm",
            )
        kind = filesystem_type(path)
        if kind is not None and kind not in _MEMORY_FILESYSTEMS and str(path) not in _warned:
            _warned.add(str(path))
            warnings.warn(f"{SHM_DIR_ENV}={path} is on a {kind} filesystem, not in memory: the host copy will be read "
                          "from disk (use a tmpfs folder, or unset it for /dev/shm)", UserWarning,
                          stacklevel=2)  # fmt: skip
        return path
    elif os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        path = Path("/dev/shm")
    else:
        path = Path(tempfile.gettempdir()) / "lzc-shm"
    path.mkdir(parents=True, exist_ok=True)
    return path


def filesystem_type(path: Union[str, os.PathLike]) -> Optional[str]:
    """The type of the filesystem ``path`` is on (the longest mount point that contains it in ``/proc/self/mounts``),
    or ``None`` where that file does not exist."""
    target = os.path.realpath(path)
    best: tuple[int, Optional[str]] = (-1, None)
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) > best[0]:
                    best = (len(mount), fields[2])
    except OSError:
        return None
    return best[1]


def free_bytes(directory: Union[str, os.PathLike]) -> Optional[int]:
    """Bytes an unprivileged process can still write in ``directory``'s filesystem (``None`` if unknown)."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def no_room(nbytes: int, path: Union[str, os.PathLike], cause: OSError) -> SharedMemoryFullError:
    """The error for a segment of ``nbytes`` that did not fit where ``path`` is (``cause``: the ``ENOSPC``)."""
    folder = os.path.dirname(os.fspath(path))
    free = free_bytes(folder)
    has = f"{free:,} bytes ({_human(free)}) free" if free is not None else "less free"
    name = os.path.basename(os.fspath(path)).split("-", 3)[-1] or "a segment"
    return SharedMemoryFullError(
        cause.errno,
        f"shared memory is full: {name} of the host copy needs {nbytes:,} bytes ({_human(nbytes)}) in {folder}, "
        f"which has {has}. Enlarge it (`docker run --shm-size`, `mount -o remount,size=... {folder}`), set "
        f"{SHM_DIR_ENV} to a larger memory-backed folder, or keep the features on disk (feature_storage: mmap)",
    )


def _human(nbytes: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} B"
