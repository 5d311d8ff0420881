"""Per-hop trimming: each GNN layer computes only the nodes and edges that the remaining layers still need.

A sampled batch (PyG ``NeighborLoader``'s layout, which ours keeps) orders its nodes by hop (the seeds, then
hop 1's new nodes, ...) and its edges by hop (the edges into the seeds first), and records the counts in
``num_sampled_nodes`` / ``num_sampled_edges``. Layer ``i`` of an ``L``-layer GNN only has to produce
representations for nodes within ``L - 1 - i`` hops of the seeds, from neighbors within ``L - i`` hops: every
later hop is dead work. PyG's :func:`torch_geometric.utils.trim_to_layer` (and ``BasicGNN.forward``'s
``num_sampled_nodes_per_hop`` / ``num_sampled_edges_per_hop``) drop one hop per layer, which is exact when the
batch has as many hops as the model has layers. :func:`counts_for_layers` makes that so for any batch: it cuts
hops no layer can reach (more hops than layers) and pads hops that were not sampled (fewer hops than layers, e.g.
``eval_fanouts=[-1]``), so the seed rows' output is the untrimmed one (up to floating-point summation order).
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple, Optional, Sequence

import torch
from torch import nn

__all__ = ["HeteroHopCounts", "HopCounts", "batch_hop_counts", "can_trim", "counts_for_layers", "hetero_counts_for_layers"]


class HopCounts(NamedTuple):
    """A batch cut to what ``num_layers`` layers reach, with per-hop counts of exactly ``num_layers`` hops.

    Attributes:
        x: node features, the rows of the hops kept.
        edge_index: the edges of the hops kept.
        nodes_per_hop: ``num_layers + 1`` node counts (the seeds first), for ``num_sampled_nodes_per_hop``.
        edges_per_hop: ``num_layers`` edge counts, for ``num_sampled_edges_per_hop``.
    """

    x: torch.Tensor
    edge_index: torch.Tensor
    nodes_per_hop: list[int]
    edges_per_hop: list[int]


def _as_ints(counts: Any, name: str) -> list[int]:
    if isinstance(counts, torch.Tensor):
        if counts.device.type != "cpu":  # reading it back would stall the host on the GPU every step
            raise ValueError(f"batch.{name} is a {counts.device} tensor: keep the per-hop counts as a Python list")
        return [int(c) for c in counts.tolist()]
    return [int(c) for c in counts]


def counts_for_layers(
    x: torch.Tensor,
    edge_index: torch.Tensor,
    num_sampled_nodes: Sequence[int],
    num_sampled_edges: Sequence[int],
    num_layers: int,
) -> HopCounts:
    """``x`` and ``edge_index`` cut to the hops ``num_layers`` layers reach, and counts fitted to ``num_layers``.

    Pass the result's ``nodes_per_hop`` / ``edges_per_hop`` to a PyG ``BasicGNN`` as
    ``num_sampled_nodes_per_hop`` / ``num_sampled_edges_per_hop`` (or to
    :func:`torch_geometric.utils.trim_to_layer` in a hand-written layer loop). Reads Python ints and tensor
    shapes only: no device synchronization.

    Args:
        x: node features of the batch, ``sum(num_sampled_nodes)`` rows ordered by hop.
        edge_index: ``(2, sum(num_sampled_edges))`` local edges ordered by hop.
        num_sampled_nodes: nodes per hop, the seeds first (``hops + 1`` entries).
        num_sampled_edges: edges per hop (``hops`` entries).
        num_layers: message-passing layers of the model.

    Raises:
        ValueError: the counts do not describe ``x`` / ``edge_index`` (the message names which).
    """
    nodes = _as_ints(num_sampled_nodes, "num_sampled_nodes")
    edges = _as_ints(num_sampled_edges, "num_sampled_edges")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if len(nodes) != len(edges) + 1:
        raise ValueError(
            f"batch.num_sampled_nodes has {len(nodes)} entries and batch.num_sampled_edges {len(edges)}: expected "
            "one node count per hop plus the seeds, one edge count per hop"
        )
    if sum(nodes) != x.size(0) or sum(edges) != edge_index.size(1):
        raise ValueError(
            f"batch.num_sampled_nodes sums to {sum(nodes)} and batch.num_sampled_edges to {sum(edges)}, but the "
            f"batch has {x.size(0)} rows of x and {edge_index.size(1)} edges: a transform changed the batch without "
            "its per-hop counts; fix the counts, delete them, or turn trimming off (model.trim: false)"
        )
    if len(edges) > num_layers:  # hops no layer reaches
        x = x.narrow(0, 0, sum(nodes[: num_layers + 1]))
        edge_index = edge_index.narrow(1, 0, sum(edges[:num_layers]))
    return HopCounts(x, edge_index, _fit(nodes, num_layers + 1), _fit(edges, num_layers))


def _fit(counts: list[int], length: int) -> list[int]:
    """``counts`` cut to ``length`` entries (hops no layer reaches), or padded with empty hops (hops not sampled)."""
    return counts[:length] + [0] * (length - len(counts))


def batch_hop_counts(batch: Any, num_layers: int) -> Optional[HopCounts]:
    """:func:`counts_for_layers` of a batch's ``x``, ``edge_index``, ``num_sampled_nodes``, ``num_sampled_edges``;
    ``None`` when the batch has no per-hop counts (a full graph, a batch from a loader that does not sample)."""
    nodes = getattr(batch, "num_sampled_nodes", None)
    edges = getattr(batch, "num_sampled_edges", None)
    if nodes is None or edges is None:
        return None
    return counts_for_layers(batch.x, batch.edge_index, nodes, edges, num_layers)


def can_trim(net: nn.Module) -> bool:
    """Whether ``net`` takes per-hop counts: an int ``num_layers`` and a forward with ``num_sampled_nodes_per_hop``
    and ``num_sampled_edges_per_hop`` (PyG's ``BasicGNN`` models)."""
    params = inspect.signature(net.forward).parameters
    layers = getattr(net, "num_layers", None)
    return isinstance(layers, int) and all(p in params for p in ("num_sampled_nodes_per_hop", "num_sampled_edges_per_hop"))


class HeteroHopCounts(NamedTuple):
    """A heterogeneous batch cut to what ``num_layers`` layers reach, with per-type counts of ``num_layers`` hops.

    Attributes:
        x_dict: per node type, the rows of the hops kept.
        edge_index_dict: per edge type, the edges of the hops kept.
        nodes_per_hop: per node type, ``num_layers + 1`` node counts (the seeds first; ``0`` for a type without
            seeds), for :func:`torch_geometric.utils.trim_to_layer`.
        edges_per_hop: per edge type, ``num_layers`` edge counts.
    """

    x_dict: dict[str, torch.Tensor]
    edge_index_dict: dict[tuple[str, str, str], torch.Tensor]
    nodes_per_hop: dict[str, list[int]]
    edges_per_hop: dict[tuple[str, str, str], list[int]]


def hetero_counts_for_layers(
    x_dict: dict[str, torch.Tensor],
    edge_index_dict: dict[tuple[str, str, str], torch.Tensor],
    num_sampled_nodes_dict: dict[str, Sequence[int]],
    num_sampled_edges_dict: dict[tuple[str, str, str], Sequence[int]],
    num_layers: int,
) -> HeteroHopCounts:
    """:func:`counts_for_layers` for a ``HeteroData`` batch (PyG's hetero ``NeighborLoader`` layout): every node
    type's rows and every edge type's edges are cut to the hops ``num_layers`` layers reach, and the counts are cut
    or padded with empty hops to exactly ``num_layers`` hops. Reads Python ints and shapes only.

    Args:
        x_dict: per node type, ``sum(num_sampled_nodes_dict[type])`` rows ordered by hop (features, or embeddings
            of the type's ``n_id``).
        edge_index_dict: per edge type ``(src, rel, dst)``, local edges ordered by hop.
        num_sampled_nodes_dict: per node type, nodes per hop (``hops + 1`` entries, the seeds first).
        num_sampled_edges_dict: per edge type, edges per hop (``hops`` entries).
        num_layers: message-passing layers of the model.

    Raises:
        ValueError: a type without counts, counts of different hop depths, or counts that do not describe the
            rows / edges (the message names the type).
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    nodes: dict[str, list[int]] = {}
    for node_type in x_dict:
        if node_type not in num_sampled_nodes_dict:
            raise ValueError(f"node type {node_type!r} has no num_sampled_nodes: turn trimming off (trim: false)")
        nodes[node_type] = _as_ints(num_sampled_nodes_dict[node_type], f"{node_type}.num_sampled_nodes")
    edges: dict[tuple[str, str, str], list[int]] = {}
    for edge_type in edge_index_dict:
        if edge_type not in num_sampled_edges_dict:
            raise ValueError(f"edge type {'__'.join(edge_type)} has no num_sampled_edges: turn trimming off (trim: false)")
        edges[edge_type] = _as_ints(num_sampled_edges_dict[edge_type], f"{'__'.join(edge_type)}.num_sampled_edges")
    depths = {len(c) - 1 for c in nodes.values()} | {len(c) for c in edges.values()}
    if len(depths) > 1:
        raise ValueError(f"the batch's per-type counts describe different numbers of hops ({sorted(depths)}): expected "
                         "one node count per hop plus the seeds for every node type, one edge count per hop for every "
                         "edge type")  # fmt: skip
    hops = depths.pop() if depths else num_layers
    out_x: dict[str, torch.Tensor] = {}
    for node_type, x in x_dict.items():
        if sum(nodes[node_type]) != x.size(0):
            raise ValueError(f"{node_type}.num_sampled_nodes sums to {sum(nodes[node_type])} but the batch has "
                             f"{x.size(0)} {node_type!r} rows: fix the counts, delete them, or set trim: false")  # fmt: skip
        out_x[node_type] = x.narrow(0, 0, sum(nodes[node_type][: num_layers + 1])) if hops > num_layers else x
    out_edges: dict[tuple[str, str, str], torch.Tensor] = {}
    for edge_type, index in edge_index_dict.items():
        if sum(edges[edge_type]) != index.size(1):
            raise ValueError(f"{'__'.join(edge_type)}.num_sampled_edges sums to {sum(edges[edge_type])} but the batch "
                             f"has {index.size(1)} such edges: fix the counts, delete them, or set trim: false")  # fmt: skip
        out_edges[edge_type] = index.narrow(1, 0, sum(edges[edge_type][:num_layers])) if hops > num_layers else index
    return HeteroHopCounts(out_x, out_edges, {k: _fit(v, num_layers + 1) for k, v in nodes.items()},
                           {k: _fit(v, num_layers) for k, v in edges.items()})  # fmt: skip
