"""The counters of the caches open in a process (what a pipeline worker reports): summed, with the host rows' mean
width for caches of differing widths, and exactly per cache plan (stand-in caches: the real ones need a GPU)."""

from __future__ import annotations

from types import SimpleNamespace

from lightning_zerocopy.cache.segmented import CacheCounts
from lightning_zerocopy.cache.sharded_provider import process_cache_counts, track_cache


class _FakeCache:
    """What tracking reads of an open cache: ``closed``, ``plan.digest``, ``row_bytes``, ``counts()``."""

    def __init__(self, digest: str, row_bytes: int, counts: CacheCounts) -> None:
        self.closed, self.plan, self.row_bytes, self._counts = False, SimpleNamespace(digest=digest), row_bytes, counts

    def counts(self) -> CacheCounts:
        return self._counts


def test_typed_caches_report_their_counts_per_plan_exactly() -> None:
    caches = [track_cache(_FakeCache("p", 32, CacheCounts(40, 2, 12))),
              track_cache(_FakeCache("i", 128, CacheCounts(5, 0, 3))),
              track_cache(_FakeCache("p", 32, CacheCounts(1, 0, 1)))]  # a second builder's cache of the same plan
    try:
        local, peer, host, row_bytes, per_plan = process_cache_counts()
        assert (local, peer, host) == (46, 2, 16)
        assert row_bytes == (13 * 32 + 3 * 128) // 16  # the host rows' mean width
        assert per_plan == (("i", 5, 0, 3, 128), ("p", 41, 2, 13, 32))  # by digest, the same plan summed
    finally:
        for cache in caches:
            cache.closed = True
    assert process_cache_counts() is None  # closed caches are not counted
