"""Whether another process of this machine still runs, for the processes that outlive or watch others (the MPS
daemon's supervisor, the pipeline worker's parent watch, the ranks' liveness watch, stale shared memory and cache
build folders).

A process counts as gone when it no longer exists, when it is a zombie (exited, not yet reaped by its parent), and
when it is *dying*: its main thread is exiting or it is writing its core dump. The last case matters on a GPU: a
SIGABRT (or SIGSEGV) makes the kernel write the whole address space of the process to a core file before the
process ends; a CUDA process with pinned buffers maps many gigabytes, and on a machine whose ``ulimit -c`` allows
cores, writing them takes minutes (a 6 GB process took 37 s on this CPU machine). A watcher that waits for the pid to
vanish then keeps the MPS daemon and the pipeline worker running all that time, though the dying process will never
run another step.

Standard library only: the MPS supervisor runs ``mps.py`` alone (``python -I``) and loads this file by its path.
"""

from __future__ import annotations

import os
from typing import Optional

__all__ = ["PF_DUMPCORE", "PF_EXITING", "exit_signal", "process_alive", "process_dying", "process_ended"]

#: ``task_struct.flags`` bits (``include/linux/sched.h``), field 9 of ``/proc/<pid>/stat``: getting shut down, and
#: dumped core (set while the core is written, before the process exits).
PF_EXITING = 0x00000004
PF_DUMPCORE = 0x00000200


def _stat(pid: int, task: str = "") -> Optional[list[str]]:
    """The fields of ``/proc/<pid>/stat`` (of its thread ``task/<tid>`` if given) after the command name (state
    first, flags seventh), or ``None``."""
    try:
        with open(f"/proc/{pid}/{task}stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_dying(pid: int) -> bool:
    """Whether ``pid`` exists but ends: a zombie or dead task, or its main thread exiting or writing a core dump."""
    fields = _stat(pid)
    if fields is None or len(fields) < 7:
        return False
    if fields[0] in ("Z", "X", "x"):
        return True
    try:
        flags = int(fields[6])
    except ValueError:
        return False
    return bool(flags & (PF_EXITING | PF_DUMPCORE))


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs and is not dying (:func:`process_dying`); a process of another user counts as running.
    Without ``/proc``, whether the pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else: /proc still tells whether it ends
    except OSError:
        return False
    return not process_dying(pid)


def process_ended(pid: int) -> bool:
    """Whether nothing of ``pid`` runs any more: it no longer exists, or every thread of it is a zombie (its files
    and memory, a CUDA context included, are released; only its exit status waits for its parent). A process that is
    still exiting (:func:`process_dying`) has not ended: closing a CUDA context's device files can take seconds, and
    its main thread may be a zombie while another thread still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # gone meanwhile (or no /proc: the pid exists, so it runs)
        return os.path.isdir("/proc") and not os.path.exists(f"/proc/{pid}")
    for tid in tasks:
        fields = _stat(pid, f"task/{tid}/")
        if fields is not None and fields[0] not in ("Z", "X", "x"):
            return False
    return True


#: index in :func:`_stat`'s fields of ``exit_code`` (field 52 of ``/proc/<pid>/stat``, Linux 3.5+): the status waitpid
#: will report, set when the process starts exiting
_EXIT_CODE = 49


def exit_signal(pid: int) -> Optional[int]:
    """The signal that ends ``pid`` while it is still exiting (:func:`process_dying`), read from the exit status the
    kernel keeps from the start of its exit, before waitpid can report it; ``None`` when it is not exiting, ends by an
    exit code, or the status cannot be read. A SIGKILLed CUDA process can take seconds to end after its pipes closed."""
    if not process_dying(pid):
        return None
    fields = _stat(pid)
    if fields is None or len(fields) <= _EXIT_CODE:
        return None
    try:
        status = int(fields[_EXIT_CODE])
    except ValueError:
        return None
    return status & 0x7F or None
