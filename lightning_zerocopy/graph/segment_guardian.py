"""A guardian process that unlinks a creator's shared segments when the creator dies before unlinking them.

Between :func:`~lightning_zerocopy.graph.shared_memory.create_shared_tensor` and the creator's ``unlink`` (after
every local process has mapped the segment, about 0.16 s on a 500k-node graph) the segments have names in
``/dev/shm``. Without a guardian, a creator killed in that window (SIGKILL, the OOM killer) leaves them until a later
job's :func:`~lightning_zerocopy.graph.shared_memory.cleanup_stale_segments` runs.

Each process that creates segments starts one guardian on its first segment: a small Python process (standard
library only, in its own session so that Ctrl-C and terminal hang-ups do not reach it; it ignores SIGINT and SIGTERM,
which a scheduler sends to every process of a job it pre-empts, while its creator may still hold named segments) that
reads the creator's
notes through a pipe -- ``+path`` before a segment is created, ``-path`` after it was unlinked -- and, when the
pipe reaches end-of-file (the creator exited or died: the kernel closes its end either way), unlinks every path
still noted. A segment is noted before its file exists, so no instant is left uncovered. A forked child does not
keep its parent's pipe open (it gets a guardian of its own if it creates segments).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Optional

__all__ = ["forget", "guard", "guard_driver_files", "remove_driver_files"]

_lock = threading.Lock()
_pipe: Optional[int] = None  # write end of this process's guardian pipe
_owner: Optional[int] = None  # the pid that started it (a forked child must start its own)
_driver_files_noted: Optional[int] = None  # the pid whose CUDA driver files the guardian removes (guard_driver_files)


def _start() -> int:
    read, write = os.pipe()  # both ends are non-inheritable; the child gets the read end as its stdin
    try:
        os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", "-S", os.path.abspath(__file__), "--guard"],
            dict(os.environ),
            file_actions=[(os.POSIX_SPAWN_DUP2, read, 0)],
            setsid=True,
        )
    finally:
        os.close(read)
    return write


def _send(note: str) -> None:
    global _pipe, _owner
    with _lock:
        if _owner != os.getpid():
            _pipe, _owner = _start(), os.getpid()
        try:
            os.write(_pipe, note.encode() + b"\0")
        except BrokenPipeError:  # the guardian was killed: a new one (cleanup_stale_segments covers older notes)
            os.close(_pipe)
            _pipe = _start()
            os.write(_pipe, note.encode() + b"\0")


def guard(path: str) -> None:
    """Note ``path`` (before creating it): the guardian unlinks it if this process dies before :func:`forget`."""
    _send("+" + os.fspath(path))


def guard_driver_files() -> None:
    """This process shares GPU memory over CUDA IPC: the guardian removes the CUDA driver's
    ``/dev/shm/cuda.shm.<n>.<pid hex>.<k>`` files of this process once it has exited (normally or killed), which the
    driver can leave behind. Once per process."""
    global _driver_files_noted
    if _driver_files_noted != os.getpid():
        _send(f"*{os.getpid()}")
        _driver_files_noted = os.getpid()


def forget(path: str) -> None:
    """The segment ``path`` was unlinked (or handed on): the guardian no longer removes it."""
    if _owner == os.getpid():  # a process that started no guardian has nothing to forget
        _send("-" + os.fspath(path))


def _after_fork_in_child() -> None:
    global _pipe, _owner
    if _pipe is not None:
        os.close(_pipe)  # the parent's guardian must see end-of-file when the parent dies, not when this child does
    _pipe = _owner = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _watch() -> None:
    """The guardian's loop: note paths until end-of-file, then unlink those still noted."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # it ends at end-of-file, after its creator
    noted: set[str] = set()
    driver_pids: set[int] = set()
    pending = b""
    while chunk := os.read(0, 1 << 16):
        *notes, pending = (pending + chunk).split(b"\0")
        for note in notes:
            kind, value = note[:1], note[1:].decode()
            if kind == b"*":
                driver_pids.add(int(value))
            else:
                (noted.add if kind == b"+" else noted.discard)(value)
    for path in noted:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    for pid in driver_pids:
        remove_driver_files(pid)


def remove_driver_files(pid: int, folder: str = "/dev/shm") -> None:
    """Unlink the CUDA driver's IPC files of the exited process ``pid`` (``cuda.shm.<n>.<pid hex>.<k>``)."""
    suffix = f".{pid:x}."
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        parts = name.split(".")
        if (name.startswith("cuda.shm.") and len(parts) == 5 and f".{parts[3]}." == suffix
                and parts[2].isdigit() and parts[4].isdigit()):  # fmt: skip
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


if __name__ == "__main__" and sys.argv[1:] == ["--guard"]:
    _watch()
