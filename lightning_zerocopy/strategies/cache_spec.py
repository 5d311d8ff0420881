"""The strategy's cache as a DataModule cache provider (:class:`~lightning_zerocopy.data.cache.FeatureCacheSpec`).

:class:`ShardedFeatureCache` wraps the :class:`~lightning_zerocopy.gather.feature_cache.FeatureCacheSpec` that
:class:`~lightning_zerocopy.strategies.ZeroCopyDDPStrategy` builds (plan + shard handles): picklable and hashable,
it travels with every builder the DataModule hands out, and each process that builds batches (a trainer rank, a
pipeline worker) opens it once through its :class:`~lightning_zerocopy.data.resources.DeviceResources`. The caches
a process opened are remembered (weakly), so :func:`open_cache_counts` can report where their rows came from.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["ShardedFeatureCache", "open_cache_counts"]

_OPENED: "weakref.WeakSet[Any]" = weakref.WeakSet()
_LOCK = threading.Lock()


@dataclass(frozen=True)
class ShardedFeatureCache:
    """A cache provider over the shards of a ``FeatureCacheSpec`` (replicate: one, clique: one per GPU).

    Attributes:
        spec: the plan and shard handles (:class:`~lightning_zerocopy.gather.feature_cache.FeatureCacheSpec`).
    """

    spec: Any

    def open(self, context: Any) -> Any:
        """Open the shards on ``context.device`` (the host table is registered by the caller); a
        :class:`~lightning_zerocopy.gather.feature_cache.SegmentedFeatureCache`."""
        from lightning_zerocopy.gather.feature_cache import open_feature_cache

        cache = open_feature_cache(self.spec, context.table, context.device, register=False)
        with _LOCK:
            _OPENED.add(cache)
        return cache


def open_cache_counts(plan_digest: str) -> Optional[Any]:
    """Rows served so far by this process's open caches of the plan ``plan_digest`` (a ``CacheCounts``, summed
    over them; reading synchronizes the GPU), or ``None`` when none is open."""
    from lightning_zerocopy.gather.feature_cache import CacheCounts

    with _LOCK:
        caches = [c for c in _OPENED if not c.closed and c.plan.digest == plan_digest]
    if not caches:
        return None
    counts = [c.counts() for c in caches]
    return CacheCounts(*(sum(getattr(c, f) for c in counts) for f in ("local", "peer", "host")))
