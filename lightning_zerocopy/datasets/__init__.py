"""Datasets: node classification (generated, OGB folders, PyG ``Data`` objects) and link prediction."""

from lightning_zerocopy.datasets.base import CachedNodeDataset, DatasetFileError, InputDataError, NodeData, NodeDataset
from lightning_zerocopy.datasets.features import NonFiniteFeatureError, check_finite_features
from lightning_zerocopy.datasets.links import LINK_SPLITS, LinkData, LinkDataset, LinkSplit
from lightning_zerocopy.datasets.ogb import OGBNodeDataset
from lightning_zerocopy.datasets.pyg import PyGNodeDataset
from lightning_zerocopy.datasets.splits import SplitError, check_splits
from lightning_zerocopy.datasets.synthetic import SyntheticGraph

__all__ = [
    "CachedNodeDataset",
    "DatasetFileError",
    "InputDataError",
    "LINK_SPLITS",
    "LinkData",
    "LinkDataset",
    "LinkSplit",
    "NodeData",
    "NodeDataset",
    "NonFiniteFeatureError",
    "OGBNodeDataset",
    "PyGNodeDataset",
    "SplitError",
    "SyntheticGraph",
    "check_finite_features",
    "check_splits",
]
