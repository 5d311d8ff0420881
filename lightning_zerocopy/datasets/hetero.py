"""The heterogeneous node-classification dataset interface (PyG ``HeteroData`` names).

A graph with node types (``"paper"``, ``"author"``, ...) and edge types ``(src_type, relation, dst_type)``; one node
type carries the labels and the ``train``/``val``/``test`` splits (the *input type*). Node ids are local to their
type (``0 .. num_nodes[type] - 1``), as in PyG. Only some types need features: a type without ``x`` gets no ``x``
in a batch, and the user's module embeds it from ``n_id``.

A :class:`HeteroNodeDataset` knows its shape cheaply (node types, edge types, feature widths, classes: available
right after ``__init__`` so LightningCLI can link them into the model), builds once in :meth:`~HeteroNodeDataset.prepare`
and returns a :class:`HeteroNodeData` from :meth:`~HeteroNodeDataset.load`.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from lightning_zerocopy.datasets.base import GraphDataset, InputDataError, NodeSplits, check_edge_index
from lightning_zerocopy.graph.schema import EdgeType, edge_type_str, parse_edge_type

__all__ = [
    "EdgeType",
    "HeteroGraphDataset",
    "HeteroNodeData",
    "HeteroNodeDataset",
    "Metadata",
    "TypedGraphViews",
    "check_typed_graph",
    "edge_type_str",
    "first_out_of_range",
    "parse_edge_type",
    "typed_out_of_range",
]


class Metadata(tuple):
    """``(node types, edge types)`` as PyG's ``HeteroData.metadata()`` returns them, as a tuple that may also be
    called: a DataModule's ``metadata`` property gives one, so ``dm.metadata()`` (PyG's spelling, what ``to_hetero``
    examples write) and ``dm.metadata`` (this package's earlier property) are the same pair.

    A module built in Python with ``metadata=dm.metadata`` saves it among its hyperparameters; the class is
    registered with ``torch.serialization.add_safe_globals`` (below), so such a checkpoint resumes under
    ``torch.load(weights_only=True)``, Lightning's default, wherever this package is imported."""

    __slots__ = ()

    def __new__(cls, node_types: "list[str] | tuple[str, ...]", edge_types: "list[EdgeType]") -> "Metadata":
        return super().__new__(cls, ([str(t) for t in node_types], [tuple(e) for e in edge_types]))

    def __call__(self) -> tuple[list[str], list[EdgeType]]:
        """The pair, as ``HeteroData.metadata()`` returns it (fresh lists)."""
        return list(self[0]), list(self[1])

    def __getnewargs__(self) -> tuple:  # pickled as Metadata(node types, edge types): no other global needed
        return self()


torch.serialization.add_safe_globals([Metadata])


class TypedGraphViews:
    """What every heterogeneous data class (:class:`HeteroNodeData`, ``HeteroLinkData``) derives from its
    ``num_nodes``, ``edge_index`` and ``x``: the type lists, a type's feature width and the id check."""

    num_nodes: dict[str, int]
    edge_index: dict[EdgeType, torch.Tensor]
    x: dict[str, torch.Tensor]

    @property
    def node_types(self) -> list[str]:
        return list(self.num_nodes)

    @property
    def edge_types(self) -> list[EdgeType]:
        return list(self.edge_index)

    def num_features(self, node_type: str) -> Optional[int]:
        """Feature width of ``node_type``, or ``None`` for a type without features."""
        x = self.x.get(node_type)
        return None if x is None else int(x.shape[1])

    def check_ids(self) -> None:
        """Every edge's ids in range for their types (reads every edge once).

        Raises:
            InputDataError: naming the edge type, the endpoint, the first bad id and the type's count.
        """
        for edge_type, index in self.edge_index.items():
            bad = typed_out_of_range(index, edge_type, self.num_nodes)
            if bad is not None:
                row, column, held, limit = bad
                raise InputDataError(f"edge_index of {edge_type_str(edge_type)} holds {held} at [{row}, {column}], but "
                                     f"{limit}")  # fmt: skip


@dataclass
class HeteroNodeData(TypedGraphViews, NodeSplits):
    """A heterogeneous graph for node classification on one node type, held on the host.

    Attributes:
        num_nodes: nodes of every node type (a type without features and edges still has a count).
        edge_index: per edge type ``(src, rel, dst)``, int64 ``[2, E]``: row 0 holds ``src``-type ids, row 1
            ``dst``-type ids; messages flow row 0 → row 1 (PyG).
        x: floating ``[num_nodes[type], F_type]`` features of the types that have them (may be memory-mapped).
        input_type: the node type with labels and splits.
        y: int64 ``[num_nodes[input_type]]`` labels; ``-1`` marks an unlabeled node.
        train_idx, val_idx, test_idx: int64 ids of ``input_type`` nodes.
        x_files: the ``.npy`` file each type's ``x`` is mapped from, where there is one.
        attributes: other node- and edge-level tensors for the batches, by (level, type, name)
            (``datasets.attributes``), or ``None``.
    """

    num_nodes: dict[str, int]
    edge_index: dict[EdgeType, torch.Tensor]
    x: dict[str, torch.Tensor]
    input_type: str
    y: torch.Tensor
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    x_files: dict[str, str] = field(default_factory=dict)
    attributes: Optional[dict[Any, Any]] = None

    def __post_init__(self) -> None:
        """Types, shapes and dtypes; a mismatch is the dataset's content, so an :class:`InputDataError` naming the
        type. Ids out of range are checked by :meth:`check_ids` (it reads every edge)."""
        if self.input_type not in self.num_nodes:
            raise InputDataError(f"input type {self.input_type!r} is not a node type (node types: "
                                 f"{', '.join(sorted(self.num_nodes))})")  # fmt: skip
        check_typed_graph(self.num_nodes, self.edge_index, self.x)
        count = self.num_nodes[self.input_type]
        if self.y.shape != (count,):
            raise InputDataError(f"y of the input type {self.input_type!r} must have shape [{count}], "
                                 f"got {tuple(self.y.shape)}")  # fmt: skip
        self._check_split_ids(f"{self.input_type!r} ids")


def check_typed_graph(
    num_nodes: dict[str, int], edge_index: dict[EdgeType, torch.Tensor], x: dict[str, torch.Tensor]
) -> None:
    """Types, shapes and dtypes of a typed graph (every edge type's node types counted, ``[2, E]`` int64 edges, one
    feature row per node); cheap (no edge is read).

    Raises:
        InputDataError: naming the type and what is wrong.
    """
    for edge_type, index in edge_index.items():
        name = edge_type_str(edge_type)
        for node_type in (edge_type[0], edge_type[2]):
            if node_type not in num_nodes:
                raise InputDataError(f"edge type {name} names the node type {node_type!r}, which has no node "
                                     f"count (node types: {', '.join(sorted(num_nodes))})")  # fmt: skip
        check_edge_index(index, f"edge_index of {name}")
    for node_type, features in x.items():
        if node_type not in num_nodes:
            raise InputDataError(f"features are given for {node_type!r}, which is not a node type")
        if features.dim() != 2 or features.shape[0] != num_nodes[node_type]:
            raise InputDataError(f"x of node type {node_type!r} has shape {tuple(features.shape)}, but the type has "
                                 f"{num_nodes[node_type]:,} nodes: one feature row per node is needed")  # fmt: skip


def typed_out_of_range(
    index: torch.Tensor, edge_type: EdgeType, num_nodes: dict[str, int]
) -> Optional[tuple[int, int, str, str]]:
    """The first id of ``index`` ``[2, E]`` of ``edge_type`` out of range for its row's type (row 0 first; reads the
    rows in chunks), or ``None``: ``(row, column, "the 'paper' id 7", "'paper' has 5 nodes (ids 0 to 4)")``, the
    pieces of every typed edge's message."""
    for row, node_type in ((0, edge_type[0]), (1, edge_type[2])):
        count = num_nodes[node_type]
        bad = first_out_of_range(index[row], count)
        if bad is not None:
            limit = f"{node_type!r} has {count:,} nodes (ids 0 to {count - 1:,})"
            return row, bad[0], f"the {node_type!r} id {bad[1]}", limit
    return None


def first_out_of_range(ids: torch.Tensor, count: int) -> Optional[tuple[int, int]]:
    """``(position, id)`` of the first id of the 1-D ``ids`` outside ``[0, count)``, or ``None``; reads a
    memory-mapped tensor in chunks."""
    chunk = 1 << 24
    for start in range(0, int(ids.numel()), chunk):
        part = ids[start : start + chunk]
        bad = (part < 0) | (part >= count)
        if bool(bad.any()):
            position = int(bad.nonzero()[0])
            return start + position, int(part[position])
    return None


class HeteroGraphDataset(GraphDataset):
    """The typed form of :class:`~lightning_zerocopy.datasets.base.GraphDataset`: its node and edge types, node
    counts and feature widths (cheap shape properties). :class:`HeteroNodeDataset` (node classification) and
    ``HeteroLinkDataset`` (link prediction) add their task's own."""

    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        """``(node types, edge types)``, as PyG's ``HeteroData.metadata()`` gives them."""
        return list(self.node_types), list(self.edge_types)

    @property
    @abstractmethod
    def node_types(self) -> list[str]:
        """Every node type."""

    @property
    @abstractmethod
    def edge_types(self) -> list[EdgeType]:
        """Every edge type ``(src, rel, dst)``."""

    @property
    @abstractmethod
    def num_nodes(self) -> dict[str, int]:
        """Nodes of every node type (cheap: a model sizes its embeddings of featureless types from it)."""

    @property
    @abstractmethod
    def num_features(self) -> dict[str, int]:
        """Feature width of each node type that has features (types without features are absent)."""


class HeteroNodeDataset(HeteroGraphDataset):
    """A heterogeneous node-classification dataset (:class:`HeteroGraphDataset`): the input type and
    :attr:`num_classes` besides the types (cheap), :meth:`load` returns a :class:`HeteroNodeData`."""

    @property
    @abstractmethod
    def input_type(self) -> str:
        """The node type with labels and splits."""

    @property
    @abstractmethod
    def num_classes(self) -> int:
        """Number of classes of ``y``."""

    @abstractmethod
    def load(self) -> HeteroNodeData:
        """Return the dataset's arrays (memory-mapped where large), preparing them first if needed."""
