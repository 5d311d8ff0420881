"""The data contract shared by every execution path: plan, builder, loader, resources, and the DataModule.

Names are imported on first access, so a process that needs only part of it (a pipeline worker opening
``DeviceResources``) does not import Lightning with the DataModule.
"""

from __future__ import annotations

from lightning_zerocopy._lazy import lazy_exports

_LAZY = {
    "BatchBuilder": "lightning_zerocopy.data.batch",
    "max_sampled_nodes": "lightning_zerocopy.data.batch",
    "BatchPlan": "lightning_zerocopy.data.plan",
    "PlanItem": "lightning_zerocopy.data.plan",
    "derive_seed": "lightning_zerocopy.data.plan",
    "CacheContext": "lightning_zerocopy.cache.provider",
    "FeatureCacheSpec": "lightning_zerocopy.cache.provider",
    "FeatureGather": "lightning_zerocopy.cache.provider",
    "HotRowsCache": "lightning_zerocopy.cache.provider",
    "DeviceResources": "lightning_zerocopy.data.resources",
    "HostData": "lightning_zerocopy.data.resources",
    "ResourceScope": "lightning_zerocopy.data.resources",
    "HostGraphHandles": "lightning_zerocopy.data.handles",
    "NodeOrderHandles": "lightning_zerocopy.data.handles",
    "HostMemoryConsumer": "lightning_zerocopy.data.hooks",
    "LoaderFactory": "lightning_zerocopy.data.hooks",
    "PlanLoader": "lightning_zerocopy.data.loader",
    "GraphDataModule": "lightning_zerocopy.data.graph_datamodule",
    "LinkTask": "lightning_zerocopy.data.tasks",
    "NodeTask": "lightning_zerocopy.data.tasks",
    "ZeroCopyDataModule": "lightning_zerocopy.data.datamodule",
    "ZeroCopyLinkDataModule": "lightning_zerocopy.data.link_datamodule",
    "LinkBatchPlan": "lightning_zerocopy.data.link_plan",
    "LinkPlanItem": "lightning_zerocopy.data.link_plan",
    "NegativeSampling": "lightning_zerocopy.data.negatives",
    "share_host_data": "lightning_zerocopy.data.host.share",
    "share_node_data": "lightning_zerocopy.data.host.share",
    "HeteroHostGraphHandles": "lightning_zerocopy.data.handles",
    "HeteroBatchBuilder": "lightning_zerocopy.data.batch",
    "ZeroCopyHeteroDataModule": "lightning_zerocopy.data.datamodule",
    "ZeroCopyHeteroLinkDataModule": "lightning_zerocopy.data.link_datamodule",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(__all__)
