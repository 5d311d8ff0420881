"""Feature store: node features in shareable host memory and row gathers out of it."""

from lightning_zerocopy.gather.cuda_table import (
    CudaFeatureTable,
    HostRegistration,
    frequency_order,
    most_frequent_neighbors,
    register_host_tensor,
)
from lightning_zerocopy.gather.host_table import FeatureTableHandle, HostFeatureTable

__all__ = [
    "CudaFeatureTable",
    "FeatureTableHandle",
    "HostFeatureTable",
    "HostRegistration",
    "frequency_order",
    "most_frequent_neighbors",
    "register_host_tensor",
]
