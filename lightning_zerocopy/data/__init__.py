"""The data contract shared by every execution path: plan, builder, loader, and the DataModule."""

from lightning_zerocopy.data.batch import BatchBuilder, max_sampled_nodes
from lightning_zerocopy.data.cache import CacheContext, FeatureCacheSpec, FeatureGather, HotRowsCache
from lightning_zerocopy.data.datamodule import HostMemoryConsumer, ZeroCopyDataModule
from lightning_zerocopy.data.handles import HostGraphHandles, NodeOrderHandles
from lightning_zerocopy.data.host import share_node_data
from lightning_zerocopy.data.loader import PlanLoader
from lightning_zerocopy.data.plan import BatchPlan, PlanItem, derive_seed
from lightning_zerocopy.data.resources import DeviceResources, HostData, ResourceScope

__all__ = [
    "BatchBuilder",
    "BatchPlan",
    "CacheContext",
    "DeviceResources",
    "FeatureCacheSpec",
    "FeatureGather",
    "HostData",
    "HostGraphHandles",
    "HostMemoryConsumer",
    "HotRowsCache",
    "NodeOrderHandles",
    "PlanItem",
    "PlanLoader",
    "ResourceScope",
    "ZeroCopyDataModule",
    "derive_seed",
    "max_sampled_nodes",
    "share_node_data",
]
