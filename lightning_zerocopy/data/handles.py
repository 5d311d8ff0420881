"""Picklable names of a dataset's shared host memory (no data): what every process opens a batch path from.

:func:`~lightning_zerocopy.data.host.share.share_node_data` creates them; :class:`~lightning_zerocopy.data.resources.HostData`
maps them; they pickle to any local process (a pipeline worker, a DDP rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from lightning_zerocopy.gather.host_table import FeatureTableHandle
from lightning_zerocopy.graph.csc import CSCGraphHandle
from lightning_zerocopy.graph.shared_memory import SharedTensorHandle, TensorHandle

__all__ = ["HeteroHostGraphHandles", "HostGraphHandles", "NodeOrderHandles"]


@dataclass(frozen=True)
class NodeOrderHandles:
    """Picklable names of the node renumbering the host memory is stored in (no data).

    Attributes:
        kind: how the order was computed (``"bfs"`` or ``"degree"``).
        order: int64 ``[num_nodes]``, ``order[internal_id] = original_id`` (maps a batch's ``n_id`` back).
        rank: int64 ``[num_nodes]``, ``rank[original_id] = internal_id`` (maps the plan's seeds in).
    """

    kind: str
    order: TensorHandle
    rank: TensorHandle

    def unlink(self) -> None:
        """Remove the names of the shared segments (files on disk are kept); mappings stay valid."""
        for handle in (self.order, self.rank):
            if isinstance(handle, SharedTensorHandle):
                handle.unlink()


@dataclass(frozen=True)
class HostGraphHandles:
    """Picklable names of everything a batch is built from (no data).

    Attributes:
        graph: the CSC graph.
        features: the node feature table.
        labels: int64 labels of every node, or ``None`` for a task without node labels (link prediction).
        splits: the split tensors, by name: int64 node ids of each node split (``"train"``, ``"val"``, ``"test"``)
            or the supervision edges of each link split (``"train.pos_edge_index"``...), always original ids.
        edge_attr: edge features in the dataset's edge order, if the dataset has them.
        node_order: the renumbering ``graph``, ``features`` and ``labels`` are stored in, or ``None`` when
            they use the dataset's ids. Splits, ``edge_attr`` and the graph's edge ids (``edge_perm``) are
            never renumbered, and :class:`BatchBuilder` yields original ids either way.
    """

    graph: CSCGraphHandle
    features: FeatureTableHandle
    labels: Optional[TensorHandle]
    splits: Mapping[str, TensorHandle]
    edge_attr: Optional[TensorHandle] = None
    node_order: Optional[NodeOrderHandles] = None

    def key(self) -> tuple:
        """What identifies this host memory (hashable: ``splits`` is a dict), e.g. to share one placement of it."""
        return (self.graph, self.features, self.labels, self.edge_attr, self.node_order)

    def unlink(self) -> None:
        """Remove the names of every shared segment (files on disk are kept); mappings stay valid."""
        self.graph.unlink()
        self.features.unlink()
        if self.node_order is not None:
            self.node_order.unlink()
        for handle in (self.labels, self.edge_attr, *self.splits.values()):
            if isinstance(handle, SharedTensorHandle):
                handle.unlink()


@dataclass(frozen=True)
class HeteroHostGraphHandles:
    """Picklable names of a heterogeneous dataset's shared host memory (no data); built by
    :func:`~lightning_zerocopy.data.host.hetero.share_hetero_data`, mapped by
    :class:`~lightning_zerocopy.data.hetero_resources.HeteroHostData`.

    Pairs rather than dicts, so the handles hash (their order is the dataset's order of node and edge types, which
    is the sampler's order of edge types).

    Attributes:
        input_type: the node type with labels and splits.
        num_nodes: ``(node type, count)`` of every node type.
        graphs: ``(edge type, CSC)`` of every edge type: the incoming ``src``-type neighbors of each ``dst``-type
            node, over ``max(num_nodes[src], num_nodes[dst])`` ids (see :mod:`lightning_zerocopy.data.host.hetero`).
        features: ``(node type, feature table)`` of the types that have features.
        labels: int64 labels of the input type, or ``None`` for a task without node labels (link prediction).
        splits: int64 input-type ids of each split (``"train"``, ``"val"``, ``"test"``), or the supervision edges of
            each link split (``"train.pos_edge_index"``..., :mod:`lightning_zerocopy.data.host.links`).
        link_edge_type: the supervised edge type of a link dataset (its source type is ``input_type``), else ``None``.
    """

    input_type: str
    num_nodes: tuple[tuple[str, int], ...]
    graphs: tuple[tuple[tuple[str, str, str], CSCGraphHandle], ...]
    features: tuple[tuple[str, FeatureTableHandle], ...]
    labels: Optional[TensorHandle]
    splits: Mapping[str, TensorHandle]
    link_edge_type: Optional[tuple[str, str, str]] = None

    @property
    def node_types(self) -> list[str]:
        return [t for t, _ in self.num_nodes]

    @property
    def edge_types(self) -> list[tuple[str, str, str]]:
        return [et for et, _ in self.graphs]

    def key(self) -> tuple:
        """What identifies this host memory (hashable: ``splits`` is a dict), e.g. to share one placement of it."""
        return (self.input_type, self.graphs, self.features, self.labels)

    def unlink(self) -> None:
        """Remove the names of every shared segment (files on disk are kept); mappings stay valid."""
        for _, graph in self.graphs:
            graph.unlink()
        for _, table in self.features:
            table.unlink()
        for handle in (self.labels, *self.splits.values()):
            if isinstance(handle, SharedTensorHandle):
                handle.unlink()
