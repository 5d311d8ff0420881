"""The heterogeneous link-prediction dataset interface: a typed graph and supervision-edge splits on one edge type.

A :class:`HeteroLinkData` is a :class:`~lightning_zerocopy.datasets.hetero.HeteroNodeData`-like graph (node types,
edge types ``(src, rel, dst)``, features on some types; no labels, no node splits) plus the *supervised edge type*
and its :class:`~lightning_zerocopy.datasets.links.LinkSplit` s, whose row 0 holds ``src``-type ids and row 1
``dst``-type ids (PyG's hetero ``LinkNeighborLoader(edge_label_index=(edge_type, pairs))``). The supervised edge type
is one of the graph's edge types; the val/test positives must not be in it (nor, for a reverse type, in that).

A :class:`HeteroLinkDataset` knows its shape cheaply (types, feature widths, node counts, the supervised edge type),
builds once in ``prepare`` and returns a :class:`HeteroLinkData` from ``load``. :class:`CachedHeteroLinkDataset`
stores one in an :class:`~lightning_zerocopy.datasets.base.ArrayCache` with the heterogeneous layout
(:mod:`~lightning_zerocopy.datasets.hetero_cache`: ``x.<type>``, ``edge_index.<src>__<rel>__<dst>``) and the link
splits' files (:func:`~lightning_zerocopy.datasets.links.save_link_split`).

:func:`check_hetero_link_splits` checks the splits: ids in range for their endpoint's type (one line naming the
type), then the homogeneous link checks (:func:`~lightning_zerocopy.datasets.link_checks.check_link_splits`: empty
splits, labels, positives among negatives; warnings for leaks, repeats, self-loops) over the supervised edge type.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Mapping, Optional

import torch

from lightning_zerocopy.datasets.base import ArrayCache, BuiltIntoCache, InputDataError
from lightning_zerocopy.datasets.hetero import (
    EdgeType,
    HeteroGraphDataset,
    TypedGraphViews,
    check_typed_graph,
    edge_type_str,
    parse_edge_type,
    typed_out_of_range,
)
from lightning_zerocopy.datasets.hetero_cache import open_typed_graph
from lightning_zerocopy.datasets.link_checks import check_link_splits
from lightning_zerocopy.datasets.links import LinkSplit, LinkSplits, link_splits_from_cache
from lightning_zerocopy.datasets.splits import SplitError

__all__ = [
    "CachedHeteroLinkDataset",
    "HeteroLinkData",
    "HeteroLinkDataset",
    "check_hetero_link_splits",
    "hetero_link_data_from_cache",
    "unknown_edge_type",
]


def unknown_edge_type(edge_type: Any, edge_types: list[EdgeType]) -> str:
    """The one-line message of a supervised edge type that is not one of the graph's ``edge_types``."""
    name = edge_type_str(edge_type) if isinstance(edge_type, tuple) else repr(edge_type)
    return (f"the supervised edge type {name} is not one of the graph's edge types "
            f"({', '.join(edge_type_str(et) for et in edge_types)})")  # fmt: skip


@dataclass
class HeteroLinkData(TypedGraphViews, LinkSplits):
    """A heterogeneous graph for link prediction on one edge type, held on the host.

    Attributes:
        num_nodes: nodes of every node type.
        edge_index: per edge type ``(src, rel, dst)``, int64 ``[2, E]`` message-passing edges (row 0 ``src`` ids).
        x: floating ``[num_nodes[type], F_type]`` features of the types that have them (may be memory-mapped).
        edge_type: the supervised edge type (one of ``edge_index``'s).
        splits: the supervision edges of each split present (a subset of ``train``/``val``/``test``): row 0 holds
            ``edge_type[0]`` ids, row 1 ``edge_type[2]`` ids.
        x_files: the ``.npy`` file each type's ``x`` is mapped from, where there is one.
        attributes: other node- and edge-level tensors for the batches, by (level, type, name)
            (``datasets.attributes``), or ``None``.
    """

    num_nodes: dict[str, int]
    edge_index: dict[EdgeType, torch.Tensor]
    x: dict[str, torch.Tensor]
    edge_type: EdgeType
    splits: dict[str, LinkSplit] = field(default_factory=dict)
    x_files: dict[str, str] = field(default_factory=dict)
    attributes: Optional[dict[Any, Any]] = None

    def __post_init__(self) -> None:
        """Types, shapes and dtypes (an :class:`InputDataError` naming the type); ids are checked by
        :meth:`check_ids` and :func:`check_hetero_link_splits` (they read every edge)."""
        self.edge_type = tuple(self.edge_type)  # type: ignore[assignment]
        check_typed_graph(self.num_nodes, self.edge_index, self.x)
        if self.edge_type not in self.edge_index:
            raise InputDataError(unknown_edge_type(self.edge_type, list(self.edge_index)))
        self._check_split_names()


