"""One node type's part of the strategy's cache as a cache provider (a ``FeatureCacheSpec``), and its counters.

:class:`ShardedFeatureCache` wraps the :class:`~lightning_zerocopy.cache.segmented.SegmentedCacheSpec` of one
featured type that :class:`~lightning_zerocopy.strategies.ZeroCopyDDPStrategy` builds (plan + shard handles); the
DataModule's spec (:class:`~lightning_zerocopy.cache.provider.TypedFeatureCache`, picklable and hashable, with
every builder) hands it out per type, and each process that builds batches (a trainer rank, a pipeline worker)
opens it once through its device resources. The caches a process opened are remembered (weakly,
:func:`track_cache`), so :func:`open_cache_counts` (the trainer's, by plan) and :func:`process_cache_counts` (a
pipeline worker's report to its trainer) can tell where their rows came from.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional

__all__ = [
    "PlanCounts", "ShardedFeatureCache", "caches_open_here", "open_cache_counts", "process_cache_counts", "track_cache"
]

_OPENED: "weakref.WeakSet[Any]" = weakref.WeakSet()
_LOCK = threading.Lock()


@dataclass(frozen=True)
class ShardedFeatureCache:
    """A cache provider over the shards of a ``SegmentedCacheSpec`` (replicate: one, clique: one per GPU).

    Attributes:
        spec: the plan and shard handles (:class:`~lightning_zerocopy.cache.segmented.SegmentedCacheSpec`).
    """

    spec: Any

    def open(self, context: Any) -> Any:
        """Open the shards on ``context.device`` (the host table is registered by the caller); a
        :class:`~lightning_zerocopy.cache.segmented.SegmentedFeatureCache`."""
        from lightning_zerocopy.cache.segmented import open_feature_cache

        return track_cache(open_feature_cache(self.spec, context.table, context.device, register=False))


def track_cache(cache: Any) -> Any:
    """Remember ``cache`` (weakly) as open in this process until it is closed, and return it.

    A tracked cache has ``closed``, ``plan.digest``, ``row_bytes`` and ``counts()`` (a ``CacheCounts``), like a
    :class:`~lightning_zerocopy.cache.segmented.SegmentedFeatureCache`.
    """
    with _LOCK:
        _OPENED.add(cache)
    return cache


def _open_caches(plan_digest: Optional[str] = None) -> list[Any]:
    with _LOCK:
        return [c for c in _OPENED if not c.closed and (plan_digest is None or c.plan.digest == plan_digest)]


def caches_open_here() -> bool:
    """Whether this process has a cache open (its own kernels may read the GPU memory of the ranks it maps)."""
    return bool(_open_caches())


def open_cache_counts(plan_digest: str) -> Optional[Any]:
    """Rows served so far by this process's open caches of the plan ``plan_digest`` (a ``CacheCounts``, summed
    over them; reading synchronizes the GPU), or ``None`` when none is open."""
    from lightning_zerocopy.cache.segmented import CacheCounts

    caches = _open_caches(plan_digest)
    if not caches:
        return None
    counts = [c.counts() for c in caches]
    return CacheCounts(*(sum(getattr(c, f) for c in counts) for f in ("local", "peer", "host")))


#: One plan's rows in :func:`process_cache_counts`: ``(plan digest, local, peer, host, row_bytes)``.
PlanCounts = tuple[str, int, int, int, int]


def process_cache_counts() -> Optional[tuple[int, int, int, int, tuple[PlanCounts, ...]]]:
    """``(local, peer, host, row_bytes, per_plan)``: the rows every cache open in this process served so far, summed,
    the bytes of one feature row, and the same counts per cache plan (``(digest, local, peer, host, row_bytes)``, by
    digest), or ``None`` when none is open. The caches of a homogeneous process serve one table; a heterogeneous
    one's serve a table per type, whose widths differ: ``row_bytes`` is then the host rows' mean (their bytes over
    their count, rounded down), and ``per_plan`` gives each type's rows and width exactly (a trainer maps the digests
    to node types through its strategy's typed decision).

    What a pipeline worker reports to its trainer (:mod:`lightning_zerocopy.pipeline.cache_report`). Reads each cache's
    GPU counters on the current stream (a copy of a few integers that waits for that stream's queued work).
    """
    caches = _open_caches()
    if not caches:
        return None
    counts = [c.counts() for c in caches]
    per_plan: dict[str, list[int]] = {}
    for n, c in zip(counts, caches):
        entry = per_plan.setdefault(str(c.plan.digest), [0, 0, 0, int(c.row_bytes)])
        entry[0], entry[1], entry[2] = entry[0] + int(n.local), entry[1] + int(n.peer), entry[2] + int(n.host)
    plans = tuple((digest, *values) for digest, values in sorted(per_plan.items()))
    local, peer, host = (sum(int(getattr(c, f)) for c in counts) for f in ("local", "peer", "host"))
    widths = {int(c.row_bytes) for c in caches}
    if len(widths) == 1 or host == 0:
        return local, peer, host, int(caches[0].row_bytes), plans  # type: ignore[return-value]
    host_bytes = sum(int(n.host) * int(c.row_bytes) for n, c in zip(counts, caches))
    return local, peer, host, host_bytes // host, plans  # type: ignore[return-value]
