"""Feature store: node features in shareable host memory and row gathers out of it."""

from lightning_zerocopy.gather.cache_plan import CachePlan
from lightning_zerocopy.gather.cuda_table import (
    CudaFeatureTable,
    frequency_order,
    most_frequent_neighbors,
)
from lightning_zerocopy.gather.feature_cache import (
    CacheCounts,
    FeatureCacheSpec,
    SegmentedFeatureCache,
    ShardHandle,
    fill_shard,
    open_feature_cache,
)
from lightning_zerocopy.gather.host_table import FeatureTableHandle, HostFeatureTable

__all__ = [
    "CacheCounts",
    "CachePlan",
    "CudaFeatureTable",
    "FeatureCacheSpec",
    "FeatureTableHandle",
    "HostFeatureTable",
    "frequency_order",
    "most_frequent_neighbors",
    "SegmentedFeatureCache",
    "ShardHandle",
    "fill_shard",
    "open_feature_cache",
]
