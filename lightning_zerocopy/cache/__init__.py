"""The GPU feature cache: which feature rows a process serves from GPU memory, and how the Strategy decides them.

* :mod:`.provider` — the extension point every cache implements (``FeatureCacheSpec.open(CacheContext) ->
  FeatureGather``), the simplest cache, :class:`HotRowsCache`, and the decided cache as the DataModule's spec
  (:class:`TypedFeatureCache`, a shard spec per type);
* :mod:`.plan`, :mod:`.shards`, :mod:`.segmented` — the Strategy's cache: which rows each shard holds, shards filled
  and exported over CUDA IPC, the one-launch gather over local shard, peer shards and host memory;
  :mod:`.sharded_provider` — that cache as a provider, and the counters of the caches open in this process;
* :mod:`.budget`, :mod:`.ranking`, :mod:`.cached_rows`, :mod:`.cliques`, :mod:`.read_rates`, :mod:`.probe`,
  :mod:`.cost`, :mod:`.decide` — deciding it over the rows of every featured node type (a graph without types has
  one): bytes per GPU, hot rows, the rows one budget holds, GPU cliques, measured read rates, replicate against
  clique, and the same decision on every rank of a group (one plan per type); :mod:`.setup` — one DDP rank's
  cache set up with the other ranks (:class:`RankCache`, what the Strategy's hooks call).

Importing this package imports none of its modules (names are imported on first access). No module imports PyG;
only :mod:`.setup` imports Lightning.
"""

from __future__ import annotations

from lightning_zerocopy._lazy import lazy_exports

_LAZY = {
    "CacheContext": "lightning_zerocopy.cache.provider",
    "FeatureCacheSpec": "lightning_zerocopy.cache.provider",
    "FeatureGather": "lightning_zerocopy.cache.provider",
    "HotRowsCache": "lightning_zerocopy.cache.provider",
    "CachePlan": "lightning_zerocopy.cache.plan",
    "CacheCounts": "lightning_zerocopy.cache.segmented",
    "SegmentedCacheSpec": "lightning_zerocopy.cache.segmented",
    "SegmentedFeatureCache": "lightning_zerocopy.cache.segmented",
    "ShardHandle": "lightning_zerocopy.cache.shards",
    "fill_shard": "lightning_zerocopy.cache.shards",
    "open_feature_cache": "lightning_zerocopy.cache.segmented",
    "ShardedFeatureCache": "lightning_zerocopy.cache.sharded_provider",
    "BudgetSpec": "lightning_zerocopy.cache.budget",
    "parse_budget": "lightning_zerocopy.cache.budget",
    "resolve_budget": "lightning_zerocopy.cache.budget",
    "CacheScores": "lightning_zerocopy.cache.ranking",
    "RankedRows": "lightning_zerocopy.cache.cached_rows",
    "rank_rows": "lightning_zerocopy.cache.cached_rows",
    "Layout": "lightning_zerocopy.cache.cliques",
    "choose_layout": "lightning_zerocopy.cache.cliques",
    "find_cliques": "lightning_zerocopy.cache.cliques",
    "ReadRates": "lightning_zerocopy.cache.read_rates",
    "CacheDecision": "lightning_zerocopy.cache.decide",
    "RankFacts": "lightning_zerocopy.cache.decide",
    "decide_cache": "lightning_zerocopy.cache.decide",
    "TypedFeatureCache": "lightning_zerocopy.cache.provider",
    "CacheOptions": "lightning_zerocopy.cache.setup",
    "RankCache": "lightning_zerocopy.cache.setup",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(__all__)
