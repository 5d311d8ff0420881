"""The liveness watch: which ranks it watches, how it judges a process, and the error it raises in the main thread."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from lightning_zerocopy.strategies.exit_notes import PeerRankExited
from lightning_zerocopy.strategies.liveness import RankInfo, RankLiveness, process_alive
from lightning_zerocopy.strategies.shard_readers import DONE_KEY


def test_watches_only_the_other_ranks_of_this_host() -> None:
    me = RankInfo(0, "a", 10)
    watch = RankLiveness(me, [me, RankInfo(1, "a", 11), RankInfo(2, "b", 12)])
    assert [p.rank for p in watch.peers] == [1]


def test_a_zombie_counts_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while process_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(child.pid)  # exited, not yet reaped
    child.wait()
    assert process_alive(os.getpid())


def test_a_gone_peer_raises_in_the_main_thread_naming_it() -> None:
    alive = {11: True}
    me = RankInfo(0, "host", os.getpid())
    watch = RankLiveness(me, [me, RankInfo(3, "host", 11)], interval=0.05, grace=1e9, alive=lambda pid: alive[pid])
    watch.start()
    try:
        assert watch.check() is None
        alive[11] = False
        with pytest.raises(PeerRankExited, match=r"rank 3 \(pid 11 on host\) exited while rank 0 was running"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        watch.stop()


def test_a_collective_error_is_explained_with_the_gone_rank() -> None:
    me = RankInfo(1, "host", os.getpid())
    watch = RankLiveness(me, [RankInfo(0, "host", 99), me], alive=lambda pid: pid != 99)
    error = RuntimeError("Connection reset by peer")
    assert watch.explain(error, wait=0) is not None
    assert str(error) == "rank 0 (pid 99 on host) exited while rank 1 was running; stopping rank 1. Connection reset by peer"
    healthy = RankLiveness(me, [RankInfo(0, "host", 98), me], alive=lambda pid: True)
    other = RuntimeError("boom")
    assert healthy.explain(other, wait=0) is None and str(other) == "boom"



def test_the_dead_rank_is_blamed_not_a_survivor_that_reported_first() -> None:
    """One rank of four killed: every survivor's next collective fails at once, and a survivor may leave its note
    ("failed: Connection reset by peer") before this one looks. The dead rank is named, not the reporter."""
    import torch.distributed as dist

    store = dist.HashStore()
    ranks = [RankInfo(r, "host", 100 + r) for r in range(4)]
    alive = lambda pid: pid != 102  # noqa: E731 - rank 2 was killed
    rank0, rank1 = (RankLiveness(ranks[r], ranks, store=store, alive=alive, interval=0.05) for r in (0, 1))
    rank1.announce(RuntimeError("[gloo] Read error: Connection reset by peer"))  # the survivor reports first
    assert rank0.note_of(ranks[1]) is not None  # its note is there to read
    error = RuntimeError("[gloo] Read error: Connection reset by peer")
    assert rank0.explain(error, wait=0) == "rank 2 (pid 102 on host) exited while rank 0 was running; stopping rank 0"
    # with nobody dead, the reporter's note is what there is to say
    calm = RankLiveness(ranks[3], ranks, store=store, alive=lambda pid: True)
    assert calm.check() == ranks[1]

# ---- exit notes: why a rank stopped (issue 22, Faults) ----


def test_exit_notes_say_interrupted_for_sigint_and_sigterm_else_the_error() -> None:
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    from lightning_zerocopy.strategies.exit_notes import exit_note

    assert exit_note(KeyboardInterrupt()) == "interrupted (SIGINT)"
    assert exit_note(SIGTERMException()) == "interrupted (SIGTERM)"
    from lightning_zerocopy.preemption import PreemptedNow  # a second SIGTERM, or one before training

    assert exit_note(PreemptedNow(143)) == "interrupted (SIGTERM)"
    assert exit_note(RuntimeError("worker (pid 42) was killed by SIGKILL\nmore")) == (
        "RuntimeError: worker (pid 42) was killed by SIGKILL"
    )


def _pair(store, alive=lambda pid: True, **kwargs):
    zero, one = RankInfo(0, "host", 100), RankInfo(1, "host", 101)
    return (RankLiveness(zero, [zero, one], store=store, alive=alive, **kwargs),
            RankLiveness(one, [zero, one], store=store, alive=alive, **kwargs))  # fmt: skip


def test_a_peer_interrupted_by_ctrl_c_is_said_interrupted_not_exited() -> None:
    import torch.distributed as dist

    store = dist.HashStore()
    rank0, rank1 = _pair(store, alive=lambda pid: pid != 101, interval=0.05)
    rank1.announce(KeyboardInterrupt())  # rank 1 is gone (alive says so): it does not wait for its own ack
    assert rank0.describe(rank0.check()) == "rank 1 (pid 101 on host) was interrupted (SIGINT); stopping rank 0"
    # rank 0, interrupted by the same Ctrl-C, blames nobody
    assert rank0.explain(KeyboardInterrupt(), wait=0) is None


def test_a_peer_failing_stops_this_rank_with_its_cause_before_it_exits(monkeypatch) -> None:
    import torch.distributed as dist

    from lightning_zerocopy.strategies import liveness

    aborted: list[str] = []  # the watch aborts the NCCL group: a collective rank 1 never joins would hold rank 0's
    monkeypatch.setattr(liveness, "abort_collectives", lambda: aborted.append(threading.current_thread().name))
    store = dist.HashStore()
    me = RankInfo(0, "host", os.getpid())
    peer = RankInfo(1, "host", 101)
    watch = RankLiveness(me, [me, peer], interval=0.05, grace=1e9, alive=lambda pid: True, store=store)
    failing = RankLiveness(peer, [me, peer], interval=0.05, alive=lambda pid: True, store=store)
    watch.start()
    try:
        error = RuntimeError("the pipeline worker process (pid 4242) was killed by SIGKILL while the trainer waited")
        t0 = time.monotonic()
        # rank 1 announces from a thread of its own: in this one process standing for two ranks, the signal that
        # raises rank 0's error in the main thread could otherwise land inside rank 1's announce, whose store calls
        # catch every Exception (under CI load it did, and nothing was raised)
        announcer = threading.Thread(target=failing.announce, args=(error,))
        with pytest.raises(PeerRankExited, match=r"rank 1 \(pid 101 on host\) failed while rank 0 was running: "
                                                 r"RuntimeError: the pipeline worker process \(pid 4242\) was killed "
                                                 r"by SIGKILL"):  # fmt: skip
            announcer.start()  # waits until rank 0 has read the note (rank 1 still runs)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.01)
        assert time.monotonic() - t0 < 5
        announcer.join(timeout=5)
        assert not announcer.is_alive()
        assert store.check(["lightning_zerocopy/liveness/ack/1/0"])  # rank 0 acknowledged the note
        assert len(aborted) == 1 and aborted[0] != threading.main_thread().name  # from the watch: main may be held
    finally:
        watch.stop()


@pytest.mark.parametrize(("mapped", "cause"), [(True, RuntimeError("worker killed")), (False, RuntimeError("worker")),
                                              (True, KeyboardInterrupt())], ids=["clique_peer", "other_peer", "ctrl_c"])
def test_a_stopping_peer_whose_shards_this_rank_reads_stops_its_workers_at_once(monkeypatch, mapped: bool,
                                                                                cause: BaseException) -> None:
    """Rank 1 fails and will free its clique shard when it exits. Rank 0's workers, which read that shard, are
    stopped by the watch the moment it reads rank 1's note: its main thread may be held (a CUDA wait behind a
    collective rank 1 never joins), and its pipeline worker outlived rank 1's 5 s wait (2 x H200,
    kill_worker1: rank 1 had left meanwhile and the worker met an illegal address). Not on an interrupt: the job's
    signal reached this rank too, whose own exception path closes its workers in order."""
    import torch.distributed as dist

    from lightning_zerocopy.pipeline import worker

    from lightning_zerocopy.cache import sharded_provider

    killed: list[float] = []
    monkeypatch.setattr(worker, "kill_workers", lambda wait_s=0.0: killed.append(time.monotonic()) or True)
    monkeypatch.setattr(sharded_provider, "caches_open_here", lambda: False)  # other tests' caches may be open here
    store = dist.HashStore()
    me, peer = RankInfo(0, "host", os.getpid()), RankInfo(1, "host", 101)
    watch = RankLiveness(me, [me, peer], interval=0.05, grace=1e9, alive=lambda pid: True, store=store)
    if mapped:
        watch.depend_on({0, 1})
    failing = RankLiveness(peer, [me, peer], interval=0.05, alive=lambda pid: True, store=store)
    watch.start()
    try:
        announcer = threading.Thread(target=failing.announce, args=(cause,))
        with pytest.raises(PeerRankExited):
            announcer.start()
            time.sleep(10)
        deadline = time.monotonic() + 5
        while mapped and not killed and time.monotonic() < deadline:
            time.sleep(0.01)
        interrupted = isinstance(cause, KeyboardInterrupt)
        assert len(killed) == (1 if mapped and not interrupted else 0)
        # and says that this rank reads no shard any more: rank 1 need not wait out its 5 s for a held main thread
        # (2 x H200, kill_worker1: rank 0 never reached its exception path's word)
        while killed and not store.check([DONE_KEY.format(rank=0)]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.check([DONE_KEY.format(rank=0)]) == bool(killed)
        announcer.join(timeout=5)
    finally:
        watch.stop()


def test_a_rank_already_stopping_is_not_interrupted_by_a_peer() -> None:
    import torch.distributed as dist

    store = dist.HashStore()
    me = RankInfo(0, "host", os.getpid())
    peer = RankInfo(1, "host", 101)
    watch = RankLiveness(me, [me, peer], interval=0.02, grace=1e9, alive=lambda pid: False, store=store,
                         stopping=lambda: True)  # fmt: skip
    watch.start()
    try:
        time.sleep(0.3)  # the peer is gone, but this rank handles its own exception: nothing is raised here
    finally:
        watch.stop()
    assert watch.message is None


def test_a_gone_rank_whose_memory_this_process_maps_ends_it_at_once(tmp_path) -> None:
    """A clique peer's death frees the shard this process reads: the watch names it in one line and exits (status 1)
    without waiting for an exception path that a broken CUDA context could not finish."""
    script = tmp_path / "mapped.py"
    script.write_text(
        "import os, sys, time\n"
        "from lightning_zerocopy.strategies.liveness import RankInfo, RankLiveness\n"
        "me = RankInfo(0, 'h', os.getpid())\n"
        "watch = RankLiveness(me, [me, RankInfo(1, 'h', 999999)], interval=0.05, grace=1e9, alive=lambda pid: pid != 999999)\n"
        "watch.depend_on({0, 1})\n"
        "print('watching', flush=True)\n"
        "watch.start()\n"
        "time.sleep(30)\n"
        "print('still here', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "watching"
    start = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and time.monotonic() - start < 10, out + err
    assert err.startswith("error: rank 1 (pid 999999 on h) exited while rank 0 was running") and "went with it" in err, err
    assert err.count("\n") == 1 and "still here" not in out


def test_the_watch_wakes_the_moment_a_mapped_rank_exits_not_at_its_next_poll() -> None:
    """Between a clique peer's exit and the watch's next look, every kernel this process starts reads freed memory
    (issue 42: SIGKILL of rank 0 on 4 GPUs printed illegal memory accesses): the pause between polls ends as the
    mapped rank exits, here within 1 s of a 30 s interval."""
    from lightning_zerocopy.strategies.liveness import RankInfo, RankLiveness

    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = RankInfo(0, "h", os.getpid())
        watch = RankLiveness(me, [me, RankInfo(1, "h", peer.pid)], interval=30.0)
        watch.depend_on({1})
        threading.Timer(0.3, peer.kill).start()
        start = time.monotonic()
        watch._pause()
        assert time.monotonic() - start < 1.3
        assert watch._mapped_gone() is not None and watch._mapped_gone().rank == 1
    finally:
        peer.kill()
        peer.wait()


def _store_with_rank_1s_note() -> str:
    """Script lines: the liveness imports and a process-group store stand-in holding rank 1's exit note."""
    from lightning_zerocopy.strategies import liveness

    return ("from lightning_zerocopy.strategies import liveness\n"
            "from lightning_zerocopy.strategies.liveness import PeerRankExited, RankInfo, RankLiveness\n"
            "class Store:\n"
            f"    notes = {{{liveness._NOTE_KEY.format(rank=1)!r}: b'its pipeline worker was killed by SIGKILL'}}\n"
            "    def check(self, keys): return all(k in self.notes for k in keys)\n"
            "    def get(self, key): return self.notes[key]\n"
            "    def set(self, key, value): self.notes[key] = value\n")  # fmt: skip


