"""Node-classification datasets: generated, OGB folders, and PyG ``Data`` objects."""

from lightning_zerocopy.datasets.base import CachedNodeDataset, NodeData, NodeDataset
from lightning_zerocopy.datasets.ogb import OGBNodeDataset
from lightning_zerocopy.datasets.pyg import PyGNodeDataset
from lightning_zerocopy.datasets.synthetic import SyntheticGraph

__all__ = ["CachedNodeDataset", "NodeData", "NodeDataset", "OGBNodeDataset", "PyGNodeDataset", "SyntheticGraph"]
