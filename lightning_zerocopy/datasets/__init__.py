"""Datasets: node classification (generated, OGB folders, PyG ``Data`` objects) and link prediction."""

from lightning_zerocopy.datasets.base import CachedNodeDataset, DatasetFileError, InputDataError, NodeData, NodeDataset
from lightning_zerocopy.datasets.features import NonFiniteFeatureError, check_finite_features
from lightning_zerocopy.datasets.link_checks import check_link_splits
from lightning_zerocopy.datasets.links import LINK_SPLITS, CachedLinkDataset, LinkData, LinkDataset, LinkSplit
from lightning_zerocopy.datasets.ogb import OGBNodeDataset
from lightning_zerocopy.datasets.ogb_links import OGBLinkDataset
from lightning_zerocopy.datasets.pyg import PyGNodeDataset
from lightning_zerocopy.datasets.pyg_links import PyGLinkDataset
from lightning_zerocopy.datasets.splits import SplitError, check_splits
from lightning_zerocopy.datasets.synthetic import SyntheticGraph
from lightning_zerocopy.datasets.synthetic_links import SyntheticLinkGraph

__all__ = [
    "CachedLinkDataset",
    "CachedNodeDataset",
    "DatasetFileError",
    "InputDataError",
    "LINK_SPLITS",
    "LinkData",
    "LinkDataset",
    "LinkSplit",
    "NodeData",
    "NodeDataset",
    "OGBLinkDataset",
    "NonFiniteFeatureError",
    "OGBNodeDataset",
    "PyGLinkDataset",
    "PyGNodeDataset",
    "SplitError",
    "SyntheticGraph",
    "SyntheticLinkGraph",
    "check_finite_features",
    "check_link_splits",
    "check_splits",
]
