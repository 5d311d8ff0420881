"""Graph storage: the CSC container, host memory that every local process maps without copying (and registers
for the GPU), node orders."""

from lightning_zerocopy.graph.csc import CSCGraph, CSCGraphHandle
from lightning_zerocopy.graph.host_registration import HostRegistration, register_host_tensor
from lightning_zerocopy.graph.reorder import NodeOrder, bfs_order, degree_order
from lightning_zerocopy.graph.shared_memory import (
    NpyTensorHandle,
    SharedTensorHandle,
    TensorHandle,
    create_shared_tensor,
    mapped_footprint,
    open_npy_memmap,
    save_npy,
    share_tensor,
    shared_memory_dir,
)
from lightning_zerocopy.graph.stale_segments import cleanup_stale_segments

__all__ = [
    "CSCGraph",
    "CSCGraphHandle",
    "HostRegistration",
    "NodeOrder",
    "NpyTensorHandle",
    "SharedTensorHandle",
    "TensorHandle",
    "bfs_order",
    "cleanup_stale_segments",
    "create_shared_tensor",
    "degree_order",
    "mapped_footprint",
    "open_npy_memmap",
    "register_host_tensor",
    "save_npy",
    "share_tensor",
    "shared_memory_dir",
]
