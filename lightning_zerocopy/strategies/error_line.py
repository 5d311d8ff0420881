"""The job's one ``error:`` line, however many ranks of a machine see the same fault.

When a rank dies, every other rank of its machine finds out (through its liveness watch, or a collective that
fails) and ends; each used to write the run's ``error:`` line, so four ranks wrote three lines about one death. Now
the first process of the machine to *claim* the line writes it, and the others write theirs as a note
(``[ZeroCopyDDPStrategy] ...``) or not at all. No rank waits for another: each ends as soon as before.

The claim is a byte appended to a file that every rank of the machine holds open: an anonymous memory file
(``memfd``: it has no name, so nothing is left anywhere once the last process holding it ends). Before the ranks
exchange their :class:`~lightning_zerocopy.strategies.liveness.RankInfo`, each makes one (:func:`share`); after the
exchange, each opens the one of the machine's lowest rank through ``/proc/<pid>/fd/<fd>`` (:func:`join`), with its
own file offset. An append moves the end of the file atomically, so exactly one process finds its byte at the start,
whatever order the ranks come in, and the file outlives any rank that dies, the one that made it included. A process
that could not open the file (its maker died first, ``/proc`` hidden) claims through the process group's store (an
atomic ``add``, while the store's rank lives); one that cannot claim at all writes the error line: two lines are
better than none. Ranks that a launcher starts (Lightning's, through
:class:`~lightning_zerocopy.strategies.launcher.ZeroCopyScriptLauncher`) open the launcher's file as they start
(:func:`hand_down`, :func:`take_up`), so that a launcher dying during the rendezvous is named once too (where it dies
before a rank could open its file, that rank claims alone).

A process decides once, at its first claim, which comes before anything that could make another rank end, so the
first claimant names the rank that died, not a rank that ended on its account:

* a rank stopping on an error of its own (not an interrupt, not another rank's): as it announces it
  (:meth:`~lightning_zerocopy.strategies.liveness.RankLiveness.announce`), before its exit note is readable, so the
  ranks that then stop on its account write notes;
* a rank whose watch finds a peer gone, or failed: then, before it acts on it;
* the command, writing a run fault (:func:`write_fault_line`), if the process has not decided yet.

A rank stopping on Ctrl-C or SIGTERM claims nothing (the interrupt's own line names the cause). Each machine has a
file of its own: a job over several machines writes one line on each (each machine's ranks write to its console).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Optional

__all__ = [
    "ENV",
    "NOTE_PREFIX",
    "claim",
    "error_line_written",
    "hand_down",
    "join",
    "line_prefix",
    "say",
    "share",
    "take_up",
    "write_fault_line",
]

#: Set by a launcher for the ranks it starts: ``<pid>:<fd>`` of its claim file (see :func:`share`).
ENV = "LZC_ERROR_LINE"
#: How a rank's line starts where it is not the job's error line.
NOTE_PREFIX = "[ZeroCopyDDPStrategy] "
_MEMFD_NAME = "lzc-error-line"
_STORE_KEY = "lightning_zerocopy/liveness/error_line"

_lock = threading.RLock()  # the watch's thread and the main thread may claim at once
_made: Optional[int] = None  # the claim file this process made (kept open: the others open it through /proc)
_claim_fd: Optional[int] = None  # this process's own opening of the machine's claim file (append only)
_store: Any = None
_decided: Optional[bool] = None
_written = threading.Event()


def share() -> Optional[str]:
    """A new claim file made by this process, as ``"<pid>:<fd>"`` for the ranks of its machine to :func:`join`
    (``None`` where the system makes none). A later :func:`join` starts a new decision."""
    global _made
    try:
        fd = os.memfd_create(_MEMFD_NAME, os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # not Linux
        return None
    with _lock:
        previous, _made = _made, fd
    if previous is not None:
        os.close(previous)  # those who joined it hold their own opening
    return f"{os.getpid()}:{fd}"


def join(reference: Optional[str], store: Any = None) -> bool:
    """Claim through the file ``reference`` names (from :func:`share`, of the machine's lowest rank), or through
    ``store`` (``add``) where it cannot be opened; this process has not decided yet. Returns whether the file was
    opened (else a file opened earlier, the launcher's, stays in use)."""
    global _claim_fd, _store, _decided
    opened = _open(reference) if reference else None
    with _lock:
        if opened is not None:
            previous, _claim_fd = _claim_fd, opened
            if previous is not None:
                os.close(previous)
        _store = store
        _decided = None
    return opened is not None


def hand_down() -> None:
    """This process starts the other ranks of its machine next: they claim through its file (:data:`ENV`, which they
    inherit), opened as they start (:func:`take_up`), and so does this process."""
    reference = share()
    if reference is not None and join(reference):
        os.environ[ENV] = reference
    else:
        os.environ.pop(ENV, None)


def take_up(launcher: int) -> None:
    """This process is a rank that process ``launcher`` started: claim through the launcher's file
    (:func:`hand_down`), if it has one and still runs."""
    reference = os.environ.get(ENV, "")
    if reference.startswith(f"{launcher}:"):
        join(reference)


def claim() -> bool:
    """Whether this process writes the job's error line: decided at the first call (the first process of the
    machine to claim), the same answer afterwards. ``True`` where there is no one to share the line with, or no way
    to claim it."""
    global _decided
    with _lock:
        if _decided is None:
            _decided = _take()
        return _decided


def error_line_written() -> None:
    """The command calls this as it writes the run's ``error:`` line for an exception: a watch that must still end
    the process afterwards writes its line as a note, not as a second error line."""
    _written.set()


def line_prefix() -> str:
    """How a line of a watch that ends the process starts: ``error: `` if it is the job's error line (this process
    holds the claim, and the command has not written its line), else :data:`NOTE_PREFIX`."""
    return "error: " if claim() and not _written.is_set() else NOTE_PREFIX


def say(line: str) -> None:
    """``line`` and its newline to stderr in one write: the ranks of a machine share the launcher's stderr, and
    ``print`` writes the text and the newline apart (two writes when unbuffered), so two ranks ending at once could
    run their lines together (``...: exitingerror: rank 1 ...``) and a line would no longer start with ``error:``."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def write_fault_line(exception: BaseException, hint: str) -> None:
    """The command's line for a run fault (another rank's or the pipeline worker's death, ``exception``): the job's
    error line followed by ``hint`` where this process holds the claim, else a note, or nothing where the watch
    already wrote that note (a collective's error it tied to the gone rank)."""
    named = getattr(exception, "peer_rank_exit", None)
    first = claim()
    error_line_written()
    if first:
        sys.stderr.write(f"error: {named or exception}\n{hint}\n")
    elif not isinstance(named, str):
        sys.stderr.write(f"{NOTE_PREFIX}{exception}\n")
    sys.stderr.flush()


def _open(reference: str) -> Optional[int]:
    """This process's own opening (append only) of the claim file ``"<pid>:<fd>"``, or ``None``."""
    pid, _, fd = reference.partition(":")
    path = f"/proc/{pid}/fd/{fd}"
    try:
        if not os.readlink(path).startswith(f"/memfd:{_MEMFD_NAME}"):
            return None  # the process is gone and its pid and descriptor name something else
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except OSError:
        return None


def _take() -> bool:
    if _claim_fd is not None:
        try:
            os.write(_claim_fd, b"x")
            return os.lseek(_claim_fd, 0, os.SEEK_CUR) == 1  # the append and the move of the end are one step
        except OSError:
            pass
    if _store is not None:
        try:
            return int(_store.add(_STORE_KEY, 1)) == 1
        except Exception:  # noqa: BLE001 - the store went with its host rank
            pass
    return True
