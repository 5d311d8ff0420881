"""The types of a graph: which node types and edge types it has, and which node type the seeds are.

One schema serves every graph of the package. An untyped graph (PyG's ``Data``) is the one-type case: a single node
type :data:`NODE` and a single edge type :data:`EDGE` (DGL's names for a homogeneous graph, ``"_N"`` and
``("_N", "_E", "_N")``), so host data, resources, samplers and batches are keyed by type either way and a
homogeneous graph is not a second code path. What differs at the last step only is the batch class: ``Data`` for an
untyped schema, ``HeteroData`` otherwise (PyG's ``NodeLoader.filter_fn``).

A typed graph names its node types and edge types ``(source type, relation, destination type)`` as PyG's
``HeteroData.metadata()`` does; the order of :attr:`GraphSchema.edge_types` is the order the sampler draws them in.
A node- or edge-level attribute of the graph is keyed by :class:`AttributeKey` ``(level, type, name)`` (GraphBolt's
``FeatureKey(domain, type, name)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, Optional, Sequence, Union

__all__ = ["EDGE", "NODE", "AttributeKey", "EdgeType", "GraphSchema", "edge_type_str", "parse_edge_type"]

#: ``(source node type, relation, destination node type)``, PyG's key of an edge type.
EdgeType = tuple[str, str, str]

#: The node type of an untyped graph.
NODE = "_N"
#: The edge type of an untyped graph.
EDGE: EdgeType = (NODE, "_E", NODE)


def edge_type_str(edge_type: EdgeType) -> str:
    """PyG's string form of an edge type: ``("paper", "cites", "paper")`` → ``"paper__cites__paper"``."""
    return "__".join(edge_type)


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


@dataclass(frozen=True)
class GraphSchema:
    """Node types, edge types and the seeds' node type of a graph (hashable, picklable; no data).

    Attributes:
        node_types: every node type, in order (a batch has all of them).
        edge_types: every edge type ``(src, rel, dst)``, in the order they are sampled.
        input_type: the node type of the seeds (labels and node splits live there), or ``None`` when the seeds come
            per node type (link prediction over a typed edge type).

    Raises:
        ValueError: no node type, a node type named twice, an edge type naming an unknown node type, or an
            ``input_type`` that is no node type.
    """

    node_types: tuple[str, ...]
    edge_types: tuple[EdgeType, ...]
    input_type: Optional[str] = NODE

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_types", tuple(str(t) for t in self.node_types))
        object.__setattr__(self, "edge_types", tuple((str(s), str(r), str(d)) for s, r, d in self.edge_types))
        if not self.node_types or len(set(self.node_types)) != len(self.node_types):
            raise ValueError(f"a graph needs distinct node types, got {list(self.node_types)}")
        for edge_type in self.edge_types:
            for node_type in (edge_type[0], edge_type[2]):
                if node_type not in self.node_types:
                    raise ValueError(f"the edge type {edge_type_str(edge_type)} names the node type {node_type!r}, "
                                     f"which is not one of {list(self.node_types)}")  # fmt: skip
        if self.input_type is not None and self.input_type not in self.node_types:
            raise ValueError(f"the input type {self.input_type!r} is not one of the node types {list(self.node_types)}")

    @classmethod
    def untyped(cls) -> "GraphSchema":
        """The schema of an untyped graph: one node type :data:`NODE`, one edge type :data:`EDGE`."""
        return cls((NODE,), (EDGE,), NODE)

    @classmethod
    def typed(
        cls, node_types: Sequence[str], edge_types: Sequence[Sequence[str]], input_type: Optional[str] = None
    ) -> "GraphSchema":
        """The schema of a typed graph (edge types given as tuples or lists of three names)."""
        return cls(tuple(node_types), tuple((e[0], e[1], e[2]) for e in edge_types), input_type)

    @property
    def is_typed(self) -> bool:
        """Whether batches are ``HeteroData`` (``False``: the untyped schema, batches are ``Data``)."""
        return self.node_types != (NODE,) or self.edge_types != (EDGE,)

    @property
    def one_type(self) -> bool:
        """One node type and one edge type between its nodes: the sampler's fused multi-hop kernel applies."""
        return len(self.node_types) == 1 and len(self.edge_types) == 1

    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        """``(node types, edge types)`` as PyG's ``HeteroData.metadata()``."""
        return list(self.node_types), list(self.edge_types)

    def edge_types_from(self, node_type: str) -> list[EdgeType]:
        """The edge types whose source is ``node_type`` (whose CSC ``indices`` hold its ids)."""
        return [et for et in self.edge_types if et[0] == node_type]


class AttributeKey(NamedTuple):
    """Where an attribute lives: ``level`` ``"node"`` (indexed by ``n_id``) or ``"edge"`` (by ``e_id``), the node or
    edge type (an untyped graph's ``_N`` / ``("_N", "_E", "_N")``) and the attribute's name."""

    level: Literal["node", "edge"]
    type: Union[str, EdgeType]
    name: str

    def describe(self) -> str:
        """How messages name it, as the user wrote it: ``data.edge_weight``, ``data['paper'].train_mask``."""
        if self.type in (NODE, EDGE):
            return f"data.{self.name}"
        parts = (self.type,) if isinstance(self.type, str) else self.type
        return "data[" + ", ".join(repr(p) for p in parts) + f"].{self.name}"
