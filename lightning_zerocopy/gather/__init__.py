"""Feature store: node features in shareable host memory and row gathers out of it."""

from lightning_zerocopy.gather.cuda_table import (
    CudaFeatureTable,
    frequency_order,
    most_frequent_neighbors,
)
from lightning_zerocopy.gather.host_table import FeatureTableHandle, HostFeatureTable

__all__ = [
    "CudaFeatureTable",
    "FeatureTableHandle",
    "HostFeatureTable",
    "frequency_order",
    "most_frequent_neighbors",
]
