"""Feature store: node features in shareable host memory and row gathers out of it."""

from lightning_zerocopy.gather.host_table import FeatureTableHandle, HostFeatureTable

__all__ = ["FeatureTableHandle", "HostFeatureTable"]