_STORE_WITH_RANK_1S_NOTE = _store_with_rank_1s_note()


def test_a_mapped_peer_exiting_after_its_note_ends_a_hung_exception_path_at_once(tmp_path) -> None:
    """Rank 1 fails (its exit note names why), rank 0 starts stopping on its account, then rank 1 exits and frees
    the shard rank 0 reads: rank 0's exception path, which may now wait forever in a CUDA call, is not given the
    rest of ``grace``; the watch ends the process at once (the two-GPU ``kill_worker1`` case)."""
    script = tmp_path / "hung.py"
    script.write_text(
        "import os, sys, time\n"
        + _STORE_WITH_RANK_1S_NOTE +
        "exited = {}\n"
        "def alive(pid):\n"
        "    return not (pid == 999999 and 'at' in exited and time.monotonic() > exited['at'])\n"
        "me = RankInfo(0, 'h', os.getpid())\n"
        "watch = RankLiveness(me, [me, RankInfo(1, 'h', 999999)], interval=0.05, grace=60, alive=alive, store=Store())\n"
        "watch.depend_on({0, 1})\n"
        "watch.start()\n"
        "try:\n"
        "    time.sleep(30)\n"
        "except PeerRankExited as error:\n"
        "    liveness.error_line_written()  # as the command does when it writes the run's error line\n"
        "    print('stopping:', error, flush=True)\n"
        "    exited['at'] = time.monotonic() + 0.5\n"
        "    time.sleep(30)  # an exception path stuck in a call that a freed shard never lets return\n"
        "print('still here', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = time.monotonic()
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 1 and time.monotonic() - start < 15, out + err
    assert "stopping: rank 1 (pid 999999 on h) failed while rank 0 was running" in out, out + err
    assert "went with it: stopping rank 0 now" in err and "error:" not in err and "still here" not in out, out + err



def test_a_mapped_peer_exiting_during_the_grace_ends_this_rank_the_moment_it_exits(tmp_path) -> None:
    """As above, with a real peer process: the grace waits on its process file descriptor, so this rank ends as
    the peer exits, not at the grace's next look (here ``interval`` = 5 s; it slept in steps of ``interval``)."""
    script = tmp_path / "grace.py"
    script.write_text(
        "import os, subprocess, sys, threading, time\n"
        + _STORE_WITH_RANK_1S_NOTE +
        "peer = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "me = RankInfo(0, 'h', os.getpid())\n"
        "watch = RankLiveness(me, [me, RankInfo(1, 'h', peer.pid)], interval=5.0, grace=60, store=Store())\n"
        "watch.depend_on({0, 1})\n"
        "watch.start()\n"
        "try:\n"
        "    time.sleep(30)\n"
        "except PeerRankExited:\n"
        "    liveness.error_line_written()\n"
        "    time.sleep(1.0)  # the watch runs out its grace\n"
        "    peer.kill()\n"
        "    print('killed at', time.monotonic(), flush=True)\n"
        "    peer.wait()\n"
        "    time.sleep(30)\n"
        "print('still here', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=90)
    ended = time.monotonic()
    assert proc.returncode == 1 and "went with it: stopping rank 0 now" in err, out + err
    [killed] = [float(line.split()[2]) for line in out.splitlines() if line.startswith("killed at")]
    assert ended - killed < 2.5, (ended - killed, out + err)


@pytest.mark.parametrize("written", [False, True], ids=["no_error_line_yet", "error_line_written"])
def test_a_rank_that_does_not_exit_within_grace_ends_with_the_runs_error_line(tmp_path, written: bool) -> None:
    """The main thread cannot act on the gone peer in time (here it swallows PeerRankExited, as a rank blocked in
    native code misses it): after ``grace`` the watch ends the process with the run's ``error:`` line naming the
    peer, unless the command already wrote its error line (then a note, not a second error line). Four CPU ranks
    under load met the first case: rank 0 ended with only a note, and the run named no cause."""
    script = tmp_path / "stuck.py"
    script.write_text(
        "import os, time\n"
        "from lightning_zerocopy.strategies import liveness\n"
        "me = liveness.RankInfo(0, 'h', os.getpid())\n"
        "watch = liveness.RankLiveness(me, [me, liveness.RankInfo(2, 'h', 999999)], interval=0.05, grace=1.0,\n"
        "                              alive=lambda pid: pid != 999999)\n"
        "watch.start()\n"
        f"if {written}:\n"
        "    liveness.error_line_written()\n"
        "deadline = time.monotonic() + 30\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n"
        "        time.sleep(0.05)\n"
        "    except liveness.PeerRankExited:\n"
        "        pass\n"
        "print('still here', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "still here" not in proc.stdout, proc.stdout + proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if "did not exit within" in line]
    assert "rank 2 (pid 999999 on h) exited while rank 0 was running; stopping rank 0" in line, line
    assert line.startswith("[ZeroCopyDDPStrategy] " if written else "error: "), line


def test_a_rank_that_went_after_reading_this_ranks_note_does_not_explain_its_error() -> None:
    """Rank 1 fails on its own (its pipeline worker died) and announces it; rank 0 reads the note, stops on its
    account and is gone by the time rank 1 explains its error: the worker stays the cause, not rank 0 (on four GPUs
    that was the job's one error line)."""
    import torch.distributed as dist

    store = dist.HashStore()
    alive = {100: True, 101: True}
    rank0, rank1 = _pair(store, alive=lambda pid: alive[pid], interval=0.05)
    error = _rank1_fails_and_rank0_reads_its_note(rank0, rank1)
    alive[100] = False  # rank 0 ended on rank 1's account
    assert rank1.explain(error, wait=0) is None
    assert str(error) == "the pipeline worker process (pid 4242) was killed by SIGKILL"
    # a rank that went without reading it explains it as before
    other = RuntimeError("[gloo] Connection reset by peer")
    fresh = RankLiveness(rank1.me, [rank0.me, rank1.me], store=dist.HashStore(), alive=lambda pid: pid != 100)
    assert fresh.explain(other, wait=0) == "rank 0 (pid 100 on host) exited while rank 1 was running; stopping rank 1"


def _rank1_fails_and_rank0_reads_its_note(rank0: RankLiveness, rank1: RankLiveness) -> RuntimeError:
    """Rank 1 announces an error of its own (its pipeline worker died) and rank 0 reads the note; the error."""
    error = RuntimeError("the pipeline worker process (pid 4242) was killed by SIGKILL")
    announcer = threading.Thread(target=rank1.announce, args=(error,))
    announcer.start()
    deadline = time.monotonic() + 10
    while rank0.note_of(rank1.me) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    announcer.join(timeout=10)
    return error


def test_a_rank_whose_note_every_peer_read_explains_its_error_without_waiting() -> None:
    """Rank 1 fails on its own and rank 0 reads its note: no rank can be to blame for rank 1's error, so explain()
    returns at once instead of waiting ``wait`` seconds for a rank to go (issue 42: rank 1 of ``kill_worker1`` spent
    2 s there before its error line)."""
    import torch.distributed as dist

    store = dist.HashStore()
    rank0, rank1 = _pair(store, interval=0.05)
    error = _rank1_fails_and_rank0_reads_its_note(rank0, rank1)
    start = time.monotonic()
    assert rank1.explain(error, wait=30) is None
    assert time.monotonic() - start < 5


def test_a_rank_stopping_on_a_peers_account_leaves_its_note_without_waiting_for_acks() -> None:
    """Rank 1 failed; rank 0 stops on its account while rank 2, alive, no longer reads notes (its watch is stopping
    too): rank 0's note is left at once, not after ``2 * interval + 1`` s of waiting for rank 2's acknowledgement
    (issue 42: on 4 ranks two survivors of ``kill_worker1`` each waited 2 s there, holding the fourth in gloo)."""
    import torch.distributed as dist

    store = dist.HashStore()
    ranks = [RankInfo(r, "host", 100 + r) for r in range(3)]
    rank0 = RankLiveness(ranks[0], ranks, store=store, alive=lambda pid: True, interval=2.0)
    stopping = PeerRankExited("rank 1 (pid 101 on host) failed while rank 0 was running: RuntimeError: boom")
    start = time.monotonic()
    rank0.announce(stopping)
    assert time.monotonic() - start < 1.0
    assert store.check(["lightning_zerocopy/liveness/note/0"])
    # a rank's own error still waits for its live peers to read it (at most 2 * interval + 1 s)
    rank2 = RankLiveness(ranks[2], ranks, store=store, alive=lambda pid: True, interval=0.2)
    start = time.monotonic()
    rank2.announce(RuntimeError("an error of rank 2's own"))
    assert 1.3 <= time.monotonic() - start < 5


def test_stopping_a_watch_that_runs_out_its_grace_returns_at_once_and_the_grace_still_holds(tmp_path) -> None:
    """The watch found a gone peer and raised in the main thread, whose exception path stops the watch: stop()
    returns at once (it waited ``interval + 1`` s for a thread that sleeps out its grace: 1.5 s of rank 0's exit in
    ``kill_worker1``, issue 42), and the grace still ends a process whose exit path then hangs."""
    script = tmp_path / "stopping.py"
    script.write_text(
        "import os, time\n"
        "from lightning_zerocopy.strategies import liveness\n"
        "me = liveness.RankInfo(0, 'h', os.getpid())\n"
        "watch = liveness.RankLiveness(me, [me, liveness.RankInfo(1, 'h', 999999)], interval=2.0, grace=4.0,\n"
        "                              alive=lambda pid: pid != 999999)\n"
        "watch.start()\n"
        "try:\n"
        "    time.sleep(30)\n"
        "except liveness.PeerRankExited:\n"
        "    start = time.monotonic()\n"
        "    watch.stop()\n"
        "    print(f'stopped in {time.monotonic() - start:.3f} s', flush=True)\n"
        "    time.sleep(30)  # an exit path that hangs\n"
        "print('still here', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "still here" not in proc.stdout, proc.stdout + proc.stderr
    [took] = [float(line.split()[2]) for line in proc.stdout.splitlines() if line.startswith("stopped in")]
    assert took < 1.0, proc.stdout
    assert "did not exit within 4 s: exiting" in proc.stderr, proc.stderr


def test_stopping_a_watch_that_waits_on_a_mapped_rank_ends_its_wait() -> None:
    """A watch waiting on a clique peer's process file descriptor (:meth:`RankLiveness._pause`) stops when asked,
    not when its ``interval`` is up (here 30 s)."""
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = RankInfo(0, "h", os.getpid())
        watch = RankLiveness(me, [me, RankInfo(1, "h", peer.pid)], interval=30.0)
        watch.depend_on({1})
        watch.start()
        time.sleep(0.3)  # the watch waits on the peer's pidfd
        start = time.monotonic()
        watch.stop()
        assert time.monotonic() - start < 5
    finally:
        peer.kill()
        peer.wait()

def test_a_watch_line_reaches_stderr_in_one_write(monkeypatch) -> None:
    """The ranks of a machine share one stderr: a line written as text, then its newline (``print``, unbuffered) let
    two ranks ending at once run their lines together, so the job's ``error:`` line no longer started a line (CI, 4
    gloo ranks stuck past grace: ``...: exitingerror: rank 1 ...``)."""
    writes: list[str] = []

    class Recorder:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    me = RankInfo(0, "h", os.getpid())
    watch = RankLiveness(me, [me, RankInfo(1, "h", 999999)], alive=lambda pid: pid != 999999)
    monkeypatch.setattr(sys, "stderr", Recorder())
    line = watch.explain(RuntimeError("Connection reset by peer"), wait=0.0)
    assert line is not None and "rank 1 (pid 999999 on h) exited" in line
    assert len(writes) == 1 and writes[0].endswith("\n") and writes[0].count("\n") == 1, writes


def test_a_peers_exit_does_not_replace_this_ranks_own_ctrl_c() -> None:
    """The job's Ctrl-C reaches every rank: rank 1 stops first and leaves its note, rank 0's watch reads it and
    signals rank 0's main thread while rank 0's own KeyboardInterrupt is still propagating (through a loop's
    ``finally``). Its KeyboardInterrupt must come out, not a PeerRankExited blaming rank 1 (a CI run, 2026-11-29)."""
    me = RankInfo(0, "host", os.getpid())
    watch = RankLiveness(me, [me, RankInfo(1, "host", 11)], alive=lambda pid: True)

    def loop_interrupted_while_the_peer_signal_lands() -> None:
        try:
            raise KeyboardInterrupt
        finally:  # Lightning's on_iteration_done runs here; the watch's signal handler lands in it
            watch._raise_in_main(0, None)

    with pytest.raises(KeyboardInterrupt):
        loop_interrupted_while_the_peer_signal_lands()
    with pytest.raises(PeerRankExited):  # not interrupted itself: the peer's exit stops it
        watch._raise_in_main(0, None)
