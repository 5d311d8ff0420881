"""The producer's sampling thread: one sample ahead, misses sampled on the same thread, errors re-raised."""

from __future__ import annotations

import threading
import time

import pytest

from lightning_zerocopy.pipeline.lookahead import Lookahead


def test_take_returns_the_sample_submitted_ahead_from_the_sampling_thread():
    lookahead = Lookahead()
    calls: list[tuple[str, int]] = []

    def sample(tag: str):
        calls.append((tag, threading.get_ident()))
        return tag

    try:
        lookahead.submit(("t", 0, 1), lambda: sample("ahead"))
        result, seconds = lookahead.take(("t", 0, 1), lambda: sample("now"))
        assert result == "ahead" and seconds >= 0
        assert [tag for tag, _ in calls] == ["ahead"]
        assert calls[0][1] != threading.get_ident()
    finally:
        lookahead.close()


def test_a_miss_drops_the_stale_sample_and_samples_on_the_same_thread():
    lookahead = Lookahead()
    threads: list[int] = []
    release = threading.Event()

    def slow():
        threads.append(threading.get_ident())
        release.wait(5)
        return "stale"

    def fresh():
        threads.append(threading.get_ident())
        return "fresh"

    try:
        lookahead.submit(("t", 0, 5), slow)
        time.sleep(0.05)  # the stale sample is running
        timer = threading.Timer(0.2, release.set)
        timer.start()
        result, _ = lookahead.take(("t", 1, 0), fresh)  # another generation: not the one submitted
        assert result == "fresh"
        assert len(threads) == 2 and threads[0] == threads[1] != threading.get_ident()  # never concurrently
        timer.join()
    finally:
        lookahead.close()


def test_the_samplers_error_is_raised_by_take():
    lookahead = Lookahead()

    def broken():
        raise IndexError("seed node id 99 is out of range")

    try:
        lookahead.submit("k", broken)
        with pytest.raises(IndexError, match="out of range"):
            lookahead.take("k", broken)
        assert lookahead.take("k2", lambda: 3)[0] == 3  # still serves after an error
    finally:
        lookahead.close()


def test_close_waits_for_the_running_sample_and_stops_the_thread():
    lookahead = Lookahead()
    done = threading.Event()

    def slow():
        time.sleep(0.2)
        done.set()

    lookahead.submit("k", slow)
    time.sleep(0.05)
    lookahead.close()
    assert done.is_set()
    assert not any(t.name.startswith("lzc-pipeline-sampler") for t in threading.enumerate())


def test_a_sample_carries_its_threads_cpu_time_beside_its_wall_time():
    """The sampling thread's CPU time over a sample: near its wall time when it computes, far below when it waits
    (what tells a sampler waiting on the host, for wake-ups or the interpreter's lock, from one that computes)."""
    lookahead = Lookahead()

    def waits():
        time.sleep(0.2)
        return "waited"

    def computes():
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass
        return "computed"

    try:
        result, timing = lookahead.take_timed(("t", 0, 0), waits)
        assert result == "waited" and timing.host_s >= 0.19 and timing.cpu_s is not None and timing.cpu_s < 0.1
        result, timing = lookahead.take_timed(("t", 0, 1), computes)
        assert result == "computed" and timing.cpu_s >= 0.2 and timing.host_s >= timing.cpu_s * 0.99
    finally:
        lookahead.close()
