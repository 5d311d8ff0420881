"""Any PyG ``HeteroData`` with labels and splits on one node type as a :class:`HeteroNodeDataset`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import torch
from torch_geometric.data import Dataset, HeteroData

from lightning_zerocopy.datasets.attributes import pyg_attributes, split_is_mask
from lightning_zerocopy.datasets.base import InputDataError, progress_bar
from lightning_zerocopy.datasets.hetero import EdgeType, HeteroNodeData, HeteroNodeDataset, typed_out_of_range
from lightning_zerocopy.datasets.pyg import as_features, as_ids, graph_of, node_count, split_attribute, split_ids
from lightning_zerocopy.datasets.saved_graph import GraphFile

__all__ = ["PyGHeteroDataset"]

def _node(node_type: str) -> str:
    """How messages name a node store: ``data['paper']``."""
    return f"data[{node_type!r}]"


def _edge(edge_type: EdgeType) -> str:
    """How messages name an edge store: ``data['author', 'writes', 'paper']``."""
    return "data[" + ", ".join(repr(part) for part in edge_type) + "]"


class PyGHeteroDataset(HeteroNodeDataset):
    """Wraps a PyG ``HeteroData`` (or graph 0 of a PyG ``Dataset`` of them, or a ``torch.save``d ``HeteroData``).

    Each node type needs ``x`` or ``num_nodes`` (both: they must agree); the types with ``x`` have features (float64
    or integer features are converted to float32). Each edge type needs ``edge_index`` of ids local to its source and
    destination types. The input type needs ``y`` and, per split, a boolean ``<split>_mask`` or an index tensor
    ``<split>_idx`` (``train``, ``val``, ``test``). The graph is held in memory as given (no cache). Every other node- and
    edge-level tensor reaches the batches on its store, as PyG's loaders carry it (:mod:`~.attributes`).

    Args:
        data: the ``HeteroData``, a PyG ``Dataset`` (its graph 0 is used) or the path of a ``.pt`` file.
        input_type: the node type with labels and splits; default: the only node type with ``y``.
        num_classes: number of classes; default: the largest label + 1.
    """

    def __init__(
        self,
        data: Union[HeteroData, Dataset, GraphFile],
        input_type: Optional[str] = None,
        num_classes: Optional[int] = None,
    ) -> None:
        self._origin = f"{data}: " if isinstance(data, (str, Path)) else ""  # errors name the file
        data = graph_of(data, "a torch_geometric HeteroData, a Dataset of them or a path to a saved HeteroData",
                        HeteroData, " (for a homogeneous Data use PyGNodeDataset)")  # fmt: skip
        self.data = data
        labeled = [t for t in data.node_types if data[t].get("y") is not None]
        if input_type is None:
            if len(labeled) != 1:
                found = f"{len(labeled)} ({', '.join(labeled)})" if labeled else "none"
                raise ValueError(f"set `input_type`: the node type with labels and splits (node types with y: {found})")
            input_type = labeled[0]
        if input_type not in data.node_types:
            raise ValueError(f"input_type {input_type!r} is not a node type of the HeteroData (node types: "
                             f"{', '.join(data.node_types)})")  # fmt: skip
        if data[input_type].get("y") is None:
            raise ValueError(f"the input type {input_type!r} has no `y`: set {_node(input_type)}.y to its labels")
        self._input_type = input_type
        self._num_nodes = {t: self._count(t) for t in data.node_types}
        y = data[input_type].y
        self._num_classes = int(num_classes) if num_classes is not None else int(y.max()) + 1 if y.numel() else 0

    def _count(self, node_type: str) -> int:
        """Nodes of ``node_type``: ``x``'s rows, checked against ``num_nodes`` where both are set."""
        count = node_count(self.data[node_type], _node(node_type), self._origin)
        if count is None:
            raise InputDataError(f"{self._origin}{_node(node_type)} has neither x nor num_nodes: set "
                                 f"{_node(node_type)}.num_nodes to the type's node count")  # fmt: skip
        return count

    @property
    def node_types(self) -> list[str]:
        return list(self.data.node_types)

    @property
    def edge_types(self) -> list[EdgeType]:
        return [tuple(t) for t in self.data.edge_types]  # type: ignore[misc]

    @property
    def num_nodes(self) -> dict[str, int]:
        return dict(self._num_nodes)

    @property
    def input_type(self) -> str:
        return self._input_type

    @property
    def num_features(self) -> dict[str, int]:
        return {t: int(self.data[t].x.shape[1]) for t in self.data.node_types if self.data[t].get("x") is not None}

    @property
    def num_classes(self) -> int:
        return self._num_classes

    def split_source(self, split: str) -> str:
        """The attribute that defines the split, e.g. ``data['paper'].train_mask``."""
        return f"{_node(self._input_type)}.{split_attribute(self.data[self._input_type], split)}"

    def split_is_mask(self, split: str) -> bool:
        """Whether ``split`` is a boolean mask (batches' ``input_id`` then holds node ids, as in PyG)."""
        return split_is_mask(self.data[self._input_type], split)

    def load(self) -> HeteroNodeData:
        """The graph's arrays, checked.

        Raises:
            InputDataError: a field that cannot be trained on, naming the node or edge type, the field and its first
                bad value: a non-integer or out-of-range id in an ``edge_index`` (ranges are per type), an edge type
                naming a node type without ``x`` or ``num_nodes``, a ``y`` or mask with another length than the input
                type's node count, a non-integer label or split id.
        """
        d, origin = self.data, self._origin
        edge_index = {}
        total = sum(int(d[t].edge_index.shape[-1]) for t in self.edge_types if d[t].get("edge_index") is not None)
        with progress_bar(total, "checking edge_index per edge type", "edge") as bar:  # shown past a second
            for edge_type in self.edge_types:
                edge_index[edge_type] = self._edge_index(edge_type)
                bar.update(int(edge_index[edge_type].shape[1]))
        x = {node_type: as_features(d[node_type].x) for node_type in d.node_types if d[node_type].get("x") is not None}
        t = self._input_type
        count = self._num_nodes[t]
        y = d[t].y
        if y.numel() != count:
            raise InputDataError(f"{origin}{_node(t)}.y has {y.numel():,} entries but {t!r} has {count:,} nodes: one "
                                 "label per node (-1 for unlabeled)")  # fmt: skip
        return HeteroNodeData(
            num_nodes=dict(self._num_nodes),
            edge_index=edge_index,
            x=x,
            input_type=t,
            y=as_ids(y.reshape(-1), f"{_node(t)}.y", "class (an integer label, -1 for unlabeled)", origin),
            train_idx=self._split_ids("train"),
            val_idx=self._split_ids("val"),
            test_idx=self._split_ids("test"),
            attributes=pyg_attributes(d, ("x", "train_idx", "val_idx", "test_idx"), labelled_type=t, origin=origin),
        )

    def _edge_index(self, edge_type: EdgeType) -> torch.Tensor:
        store, origin, field = self.data[edge_type], self._origin, f"{_edge(edge_type)}.edge_index"
        if store.get("edge_index") is None:
            raise InputDataError(f"{origin}{_edge(edge_type)} has no edge_index: set it to the type's [2, num_edges] "
                                 "node ids, or delete the edge type")  # fmt: skip
        for node_type in (edge_type[0], edge_type[2]):
            if node_type not in self._num_nodes:
                raise InputDataError(f"{origin}{field} names the node type {node_type!r}, which has no node store: "
                                     f"set {_node(node_type)}.num_nodes (or .x)")  # fmt: skip
        index = store.edge_index
        if index.dim() != 2 or index.shape[0] != 2:
            raise InputDataError(f"{origin}{field} has shape {tuple(index.shape)}: it must be [2, num_edges]")
        index = as_ids(index, field, "node id", origin)
        bad = typed_out_of_range(index, edge_type, self._num_nodes)
        if bad is not None:
            row, column, held, limit = bad
            raise InputDataError(f"{origin}{field} holds {held} at [{row}, {column}] (a "
                                 f"{('source', 'destination')[row]}), but {limit}")  # fmt: skip
        return index

    def _split_ids(self, split: str) -> torch.Tensor:
        t, count = self._input_type, self._num_nodes[self._input_type]
        return split_ids(self.data[t], split, count, f"{t!r} has {count:,} nodes", self._origin, _node(t), f"{t!r} id",
                         f"the input type {t!r}")  # fmt: skip
