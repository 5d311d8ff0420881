"""The link-prediction dataset interface: a message-passing graph, node features and supervision-edge splits.

A :class:`LinkDataset` is to edge-level tasks what :class:`~lightning_zerocopy.datasets.NodeDataset` is to
node classification: cheap shape facts right after ``__init__`` (``num_features``), a one-time
:meth:`LinkDataset.prepare`, and :meth:`LinkDataset.load` returning the arrays as a :class:`LinkData`.

The graph in :class:`LinkData` is the one messages flow over; supervision edges of the validation and test splits
must not be in it (that would leak the answer into the neighborhood of the edge being scored).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from lightning_zerocopy.datasets.base import ArrayCache, BuiltIntoCache, GraphDataset, GraphSizes, InputDataError
from lightning_zerocopy.datasets.base import check_edge_attr, check_edge_index
from lightning_zerocopy.graph.shared_memory import save_npy

__all__ = ["LINK_SPLITS", "CachedLinkDataset", "LinkData", "LinkDataset", "LinkSplit", "LinkSplits",
           "link_data_from_cache", "link_splits_from_cache", "save_link_split"]  # fmt: skip

#: The splits a link dataset may hold, in PyG ``LightningLinkData``'s order.
LINK_SPLITS = ("train", "val", "test")


@dataclass
class LinkSplit:
    """The supervision edges of one split.

    Attributes:
        pos_edge_index: int64 ``[2, P]`` global node ids ``(source, destination)`` of the positive supervision
            edges (PyG's ``edge_label_index`` for positives).
        edge_label: optional ``[P]`` labels of those edges (PyG's ``edge_label``); ``None`` means every edge is a
            positive (label 1).
        neg_edge_index: optional int64 ``[2, N]`` fixed negatives (val/test), stored with the split so every run
            scores the same candidates; ``None`` for splits whose negatives are drawn per batch (train).
        neg_per_positive: ``K`` when the negatives are grouped per positive: columns ``i*K .. (i+1)*K - 1`` of
            ``neg_edge_index`` are the negatives of positive ``i`` (same source, as ``ogbl-citation2``), so
            ``N == P * K`` and ranking metrics (MRR) are per positive. ``None`` when the negatives are one shared
            pool scored against every positive (``ogbl-collab`` / ``ogbl-ppa`` style Hits@K).
    """

    pos_edge_index: torch.Tensor
    edge_label: Optional[torch.Tensor] = None
    neg_edge_index: Optional[torch.Tensor] = None
    neg_per_positive: Optional[int] = None

    def __post_init__(self) -> None:
        check_edge_index(self.pos_edge_index, "pos_edge_index")
        if self.edge_label is not None and tuple(self.edge_label.shape) != (self.num_positives,):
            raise ValueError(
                f"edge_label must have shape [{self.num_positives}] (one label per positive edge), "
                f"got {tuple(self.edge_label.shape)}"
            )
        if self.neg_edge_index is not None:
            check_edge_index(self.neg_edge_index, "neg_edge_index")
        if self.neg_per_positive is not None:
            if self.neg_edge_index is None:
                raise ValueError("neg_per_positive is set but neg_edge_index is None")
            if self.neg_per_positive < 1 or self.num_negatives != self.num_positives * self.neg_per_positive:
                raise ValueError(
                    f"neg_per_positive={self.neg_per_positive} needs {self.num_positives} x {self.neg_per_positive} "
                    f"negatives, got {self.num_negatives}"
                )

    @property
    def num_positives(self) -> int:
        return int(self.pos_edge_index.shape[1])

    @property
    def num_negatives(self) -> int:
        return 0 if self.neg_edge_index is None else int(self.neg_edge_index.shape[1])


class LinkSplits:
    """The task half of :class:`LinkData` and ``HeteroLinkData``: the supervision edges of each split."""

    splits: dict[str, LinkSplit]

    def split(self, name: str) -> LinkSplit:
        """The supervision edges of split ``name``."""
        if name not in self.splits:
            raise KeyError(f"this link dataset has no {name!r} split; it has {sorted(self.splits)}")
        return self.splits[name]

    def _check_split_names(self) -> None:
        unknown = sorted(set(self.splits) - set(LINK_SPLITS))
        if unknown:
            raise InputDataError(f"unknown link split(s) {unknown}; expected names among {LINK_SPLITS}")


@dataclass
class LinkData(GraphSizes, LinkSplits):
    """A homogeneous graph for link prediction, held on the host.

    Attributes:
        edge_index: int64 ``[2, num_edges]`` message-passing edges; messages flow ``edge_index[0] -> edge_index[1]``.
        x: floating ``[num_nodes, num_features]`` node features; may be memory-mapped.
        splits: the supervision edges of each split present (a subset of :data:`LINK_SPLITS`).
        edge_attr: optional ``[num_edges, ...]`` edge features.
        x_file: the ``.npy`` file ``x`` is mapped from, if any.
        attributes: other node- and edge-level tensors for the batches (``datasets.attributes``), or ``None``.
    """

    edge_index: torch.Tensor
    x: torch.Tensor
    splits: dict[str, LinkSplit] = field(default_factory=dict)
    edge_attr: Optional[torch.Tensor] = None
    x_file: Optional[str] = None
    attributes: Optional[dict[Any, Any]] = None

    def __post_init__(self) -> None:
        """Shapes and dtypes (an :class:`~lightning_zerocopy.datasets.base.InputDataError`)."""
        check_edge_index(self.edge_index)
        if self.x.dim() != 2:
            raise InputDataError(f"x must have shape [num_nodes, num_features], got {tuple(self.x.shape)}")
        self._check_split_names()
        check_edge_attr(self.edge_attr, self.edge_index)


class LinkDataset(GraphDataset):
    """A link-prediction dataset (:class:`~lightning_zerocopy.datasets.base.GraphDataset`): :attr:`num_features`
    (cheap), :meth:`load` returns a :class:`LinkData`."""

    _split_noun = "link split"

    @property
    @abstractmethod
    def num_features(self) -> int:
        """Width of the node feature matrix (cheap: no array is loaded)."""

    @abstractmethod
    def load(self) -> LinkData:
        """Return the dataset's arrays (memory-mapped where large), preparing them first if needed."""


def save_link_split(out: Path, name: str, split: LinkSplit) -> dict[str, Any]:
    """Write ``split`` as ``<name>_pos.npy`` (and ``<name>_neg.npy``, ``<name>_label.npy`` where present) into
    ``out``; return its metadata entry for :func:`link_data_from_cache`."""
    save_npy(split.pos_edge_index.contiguous(), out / f"{name}_pos.npy")
    if split.neg_edge_index is not None:
        save_npy(split.neg_edge_index.contiguous(), out / f"{name}_neg.npy")
    if split.edge_label is not None:
        save_npy(split.edge_label.contiguous(), out / f"{name}_label.npy")
    return {"neg_per_positive": split.neg_per_positive, "has_negatives": split.neg_edge_index is not None}


def link_splits_from_cache(cache: ArrayCache, entries: Mapping[str, Any]) -> dict[str, LinkSplit]:
    """The splits :func:`save_link_split` wrote into ``cache``, given their metadata ``entries`` by split name (in
    :data:`LINK_SPLITS` order: JSON sorted them by name)."""
    splits = {}
    for name in (name for name in LINK_SPLITS if name in entries):
        entry = entries[name]
        splits[name] = LinkSplit(
            pos_edge_index=cache.tensor(f"{name}_pos"),
            edge_label=cache.tensor(f"{name}_label") if cache.has(f"{name}_label") else None,
            neg_edge_index=cache.tensor(f"{name}_neg") if entry.get("has_negatives") else None,
            neg_per_positive=entry.get("neg_per_positive"),
        )
    return splits


def link_data_from_cache(cache: ArrayCache, x_cache: Optional[ArrayCache] = None) -> LinkData:
    """Open a link dataset's arrays from ``cache`` (``x`` from ``x_cache`` where the features live in another one).

    The metadata's ``splits`` entry lists the splits and their :func:`save_link_split` entries.
    """
    features = x_cache if x_cache is not None else cache
    return LinkData(
        edge_index=cache.tensor("edge_index"),
        x=features.tensor("x"),
        splits=link_splits_from_cache(cache, cache.meta()["splits"]),
        edge_attr=cache.tensor("edge_attr") if cache.has("edge_attr") else None,
        x_file=str(features.file("x")),
    )


class CachedLinkDataset(BuiltIntoCache, LinkDataset):
    """A :class:`LinkDataset` built once into an :class:`~lightning_zerocopy.datasets.base.ArrayCache` and
    memory-mapped from it afterwards.

    Subclasses set ``self.cache`` in ``__init__`` and implement :meth:`_write`, which writes ``edge_index.npy``,
    ``x.npy`` (optional ``edge_attr.npy``) and each split with :func:`save_link_split`, and returns the metadata,
    including ``splits`` (what :func:`save_link_split` returned, by split name).
    """

    _open = staticmethod(link_data_from_cache)
