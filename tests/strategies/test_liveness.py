"""The liveness watch: which ranks it watches, how it judges a process, and the error it raises in the main thread."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from lightning_zerocopy.strategies.liveness import PeerRankExited, RankInfo, RankLiveness, process_alive


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
