"""Feature store: node features in shareable host memory and row gathers out of it.

The Strategy's segmented GPU feature cache lives in :mod:`lightning_zerocopy.cache`; its names below are kept here
for existing imports and imported from there on first access.
"""

from lightning_zerocopy._lazy import lazy_exports
from lightning_zerocopy.gather.cuda_table import (
    CudaFeatureTable,
    frequency_order,
    most_frequent_neighbors,
)
from lightning_zerocopy.gather.host_table import FeatureTableHandle, HostFeatureTable

_LAZY = {
    "CachePlan": "lightning_zerocopy.cache.plan",
    "CacheCounts": "lightning_zerocopy.cache.segmented",
    "SegmentedCacheSpec": "lightning_zerocopy.cache.segmented",
    "SegmentedFeatureCache": "lightning_zerocopy.cache.segmented",
    "ShardHandle": "lightning_zerocopy.cache.segmented",
    "fill_shard": "lightning_zerocopy.cache.segmented",
    "open_feature_cache": "lightning_zerocopy.cache.segmented",
}

_lazy = lazy_exports(__name__, _LAZY)


def __getattr__(name: str) -> object:
    # ``FeatureCacheSpec``: the segmented cache's spec under its former name; in lightning_zerocopy.cache that name
    # is the provider protocol's alone
    return _lazy("SegmentedCacheSpec" if name == "FeatureCacheSpec" else name)


__all__ = [
    "CacheCounts",
    "CachePlan",
    "CudaFeatureTable",
    "FeatureCacheSpec",
    "FeatureTableHandle",
    "HostFeatureTable",
    "frequency_order",
    "most_frequent_neighbors",
    "SegmentedCacheSpec",
    "SegmentedFeatureCache",
    "ShardHandle",
    "fill_shard",
    "open_feature_cache",
]
