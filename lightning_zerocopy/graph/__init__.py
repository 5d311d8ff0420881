"""Graph storage: the CSC container and host memory that every local process maps without copying."""

from lightning_zerocopy.graph.csc import CSCGraph, CSCGraphHandle
from lightning_zerocopy.graph.shared_memory import (
    NpyTensorHandle,
    SharedTensorHandle,
    TensorHandle,
    cleanup_stale_segments,
    create_shared_tensor,
    open_npy_memmap,
    save_npy,
    share_tensor,
    shared_memory_dir,
)

__all__ = [
    "CSCGraph",
    "CSCGraphHandle",
    "NpyTensorHandle",
    "SharedTensorHandle",
    "TensorHandle",
    "cleanup_stale_segments",
    "create_shared_tensor",
    "open_npy_memmap",
    "save_npy",
    "share_tensor",
    "shared_memory_dir",
]
