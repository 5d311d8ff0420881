"""A rank that dies takes the job down with an error that names it.

Without this, the ranks left behind wait in their next collective until the process-group timeout (30 minutes by
default), and Lightning's own watcher runs only on local rank 0 and only for the ranks it launched. The watch
polls the other ranks *of this machine* (their pids, exchanged once through the process group) every
``interval`` seconds; when one is gone (or a zombie) it raises :class:`PeerRankExited` in the main thread (through
a signal, which also interrupts a blocking wait), and if the main thread is stuck in a native collective it ends
the process after ``grace`` seconds. Ranks on other machines are left to the collectives' own errors.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

__all__ = ["PeerRankExited", "RankLiveness", "RankInfo", "process_alive"]

_SIGNAL = signal.SIGUSR2  # Lightning uses SIGUSR1 (SLURM requeue) and SIGTERM


class PeerRankExited(RuntimeError):
    """Another rank of the job exited while this one was still running."""


@dataclass(frozen=True)
class RankInfo:
    """Where a rank runs: its global rank, host name and pid."""

    rank: int
    host: str
    pid: int

    @classmethod
    def here(cls, rank: int) -> "RankInfo":
        return cls(rank=rank, host=socket.gethostname(), pid=os.getpid())


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (an exited, unreaped child -- a zombie -- counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True  # no /proc: os.kill said it exists


class RankLiveness:
    """Watches the other ranks of this machine; see the module docstring.

    Args:
        me: this rank.
        ranks: every rank of the job (only those on this host are watched).
        interval: seconds between polls.
        grace: seconds the process gets, once a rank is gone, to raise and exit; then it ends with exit code 1.
        alive: how a pid is judged alive (for tests).
    """

    def __init__(
        self,
        me: RankInfo,
        ranks: Sequence[RankInfo],
        interval: float = 0.5,
        grace: float = 10.0,
        alive: Callable[[int], bool] = process_alive,
    ) -> None:
        self.me = me
        self.peers = [r for r in ranks if r.host == me.host and r.pid != me.pid]
        self.interval = float(interval)
        self.grace = float(grace)
        self._alive = alive
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._previous_handler: Any = None
        self.message: Optional[str] = None

    def start(self) -> None:
        """Start watching (call from the main thread: it installs the signal handler). Idempotent."""
        if self._thread is not None or not self.peers:
            return
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(_SIGNAL, self._raise_in_main)
        self._thread = threading.Thread(target=self._watch, name="zerocopy-rank-liveness", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before this rank leaves its last collective, so that ranks exiting normally after it are
        not taken for dead). Idempotent."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.interval + 1)
        if self._previous_handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(_SIGNAL, self._previous_handler)
            self._previous_handler = None

    def check(self) -> Optional[RankInfo]:
        """The first watched rank that is gone, or ``None``."""
        for peer in self.peers:
            if not self._alive(peer.pid):
                return peer
        return None

    def describe(self, dead: RankInfo) -> str:
        """The one-line error for ``dead``."""
        return (
            f"rank {dead.rank} (pid {dead.pid} on {dead.host}) exited while rank {self.me.rank} was running; "
            f"stopping rank {self.me.rank}"
        )

    def explain(self, exception: BaseException, wait: float = 2.0) -> Optional[str]:
        """If a watched rank is gone (checked for up to ``wait`` seconds: a collective can fail the moment a peer's
        socket closes, before the peer is reaped), prefix ``exception``'s message with :meth:`describe` and return
        that line; else ``None``. For errors of collectives (e.g. gloo's "Connection reset by peer") that do not
        say which rank went away."""
        if isinstance(exception, PeerRankExited):
            return None
        deadline = time.monotonic() + wait
        dead = self.check()
        while dead is None and time.monotonic() < deadline:
            time.sleep(0.05)
            dead = self.check()
        if dead is None:
            return None
        line = self.describe(dead)
        if exception.args and isinstance(exception.args[0], str):
            exception.args = (f"{line}. {exception.args[0]}", *exception.args[1:])
        print(f"[ZeroCopyDDPStrategy] {line}", file=sys.stderr, flush=True)
        return line

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            dead = self.check()
            if dead is None or self._stop.is_set():
                continue
            self.message = self.describe(dead)
            print(f"[ZeroCopyDDPStrategy] {self.message}", file=sys.stderr, flush=True)
            if self._previous_handler is not None or signal.getsignal(_SIGNAL) == self._raise_in_main:
                os.kill(os.getpid(), _SIGNAL)
            # the exception path gets `grace` seconds (it may itself wait in a collective with the dead rank)
            threading.Event().wait(self.grace)
            print(
                f"[ZeroCopyDDPStrategy] rank {self.me.rank} did not exit within {self.grace:.0f} s of rank "
                f"{dead.rank}'s exit: exiting",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)

    def _raise_in_main(self, signum: int, frame: Any) -> None:
        raise PeerRankExited(self.message or "another rank of this machine exited")
