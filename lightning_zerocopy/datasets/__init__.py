"""Datasets: node classification (generated, OGB folders, PyG ``Data`` objects) and link prediction.

The heterogeneous datasets (:class:`SyntheticHeteroGraph`, :class:`PyGHeteroDataset`, :class:`OGBHeteroNodeDataset`,
and for link prediction :class:`HeteroLinkDataset`, :class:`SyntheticHeteroLinkGraph`) are imported on first use.
"""

from typing import Any

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

_LAZY = {
    "OGBHeteroNodeDataset": "lightning_zerocopy.datasets.ogb_hetero",
    "PyGHeteroDataset": "lightning_zerocopy.datasets.pyg_hetero",
    "SyntheticHeteroGraph": "lightning_zerocopy.datasets.synthetic_hetero",
    "HeteroLinkData": "lightning_zerocopy.datasets.hetero_links",
    "HeteroLinkDataset": "lightning_zerocopy.datasets.hetero_links",
    "SyntheticHeteroLinkGraph": "lightning_zerocopy.datasets.synthetic_hetero_links",
}


def __getattr__(name: str) -> Any:
    """The heterogeneous dataset classes, imported on first access."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CachedLinkDataset",
    "CachedNodeDataset",
    "DatasetFileError",
    "HeteroLinkData",
    "HeteroLinkDataset",
    "InputDataError",
    "LINK_SPLITS",
    "LinkData",
    "LinkDataset",
    "LinkSplit",
    "NodeData",
    "NodeDataset",
    "OGBLinkDataset",
    "NonFiniteFeatureError",
    "OGBHeteroNodeDataset",
    "OGBNodeDataset",
    "PyGHeteroDataset",
    "PyGLinkDataset",
    "PyGNodeDataset",
    "SplitError",
    "SyntheticGraph",
    "SyntheticHeteroGraph",
    "SyntheticHeteroLinkGraph",
    "SyntheticLinkGraph",
    "check_finite_features",
    "check_link_splits",
    "check_splits",
]
