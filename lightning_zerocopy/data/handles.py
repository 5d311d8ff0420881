"""Picklable names of a dataset's shared host memory (no data): what every process opens a batch path from.

:func:`~lightning_zerocopy.data.host.share.share_host_data` creates them; :class:`~lightning_zerocopy.data.resources.HostData`
maps them; they pickle to any local process (a pipeline worker, a DDP rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from lightning_zerocopy.gather.host_table import FeatureTableHandle
from lightning_zerocopy.graph.csc import CSCGraphHandle
from lightning_zerocopy.graph.fused_csc import FusedCSCHandle
from lightning_zerocopy.graph.schema import NODE, AttributeKey, EdgeType, GraphSchema
from lightning_zerocopy.graph.shared_memory import SharedTensorHandle, TensorHandle

__all__ = ["AttributeHandle", "HeteroHostGraphHandles", "HostGraphHandles", "NodeOrderHandles"]


@dataclass(frozen=True)
class AttributeHandle:
    """Picklable name of one node- or edge-level attribute of the dataset in shared host memory (no data).

    Attributes:
        rows: the attribute with its node/edge dimension first, contiguous: row ``i`` is node or edge ``i`` of its
            type, in the dataset's ids (never renumbered by a node order).
        dim: where the batch puts that dimension back (PyG's ``__cat_dim__``).
    """

    rows: TensorHandle
    dim: int = 0


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


class ByType:
    """What both the handles and the host memory they map (:class:`~lightning_zerocopy.data.resources.HostData`) give
    of their graphs and tables keyed by type: an untyped graph's one graph and one table, the seeds' type."""

    schema: GraphSchema
    graphs: Any  # by edge type: ``(edge type, graph)`` pairs or a dict
    tables: Any  # by node type, likewise

    @property
    def input_type(self) -> Optional[str]:
        return self.schema.input_type

    @property
    def graph(self) -> Any:
        """The graph of a one-edge-type schema (an untyped graph's)."""
        (graph,) = dict(self.graphs).values()
        return graph

    @property
    def features(self) -> Any:
        """The feature table of an untyped graph; a typed graph's tables by node type (:attr:`tables`, as they are)."""
        return self.tables if self.schema.is_typed else dict(self.tables)[NODE]


@dataclass(frozen=True)
class HostGraphHandles(ByType):
    """Picklable names of everything a batch is built from (no data), keyed by type.

    An untyped graph is the one-type case of its :class:`~lightning_zerocopy.graph.schema.GraphSchema`: one graph
    under :data:`~lightning_zerocopy.graph.schema.EDGE`, one table under
    :data:`~lightning_zerocopy.graph.schema.NODE`. Pairs rather than dicts, so the handles hash (their order is the
    schema's, which is the sampler's order of edge types).

    Attributes:
        schema: the node types, edge types and the seeds' type.
        num_nodes: ``(node type, count)`` of every node type.
        graphs: ``(edge type, CSC)`` of every edge type: the incoming ``src``-type neighbors of each ``dst``-type
            node, over ``max(num_nodes[src], num_nodes[dst])`` ids (see :mod:`lightning_zerocopy.data.host.share`).
        tables: ``(node type, feature table)`` of the types that have features.
        labels: int64 labels of the input type, or ``None`` for a task without node labels (link prediction).
        splits: the split tensors, by name: int64 input-type ids of each node split (``"train"``, ``"val"``,
            ``"test"``) or the supervision edges of each link split (``"train.pos_edge_index"``...), always the
            dataset's ids.
        attributes: ``(key, handle)`` of every node- and edge-level attribute that reaches the batches
            (``edge_attr`` among them), keyed by ``(level, type, name)``.
        node_order: the renumbering the graph, features and labels are stored in (one node type only), or ``None``
            when they use the dataset's ids. Splits, attributes and the graph's edge ids (``edge_perm``) are
            never renumbered, and the builder yields the dataset's ids either way.
        fused: a typed graph of several types: the CSC of every edge type with edge-type offsets that its sampler
            reads (:mod:`lightning_zerocopy.graph.fused_csc`), built once with the per-edge-type CSCs; ``None``
            otherwise.
    """

    schema: GraphSchema
    num_nodes: tuple[tuple[str, int], ...]
    graphs: tuple[tuple[EdgeType, CSCGraphHandle], ...]
    tables: tuple[tuple[str, FeatureTableHandle], ...]
    labels: Optional[TensorHandle]
    splits: Mapping[str, TensorHandle]
    attributes: tuple[tuple[AttributeKey, AttributeHandle], ...] = ()
    node_order: Optional[NodeOrderHandles] = None
    fused: Optional[FusedCSCHandle] = None

    @property
    def node_types(self) -> list[str]:
        return list(self.schema.node_types)

    @property
    def edge_types(self) -> list[EdgeType]:
        return list(self.schema.edge_types)

    def key(self) -> tuple:
        """What identifies this host memory (hashable: ``splits`` is a dict), e.g. to share one placement of it."""
        return (self.schema, self.graphs, self.tables, self.labels, self.attributes, self.node_order, self.fused)

    def unlink(self) -> None:
        """Remove the names of every shared segment (files on disk are kept); mappings stay valid."""
        for _, graph in self.graphs:
            graph.unlink()
        for _, table in self.tables:
            table.unlink()
        if self.node_order is not None:
            self.node_order.unlink()
        if self.fused is not None:
            self.fused.unlink()
        for handle in (self.labels, *(a.rows for _, a in self.attributes), *self.splits.values()):
            if isinstance(handle, SharedTensorHandle):
                handle.unlink()


#: The handles of a typed graph are the same class (kept under this name for existing imports).
HeteroHostGraphHandles = HostGraphHandles
