"""A stopping rank keeps its clique shards until the ranks reading them stopped (strategies/shard_readers.py)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from lightning_zerocopy.strategies import ZeroCopyDDPStrategy
from lightning_zerocopy.strategies.liveness import RankInfo
from lightning_zerocopy.strategies.shard_readers import DONE_KEY, stop_reading, stop_workers_reading, wait_for_readers


class _Store:
    """The ``set``/``check`` of a ``torch.distributed`` store, in a dict."""

    def __init__(self, broken: bool = False) -> None:
        self.keys: dict[str, str] = {}
        self.broken = broken

    def set(self, key: str, value: str) -> None:
        if self.broken:
            raise RuntimeError("Connection reset by peer")
        self.keys[key] = value

    def check(self, keys: list[str]) -> bool:
        if self.broken:
            raise RuntimeError("Connection reset by peer")
        return all(k in self.keys for k in keys)


READER = RankInfo(1, "host", 4242)


def test_a_rank_waits_until_its_reader_says_it_stopped_reading():
    store = _Store()
    threading.Timer(0.3, stop_reading, args=(store, 1)).start()
    start = time.monotonic()
    assert wait_for_readers(store, [READER], alive=lambda pid: True, timeout=5.0) == []
    assert 0.25 < time.monotonic() - start < 3.0


def test_a_gone_reader_is_not_waited_for():
    start = time.monotonic()
    assert wait_for_readers(_Store(), [READER], alive=lambda pid: False, timeout=5.0) == []
    assert time.monotonic() - start < 0.5


def test_a_reader_still_reading_at_the_deadline_is_named():
    start = time.monotonic()
    assert wait_for_readers(_Store(), [READER], alive=lambda pid: True, timeout=0.3) == [READER]
    assert 0.25 < time.monotonic() - start < 2.0


def test_without_a_store_only_exits_count():
    gone = threading.Event()
    threading.Timer(0.2, gone.set).start()
    assert wait_for_readers(None, [READER], alive=lambda pid: not gone.is_set(), timeout=5.0) == []
    assert wait_for_readers(_Store(broken=True), [READER], alive=lambda pid: True, timeout=0.1) == [READER]


def test_stop_reading_says_so_only_once_the_kernels_ended_and_survives_a_broken_context_or_store():
    store, seen = _Store(), []

    def ended() -> bool:
        seen.append(sorted(store.keys))
        return True

    assert stop_reading(store, 3, ended)
    assert seen == [[]] and store.keys == {DONE_KEY.format(rank=3): "1"}  # the word only after the check
    assert not stop_reading(store, 6, lambda: False)  # kernels still queued (behind a stuck collective): no word
    assert DONE_KEY.format(rank=6) not in store.keys

    def broken() -> bool:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    assert stop_reading(store, 4, broken)  # a broken context runs nothing any more
    assert DONE_KEY.format(rank=4) in store.keys
    assert not stop_reading(_Store(broken=True), 5, broken) and not stop_reading(None, 5)  # nothing raises


@pytest.mark.cuda
@pytest.mark.parametrize("cache_here", [False, True], ids=["workers_only", "cache_open_here"])
@pytest.mark.parametrize("workers_end", [True, False], ids=["workers_ended", "workers_still_running"])
def test_a_held_rank_says_it_stopped_reading_once_its_killed_workers_ended(monkeypatch, cache_here, workers_end):
    """The watch's word for a rank whose main thread is held: only once its workers have ended and where no cache
    is open in the process itself (its own kernels could still read)."""
    from lightning_zerocopy.cache import sharded_provider
    from lightning_zerocopy.pipeline import worker

    waits: list[float] = []
    monkeypatch.setattr(worker, "kill_workers", lambda wait_s=0.0: waits.append(wait_s) or workers_end)
    monkeypatch.setattr(sharded_provider, "caches_open_here", lambda: cache_here)
    store = _Store()
    said = stop_workers_reading(store, 3, wait_s=2.0)
    assert waits == [2.0]
    assert said == (workers_end and not cache_here) == (DONE_KEY.format(rank=3) in store.keys)


def test_on_a_gpu_a_stream_stuck_behind_a_wait_is_not_drained_and_a_free_one_is():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from lightning_zerocopy.strategies.shard_readers import stream_drained

    device = torch.device("cuda", 0)
    torch.cuda._sleep(1_000_000)  # (loads the sleep kernel: a first launch waits for the device)
    torch.cuda.synchronize(device)
    assert stream_drained(device, timeout=1.0)
    torch.cuda._sleep(4_000_000_000)  # ~2 s at 2 GHz, as a kernel waiting for a peer that never comes
    start = time.monotonic()
    assert not stream_drained(device, timeout=0.2)
    assert time.monotonic() - start < 1.0  # returned at its timeout, not when the stream drained
    torch.cuda.synchronize(device)


class _Watch:
    def __init__(self, readers: list[RankInfo], store: _Store) -> None:
        self.mapped_peers, self.store = readers, store

    def alive(self, pid: int) -> bool:
        return True

    def depend_on(self, ranks: set[int]) -> None:
        self.mapped_peers = [r for r in self.mapped_peers if r.rank in ranks]


@pytest.mark.parametrize("clique", [True, False])
def test_the_strategy_on_an_error_says_it_stopped_reading_and_waits_for_its_clique(clique: bool, capsys):
    strategy = ZeroCopyDDPStrategy(accelerator="cpu", process_group_backend="gloo")
    strategy.parallel_devices = [torch.device("cpu")]
    strategy.reader_wait_s = 0.3
    store = _Store()
    watch = _Watch([READER] if clique else [], store)
    start = time.monotonic()
    strategy._leave_after_readers(watch)  # rank 1 never says it stopped: the wait runs out
    took = time.monotonic() - start
    if clique:
        assert DONE_KEY.format(rank=strategy.global_rank) in store.keys and 0.25 < took < 2.0
        assert "rank(s) 1 still read its cache shards" in capsys.readouterr().err
        assert watch.mapped_peers == []  # its watch no longer ends it when a reader exits: it reads no peer now
    else:
        assert store.keys == {} and took < 0.1  # no clique: no shard is read by a peer, nothing to wait for
