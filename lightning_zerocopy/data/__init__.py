"""The data contract shared by every execution path: plan, builder, loader, and the DataModule."""

from lightning_zerocopy.data.batch import BatchBuilder, HostGraphHandles, max_sampled_nodes
from lightning_zerocopy.data.datamodule import HostMemoryConsumer, ZeroCopyDataModule
from lightning_zerocopy.data.host import share_node_data
from lightning_zerocopy.data.loader import PlanLoader
from lightning_zerocopy.data.plan import BatchPlan, PlanItem, derive_seed

__all__ = [
    "BatchBuilder",
    "BatchPlan",
    "HostGraphHandles",
    "HostMemoryConsumer",
    "PlanItem",
    "PlanLoader",
    "ZeroCopyDataModule",
    "derive_seed",
    "max_sampled_nodes",
    "share_node_data",
]
