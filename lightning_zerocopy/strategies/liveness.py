"""A rank that dies takes the job down with an error that names it.

Without this, the ranks left behind wait in their next collective until the process-group timeout (30 minutes by
default), and Lightning's own watcher runs only on local rank 0 and only for the ranks it launched. The watch
polls the other ranks *of this machine* (their pids, exchanged once through the process group) every
``interval`` seconds; when one is gone (or a zombie) it raises :class:`PeerRankExited` in the main thread (through
a signal, which also interrupts a blocking wait), and if the main thread is stuck in a native collective it ends
the process after ``grace`` seconds. Ranks on other machines are left to the collectives' own errors.

Before the process group exists (the rendezvous), the ranks have not exchanged pids yet, but a launch knows some:
the process that launched this machine's other ranks (Lightning's launcher, which is local rank 0) knows its
children, and each child knows its launcher (:data:`LAUNCHER_ENV`). A launch watch
(:func:`~lightning_zerocopy.strategies.liveness_lifecycle.launch_watch`) watches those from the process's start, so
a rank that dies during the rendezvous stops the others instead of leaving them waiting for the rendezvous timeout;
:meth:`RankLiveness.watch` then switches to every rank of the machine.

Why a rank stopped: a rank that stops on an exception first leaves a one-line *exit note* in the process group's
key-value store (:meth:`RankLiveness.announce`): ``interrupted (SIGINT)`` / ``interrupted (SIGTERM)`` for Ctrl-C
and Lightning's SIGTERM, else the exception's first line (e.g. the pipeline worker's pid and signal). The watch
polls the notes of the ranks it watches too, and a rank that announces waits (at most ``2 * interval + 1`` s) until
every live peer has read its note. So whichever rank fails first, the error every other rank of the machine raises
names the root cause, and a Ctrl-C reads "rank 1 ... was interrupted (SIGINT)" instead of blaming a rank that was
interrupted like this one. A rank that is itself stopping (interrupted, or failed) is not interrupted again by a
peer's note or exit. Of the ranks of a machine that stop on one cause, one writes the job's ``error:`` line and the
others notes (:mod:`~lightning_zerocopy.strategies.error_line`).

This module is the watch itself (:class:`RankLiveness`) and what it knows of a rank (:class:`RankInfo`,
:func:`process_alive`); what a stopping rank says and how a cause is read is :mod:`~lightning_zerocopy.strategies.exit_notes`; when a process starts, switches over and stops its watch (at launch, once the process group
exists, at the end of the run) is :mod:`~lightning_zerocopy.strategies.liveness_lifecycle`.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from lightning_zerocopy.data.process_group_exit import abort_collectives
from lightning_zerocopy.process_state import process_alive
from lightning_zerocopy.strategies.error_line import NOTE_PREFIX, claim, error_line_written, line_prefix, say
from lightning_zerocopy.strategies.exit_notes import (
    PeerRankExited,
    caused_by_a_peer,
    exit_note,
    is_interrupt,
    is_interrupt_note,
)
from lightning_zerocopy.strategies.shard_readers import kill_pipeline_workers, stop_workers_reading

__all__ = [
    "LAUNCHER_ENV",
    "RankLiveness",
    "RankInfo",
    "error_line_written",
    "process_alive",
]

_SIGNAL = signal.SIGUSR2  # Lightning uses SIGUSR1 (SLURM requeue) and SIGTERM


#: where exit notes and their acknowledgements live in the process group's store
_NOTE_KEY = "lightning_zerocopy/liveness/note/{rank}"
_ACK_KEY = "lightning_zerocopy/liveness/ack/{rank}/{reader}"
#: Set by the process that launches this machine's other ranks (to its pid), before it starts them: a rank whose
#: parent has this pid knows its launcher, and stops if the launcher dies.
LAUNCHER_ENV = "LZC_LAUNCHER_PID"


@dataclass(frozen=True)
class RankInfo:
    """Where a rank runs: its global rank, host name and pid."""

    rank: int
    host: str
    pid: int

    @classmethod
    def here(cls, rank: int) -> "RankInfo":
        return cls(rank=rank, host=socket.gethostname(), pid=os.getpid())


class RankLiveness:
    """Watches the other ranks of this machine; see the module docstring.

    Args:
        me: this rank.
        ranks: every rank of the job (only those on this host are watched).
        interval: seconds between polls.
        grace: seconds the process gets, once a rank is gone, to raise and exit; then it ends with exit code 1.
        starting: the watch starts before the process group exists (the peers are the launch's, see
            :func:`~lightning_zerocopy.strategies.liveness_lifecycle.launch_watch`); messages say the rank was
            starting until :meth:`watch` is called.
        alive: how a pid is judged alive (for tests).
        store: the process group's key-value store (``set``/``get``/``check``, e.g. a ``torch.distributed``
            ``TCPStore``) for exit notes; ``None``: no notes (a gone rank is only said to have exited).
        stopping: whether this rank is already stopping on an exception of its own (e.g. Lightning's trainer status
            is ``INTERRUPTED``); such a rank is not interrupted again by a peer.
    """

    def __init__(
        self,
        me: RankInfo,
        ranks: Sequence[RankInfo],
        interval: float = 0.5,
        grace: float = 6.0,
        alive: Callable[[int], bool] = process_alive,
        store: Any = None,
        stopping: Callable[[], bool] = lambda: False,
        starting: bool = False,
    ) -> None:
        self.me = me
        self.peers = _machine_peers(me, ranks)
        self.starting = starting
        self.interval = float(interval)
        self.grace = float(grace)
        self._alive = alive
        self._store = store
        self._stopping = stopping
        self._announced = False
        self._interrupted = False  # this rank stops on Ctrl-C or SIGTERM: the job's line is the interrupt's
        self._notes: dict[int, str] = {}  # exit notes of peers, as read
        self._readers: frozenset[int] = frozenset()  # the peers that read this rank's own exit note (see explain)
        self._gone: Optional[RankInfo] = None  # the first peer found gone (see check)
        self._mapped: frozenset[int] = frozenset()  # ranks whose GPU memory this process reads (see depend_on)
        self._pidfds: dict[int, int] = {}  # pid -> process file descriptor of a mapped rank (see _pause)
        self._stop = threading.Event()
        self._settled = threading.Event()  # the watch polls no more: it ended, or it runs out its grace (see stop)
        self._wake: Optional[tuple[int, int]] = None  # a pipe that ends a pidfd wait when the watch stops (_pause)
        self._thread: Optional[threading.Thread] = None
        self._previous_handler: Any = None
        self.message: Optional[str] = None

    def start(self) -> None:
        """Start watching (call from the main thread: it installs the signal handler). Idempotent."""
        if self._thread is not None or not self.peers:
            return
        self._settled.clear()
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(_SIGNAL, self._raise_in_main)
        self._thread = threading.Thread(target=self._watch, name="zerocopy-rank-liveness", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before this rank leaves its last collective, so that ranks exiting normally after it are
        not taken for dead). Idempotent.

        Returns once the watch polls no more. A watch that already acts on a gone rank runs out its ``grace`` in the
        background (it still ends a process whose exception path hangs): waiting for it to end, as a join did, held
        a stopping rank for ``interval + 1`` s (issue 42: rank 0 of ``kill_worker1``)."""
        self._stop.set()
        if self._wake is not None:
            os.write(self._wake[1], b"x")
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            self._settled.wait(timeout=self.interval + 1)
        if self._previous_handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(_SIGNAL, self._previous_handler)
            self._previous_handler = None

    def watch(
        self,
        ranks: Sequence[RankInfo],
        store: Any = None,
        stopping: Optional[Callable[[], bool]] = None,
        me: Optional[RankInfo] = None,
    ) -> None:
        """From now on watch ``ranks`` (every rank of the job, exchanged once the process group exists; those of
        this machine are watched), with the process group's ``store`` for exit notes; ``me``: this rank as the
        process group numbers it (a launch watch may have guessed its global rank)."""
        if me is not None:
            self.me = me
        self.peers = _machine_peers(self.me, ranks)
        self._gone = None
        if store is not None:
            self._store = store
        if stopping is not None:
            self._stopping = stopping
        self.starting = False

    def depend_on(self, ranks: "set[int] | frozenset[int]") -> None:
        """This process reads GPU memory that the processes of ``ranks`` own (a clique cache's peer shards).

        When such a rank dies, the driver frees its memory under this process's running kernels: its CUDA context
        is broken (every later call fails), so no exception path can end it cleanly. The watch then says which rank
        went, stops this process's pipeline workers and ends the process at once (exit status 1); the guardians of
        the host memory and the MPS supervisor do the rest. When it leaves an exit note instead (it is stopping),
        the watch stops the workers at once too (:mod:`~lightning_zerocopy.strategies.shard_readers`)."""
        self._mapped = frozenset(int(r) for r in ranks if r != self.me.rank)

    @property
    def mapped_peers(self) -> list[RankInfo]:
        """The watched ranks whose GPU memory this process reads (:meth:`depend_on`)."""
        return [peer for peer in self.peers if peer.rank in self._mapped]

    @property
    def store(self) -> Any:
        """The process group's key-value store the watch uses (``None``: none)."""
        return self._store

    def alive(self, pid: int) -> bool:
        """Whether ``pid`` is judged alive (the watch's own test)."""
        return self._alive(pid)

    def check(self) -> Optional[RankInfo]:
        """The first watched rank found gone (the same one from then on), else the first that has left an exit note,
        else ``None``.

        A gone rank comes first: when one rank dies, every survivor's next collective fails at once, and a survivor
        that leaves its note ("failed: Connection reset by peer") before the others look must not be blamed for the
        death it only reports. The first one found stays the one named: a rank that ended on its account afterwards
        (they end at once, see :mod:`~lightning_zerocopy.strategies.error_line`) is gone too by the time this rank
        explains its own error, and may come before it in rank order."""
        if self._gone is None:
            self._gone = next((peer for peer in self.peers if not self._alive(peer.pid)), None)
        if self._gone is not None:
            return self._gone
        for peer in self.peers:
            if self.note_of(peer) is not None:
                return peer
        return None

    def note_of(self, peer: RankInfo) -> Optional[str]:
        """``peer``'s exit note, if it left one (read once from the store, then acknowledged)."""
        note = self._notes.get(peer.rank)
        if note is not None or self._store is None:
            return note
        key = _NOTE_KEY.format(rank=peer.rank)
        try:
            if not self._store.check([key]):
                return None
            note = self._store.get(key).decode("utf-8", "replace")
            self._store.set(_ACK_KEY.format(rank=peer.rank, reader=self.me.rank), "1")
        except Exception:  # noqa: BLE001 - the store went with its host rank: no note to read
            return None
        self._notes[peer.rank] = note
        return note

    def announce(self, exception: BaseException) -> None:
        """Leave this rank's exit note for ``exception`` (first thing when it stops on one), then wait until every
        live watched peer has read it, at most ``2 * interval + 1`` seconds. Once; later calls do nothing.

        An error of this rank's own (not an interrupt, not a peer's) claims the job's error line first
        (:mod:`~lightning_zerocopy.strategies.error_line`): the ranks that stop on its note write theirs as notes.

        A rank stopping on a peer's account leaves its note and does not wait: the cause is that peer's, which the
        others read from it, and the survivors' watches, already stopping too, no longer acknowledge notes (issue 42:
        with 4 ranks, two survivors of ``kill_worker1`` each waited out the 2 s, holding the fourth in a collective)."""
        if not self._announced and is_interrupt(exception):
            self._interrupted = True
        elif not self._announced and not caused_by_a_peer(exception):
            self.check()  # a peer already gone is the one this rank's explain() names (before any other ends)
            claim()
        if self._announced or self._store is None:
            self._announced = True
            return
        self._announced = True
        try:
            self._store.set(_NOTE_KEY.format(rank=self.me.rank), exit_note(exception))
        except Exception:  # noqa: BLE001 - no store (its host rank is gone): the peers see only the exit
            return
        if caused_by_a_peer(exception):
            return
        deadline = time.monotonic() + 2 * self.interval + 1.0
        while time.monotonic() < deadline:
            waiting = [p for p in self.peers if self._alive(p.pid) and p.rank not in self._notes]
            try:
                if not waiting or self._store.check([_ACK_KEY.format(rank=self.me.rank, reader=p.rank) for p in waiting]):
                    break
            except Exception:  # noqa: BLE001
                return
            time.sleep(0.05)
        try:
            acks = {p.rank: _ACK_KEY.format(rank=self.me.rank, reader=p.rank) for p in self.peers}
            self._readers = frozenset(rank for rank, key in acks.items() if self._store.check([key]))
        except Exception:  # noqa: BLE001 - the store went meanwhile
            pass

    def describe(self, dead: RankInfo) -> str:
        """The one-line error for ``dead`` (gone, or stopping with an exit note)."""
        where = f"rank {dead.rank} (pid {dead.pid} on {dead.host})"
        note = self.note_of(dead)
        if is_interrupt_note(note):
            return f"{where} was {note}; stopping rank {self.me.rank}"
        if note is not None:
            return f"{where} failed while rank {self.me.rank} was running: {note}; stopping rank {self.me.rank}"
        doing = "starting" if self.starting else "running"
        return f"{where} exited while rank {self.me.rank} was {doing}; stopping rank {self.me.rank}"

    def explain(self, exception: BaseException, wait: float = 2.0) -> Optional[str]:
        """If a watched rank is gone (checked for up to ``wait`` seconds: a collective can fail the moment a peer's
        socket closes, before the peer is reaped), prefix ``exception``'s message with :meth:`describe` and return
        that line; else ``None``. For errors of collectives (e.g. gloo's "Connection reset by peer") that do not
        say which rank went away. A rank that read this rank's exit note before it went (or left its own) stopped
        on this rank's account: it explains nothing (the pipeline worker's death on this rank stays the cause); so
        where every watched rank read it, there is nothing to wait for (that wait held rank 1 of ``kill_worker1``
        for ``wait`` seconds, issue 42)."""
        if isinstance(exception, PeerRankExited) or is_interrupt(exception):
            return None  # already names the rank; or this rank was interrupted itself (Ctrl-C reaches every rank)
        if self.peers and all(peer.rank in self._readers for peer in self.peers):
            return None
        deadline = time.monotonic() + wait
        dead = self.check()
        while dead is None and time.monotonic() < deadline:
            time.sleep(0.05)
            dead = self.check()
        if dead is None or dead.rank in self._readers:
            return None
        line = self.describe(dead)
        if exception.args and isinstance(exception.args[0], str):
            exception.args = (f"{line}. {exception.args[0]}", *exception.args[1:])
        try:
            exception.peer_rank_exit = line  # see caused_by_a_peer
        except AttributeError:  # an exception type without a __dict__
            pass
        say(f"[ZeroCopyDDPStrategy] {line}")
        return line

    def _watch(self) -> None:
        try:
            self._poll()
        finally:
            self._settled.set()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._pause()
            if self._stop.is_set():
                break
            mapped = self._mapped_gone()  # first, and before any store call: a broken shard is read meanwhile
            if mapped is not None:
                self._end_now(mapped)
            dead = self.check()
            if dead is None:
                continue
            if self._announced or self._stopping():
                continue  # this rank is stopping on its own exception already: let it finish (explain() names peers)
            self.message = self.describe(dead)
            claim()  # now, before this rank's line (the command's, or the grace's below) says whether it is the error
            if self._previous_handler is not None or signal.getsignal(_SIGNAL) == self._raise_in_main:
                os.kill(os.getpid(), _SIGNAL)  # PeerRankExited carries the message
            else:
                say(f"[ZeroCopyDDPStrategy] {self.message}")
            abort_collectives()  # a collective the peer never joins would hold the main thread where no signal lands
            if dead.rank in self._mapped and not is_interrupt_note(self.note_of(dead)):
                stop_workers_reading(self._store, self.me.rank)  # its shards go with it (after the signal: the error
                # stays the peer's, not a worker's); it waits for this rank's word (shard_readers)
            # the exception path gets `grace` seconds (it may itself wait in a collective with the dead rank, or the
            # rendezvous may hold the main thread in native code, where no Python signal handler runs)
            self._settled.set()
            self._wait_out_grace()
            say(f"{line_prefix()}{self.message}; rank {self.me.rank} did not exit within {self.grace:.0f} s: exiting")
            os._exit(1)

    def _wait_out_grace(self) -> None:
        """``grace`` seconds for this rank's exception path, cut short by :meth:`_end_now` when a rank whose GPU
        memory this process reads exits meanwhile (the moment it exits, as in :meth:`_pause`): after that, the
        exception path's CUDA calls may never return (a peer that failed and announced it is still alive when this
        rank starts stopping, and exits soon after)."""
        deadline = time.monotonic() + self.grace
        while (left := deadline - time.monotonic()) > 0:
            gone = self._mapped_gone()
            if gone is not None:
                self._end_now(gone)
            self._wait_on_mapped(min(self.interval, left), stoppable=False)  # stop() does not end the grace

    def _pause(self) -> None:
        """One ``interval`` between polls, cut short the moment a rank whose GPU memory this process reads exits.

        Every kernel this process or its pipeline worker starts between that exit and the watch's next look reads
        freed memory (an illegal memory access, printed as the context's teardown warnings); a 0.5 s poll left room
        for many such kernels (issue 42: SIGKILL of rank 0 on 4 GPUs under ``clique``). So the watch waits on a
        process file descriptor of each such rank (``pidfd``, Linux 5.3+), which becomes readable as it exits, and
        only sleeps where there is none; :meth:`stop` ends the wait through a pipe of its own."""
        self._wait_on_mapped(self.interval, stoppable=True)

    def _wait_on_mapped(self, seconds: float, stoppable: bool) -> None:
        """``seconds``, ended by a mapped rank's exit, and by :meth:`stop` if ``stoppable``."""
        fds = self._mapped_pidfds()
        if not fds:
            if stoppable:
                self._stop.wait(seconds)
            else:
                time.sleep(seconds)
            return
        if stoppable and self._wake is None:
            self._wake = os.pipe()  # kept for the process's life, like the pidfds
        poller = select.poll()
        for fd in (*fds, self._wake[0]) if stoppable else fds:
            poller.register(fd, select.POLLIN)
        if not (stoppable and self._stop.is_set()):  # (stop() may have looked for the pipe before it existed)
            poller.poll(seconds * 1000.0)

    def _mapped_pidfds(self) -> list[int]:
        """Process file descriptors of the live mapped ranks, opened once each (kept for the process's life: a few)."""
        fds: list[int] = []
        for peer in self.peers:
            if peer.rank not in self._mapped or not hasattr(os, "pidfd_open"):
                continue
            fd = self._pidfds.get(peer.pid)
            if fd is None:
                try:
                    fd = os.pidfd_open(peer.pid)
                except OSError:  # gone already (the next look finds it), or a kernel without pidfds
                    continue
                self._pidfds[peer.pid] = fd
            fds.append(fd)
        return fds

    def _mapped_gone(self) -> Optional[RankInfo]:
        """The first gone rank whose GPU memory this process reads, else ``None``."""
        return next((p for p in self.peers if p.rank in self._mapped and not self._alive(p.pid)), None)

    def _end_now(self, dead: RankInfo) -> None:
        """A rank whose GPU memory this process reads is gone: see :meth:`depend_on`. The line is the job's error
        line if this process holds it (:func:`~lightning_zerocopy.strategies.error_line.line_prefix`), else a note
        (so also where this rank stops on an interrupt, which names the cause)."""
        prefix = NOTE_PREFIX if self._interrupted else line_prefix()
        say(
            f"{prefix}rank {dead.rank} (pid {dead.pid} on {dead.host}) exited while rank {self.me.rank} "
            f"was running, and the GPU memory of it that rank {self.me.rank} reads went with it: stopping rank "
            f"{self.me.rank} now"
        )
        try:
            kill_pipeline_workers()
        finally:
            os._exit(1)

    def _raise_in_main(self, signum: int, frame: Any) -> None:
        stopping = sys.exc_info()[1]  # what the main thread is handling where the signal landed (a finally included)
        if stopping is not None and is_interrupt(stopping):
            # Ctrl-C reached this rank too and is on its way out (the job's SIGINT ends every rank): a peer's note,
            # read before this rank announced its own, must not replace it (Lightning's report, no rank blamed)
            return
        raise PeerRankExited(self.message or "another rank of this machine exited")


def _machine_peers(me: RankInfo, ranks: Sequence[RankInfo]) -> list[RankInfo]:
    return [r for r in ranks if r.host == me.host and r.pid != me.pid]
