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

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from lightning_zerocopy.datasets.base import InputDataError

__all__ = [
    "EdgeType",
    "HeteroGraphDataset",
    "HeteroNodeData",
    "HeteroNodeDataset",
    "Metadata",
    "TypedGraphViews",
    "check_typed_graph",
    "check_typed_ids",
    "edge_type_str",
    "first_out_of_range",
    "parse_edge_type",
]

#: ``(source node type, relation, destination node type)``, PyG's key of an edge type.
EdgeType = tuple[str, str, str]

_SPLITS = ("train", "val", "test")


def edge_type_str(edge_type: EdgeType) -> str:
    """PyG's string form of an edge type: ``("paper", "cites", "paper")`` → ``"paper__cites__paper"``."""
    return "__".join(edge_type)


class Metadata(tuple):
    """``(node types, edge types)`` as PyG's ``HeteroData.metadata()`` returns them, as a tuple that may also be
    called: a DataModule's ``metadata`` property gives one, so ``dm.metadata()`` (PyG's spelling, what ``to_hetero``
    examples write) and ``dm.metadata`` (this package's earlier property) are the same pair. It pickles as a plain
    tuple (a checkpoint's hyperparameters then load with ``torch.load(weights_only=True)``)."""

    def __new__(cls, node_types: "list[str] | tuple[str, ...]", edge_types: "list[EdgeType]") -> "Metadata":
        return super().__new__(cls, ([str(t) for t in node_types], [tuple(e) for e in edge_types]))

    def __call__(self) -> tuple[list[str], list[EdgeType]]:
        """The pair, as ``HeteroData.metadata()`` returns it (fresh lists)."""
        return list(self[0]), list(self[1])

    def __reduce__(self) -> tuple:
        return tuple, (self(),)


def parse_edge_type(text: str) -> EdgeType:
    """The edge type of PyG's string form ``"src__relation__dst"`` (YAML keys of ``num_neighbors``).

    Raises:
        ValueError: ``text`` does not have exactly three non-empty parts separated by ``__``.
    """
    parts = text.split("__")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"{text!r} is not an edge type: write it as 'source__relation__destination', "
                         f"e.g. 'paper__cites__paper'")  # fmt: skip
    return parts[0], parts[1], parts[2]


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
        check_typed_ids(self.num_nodes, self.edge_index)


@dataclass
class HeteroNodeData(TypedGraphViews):
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
        for name in ("train_idx", "val_idx", "test_idx"):
            idx = getattr(self, name)
            if idx.dim() != 1 or idx.dtype != torch.int64:
                raise InputDataError(f"{name} must be a 1-D int64 tensor of {self.input_type!r} ids, "
                                     f"got {idx.dtype} {tuple(idx.shape)}")  # fmt: skip

    def split(self, name: str) -> torch.Tensor:
        """``input_type`` ids of split ``name``: ``"train"``, ``"val"`` or ``"test"``."""
        if name not in _SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {_SPLITS}")
        return getattr(self, f"{name}_idx")



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
        if index.dim() != 2 or index.shape[0] != 2:
            raise InputDataError(f"edge_index of {name} must have shape [2, num_edges], got {tuple(index.shape)}")
        if index.dtype != torch.int64:
            raise InputDataError(f"edge_index of {name} must be an int64 tensor of node ids, got {index.dtype}")
    for node_type, features in x.items():
        if node_type not in num_nodes:
            raise InputDataError(f"features are given for {node_type!r}, which is not a node type")
        if features.dim() != 2 or features.shape[0] != num_nodes[node_type]:
            raise InputDataError(f"x of node type {node_type!r} has shape {tuple(features.shape)}, but the type has "
                                 f"{num_nodes[node_type]:,} nodes: one feature row per node is needed")  # fmt: skip


def check_typed_ids(num_nodes: dict[str, int], edge_index: dict[EdgeType, torch.Tensor]) -> None:
    """Every edge's ids in range for their types (reads every edge once).

    Raises:
        InputDataError: naming the edge type, the endpoint, the first bad id and the type's count.
    """
    for (src, rel, dst), index in edge_index.items():
        name = edge_type_str((src, rel, dst))
        for row, node_type in ((0, src), (1, dst)):
            bad = first_out_of_range(index[row], num_nodes[node_type])
            if bad is not None:
                position, value = bad
                count = num_nodes[node_type]
                raise InputDataError(f"edge_index of {name} holds the {node_type!r} id {value} at "
                                     f"[{row}, {position}], but {node_type!r} has {count:,} nodes (ids 0 to "
                                     f"{count - 1:,})")  # fmt: skip


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


class HeteroGraphDataset(ABC):
    """What every heterogeneous dataset gives before its arrays are loaded: its node and edge types, node counts and
    feature widths (cheap shape properties), and :meth:`prepare`. :class:`HeteroNodeDataset` (node classification)
    and ``HeteroLinkDataset`` (link prediction) add their task's own."""

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

    def prepare(self) -> None:
        """Build or convert the dataset into its cache. Safe to call more than once; the default does nothing."""


class HeteroNodeDataset(HeteroGraphDataset):
    """A heterogeneous node-classification dataset that LightningCLI can build from ``class_path``/``init_args``.

    Subclasses implement the cheap shape properties (no array is loaded), :meth:`prepare` (build or convert once,
    cache on disk; idempotent) and :meth:`load`.
    """

    @property
    @abstractmethod
    def input_type(self) -> str:
        """The node type with labels and splits."""

    @property
    @abstractmethod
    def num_classes(self) -> int:
        """Number of classes of ``y``."""

    def split_source(self, split: str) -> str:
        """Where the ids of ``split`` come from, for error messages. The default names the dataset class."""
        return f"the {split} split of {type(self).__name__}"

    @abstractmethod
    def load(self) -> HeteroNodeData:
        """Return the dataset's arrays (memory-mapped where large), preparing them first if needed."""