def check_hetero_link_splits(data: HeteroLinkData, sources: Optional[Mapping[str, str]] = None) -> list[str]:
    """Check every split of ``data`` before training; return the warnings of the homogeneous link checks.

    Raises:
        SplitError: an id out of range for its endpoint's type (naming the type), or what
            :func:`~lightning_zerocopy.datasets.link_checks.check_link_splits` refuses.
    """
    sources = dict(sources or {})
    src, _, dst = data.edge_type
    for name, split in data.splits.items():
        for what, edges in (("pos_edge_index", split.pos_edge_index), ("neg_edge_index", split.neg_edge_index)):
            bad = None if edges is None else typed_out_of_range(edges, data.edge_type, data.num_nodes)
            if bad is not None:
                row, column, held, limit = bad
                raise SplitError(name, sources.get(name, f"the {name} link split"), f"holds {held} as the "
                                 f"{('source', 'destination')[row]} of {what} column {column:,}, but {limit}")
    # one id space covering both endpoint types: the pair keys of the homogeneous checks hold for typed pairs
    view = SimpleNamespace(
        num_nodes=max(data.num_nodes[src], data.num_nodes[dst]), splits=data.splits,
        edge_index=data.edge_index[data.edge_type],
    )  # fmt: skip
    return check_link_splits(view, sources, self_loops=src == dst)  # type: ignore[arg-type]


class HeteroLinkDataset(HeteroGraphDataset):
    """A heterogeneous link-prediction dataset (:class:`~lightning_zerocopy.datasets.hetero.HeteroGraphDataset`): the
    supervised edge type besides the types (cheap), :meth:`load` returns a :class:`HeteroLinkData`."""

    _split_noun = "link split"

    @property
    @abstractmethod
    def edge_type(self) -> EdgeType:
        """The supervised edge type (one of :attr:`edge_types`)."""

    @abstractmethod
    def load(self) -> HeteroLinkData:
        """Return the dataset's arrays (memory-mapped where large), preparing them first if needed."""


def hetero_link_data_from_cache(cache: ArrayCache) -> HeteroLinkData:
    """Open a heterogeneous link cache (:func:`~lightning_zerocopy.datasets.hetero_cache.typed_graph_entries` with
    ``edge_type`` and ``splits``) as a :class:`HeteroLinkData`, every array memory-mapped.

    Raises:
        DatasetFileError: ``meta.json`` lacks a key (the message says to delete the cache directory).
    """
    graph, (supervised, entries) = open_typed_graph(
        cache, "a heterogeneous link dataset", lambda meta: (parse_edge_type(meta["edge_type"]), dict(meta["splits"]))
    )
    return HeteroLinkData(**graph, edge_type=supervised, splits=link_splits_from_cache(cache, entries))


class CachedHeteroLinkDataset(BuiltIntoCache, HeteroLinkDataset):
    """A :class:`HeteroLinkDataset` built once into an :class:`ArrayCache` (``self.cache``) by ``_write`` and
    memory-mapped from it afterwards (:func:`hetero_link_data_from_cache`).

    ``_write(out)`` writes ``x.<type>.npy``, ``edge_index.<edge type>.npy`` and every split
    (:func:`~lightning_zerocopy.datasets.links.save_link_split`) into ``out`` and returns the metadata
    (:func:`~lightning_zerocopy.datasets.hetero_cache.typed_graph_entries` with ``edge_type`` and ``splits``).
    """

    _open = staticmethod(hetero_link_data_from_cache)
