"""Locality-preserving node orders.

Zero-copy GPU reads of host features are bound by how many memory pages a batch touches, not by bandwidth
(see ``DESIGN.md``): the same rows read in a locality-preserving order move several times faster. A
breadth-first order over *incoming* edges -- the edges the sampler follows -- gives a node's sampled
neighbors nearby ids, so a batch's rows share pages. :func:`bfs_order` computes one with level-synchronous,
vectorized torch ops (no Python loop over nodes), and :class:`NodeOrder` relabels the graph, features,
labels and seed ids consistently.

:func:`bfs_order`, :func:`degree_order` and :class:`NodeOrder` work on the device of the graph's tensors (a
CUDA graph is ordered on the GPU, e.g. in ``benchmarks/parts/gather.py``); :meth:`NodeOrder.relabel_graph` needs a
CPU graph (it rebuilds the CSC with the CPU kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from lightning_zerocopy import ops
from lightning_zerocopy.graph.csc import CSCGraph

__all__ = [
    "NodeOrder",
    "bfs_order",
    "degree_order",
    "frequency_order",
    "most_frequent_neighbors",
    "neighbor_counts",
]


@dataclass(frozen=True)
class NodeOrder:
    """A node relabeling.

    Attributes:
        order: int64, ``order[new_id] = old_id``.
        rank: int64, ``rank[old_id] = new_id`` (the inverse permutation).
    """

    order: torch.Tensor
    rank: torch.Tensor

    @classmethod
    def from_order(cls, order: torch.Tensor) -> "NodeOrder":
        """Build from ``order[new_id] = old_id`` (must be a permutation of ``0..n-1``)."""
        order = order.to(torch.int64).contiguous()
        rank = torch.full_like(order, -1)
        rank[order] = torch.arange(order.numel(), device=order.device)
        if order.dim() != 1 or bool((rank < 0).any()):
            raise ValueError("`order` must be a permutation of 0..n-1")
        return cls(order, rank)

    @property
    def num_nodes(self) -> int:
        return int(self.order.numel())

    def relabel_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """New ids of old node ids (e.g. train/val/test seeds)."""
        return self.rank[ids.long()]

    def relabel_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of a per-node tensor in the new order: ``x[order]`` (features, labels, masks)."""
        if x.shape[0] != self.num_nodes:
            raise ValueError(f"`x` must have one row per node ({self.num_nodes}), got {x.shape[0]}")
        if x.dim() == 2 and x.is_contiguous() and x.device.type == "cpu":
            return ops.gather_rows(x, self.order)  # parallel row copy
        return x[self.order]

    def relabel_graph(self, graph: CSCGraph) -> CSCGraph:
        """The same graph under new ids. ``edge_perm`` still points into the original edge list."""
        if graph.num_nodes != self.num_nodes:
            raise ValueError(f"`graph` has {graph.num_nodes} nodes, this order has {self.num_nodes}")
        dst = torch.repeat_interleave(torch.arange(graph.num_nodes, device=graph.indptr.device), graph.degree())
        csc = ops.build_csc(
            self.rank[graph.indices.long()], self.rank[dst], graph.num_nodes, False, False
        )
        edge_perm = csc.edge_perm if graph.edge_perm is None else graph.edge_perm[csc.edge_perm]
        return CSCGraph(csc.indptr, csc.indices, edge_perm, graph.num_nodes)


_COUNT_CHUNK = 1 << 26  # entries of ``indices`` per bincount (bounds the int64 temporary)


def neighbor_counts(indices: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """How often each node is some node's in-neighbor: its appearances in ``indices`` (the CSC neighbor array).

    Sampling picks a node in proportion to this count (it is the node's out-degree), so it ranks the rows
    batches read most. Counts in chunks, so a graph with billions of edges needs no int64 copy of ``indices``;
    runs on the device of ``indices``. Returns int64 ``[num_nodes]``.
    """
    counts = torch.zeros(int(num_nodes), dtype=torch.int64, device=indices.device)
    for start in range(0, indices.numel(), _COUNT_CHUNK):
        counts += torch.bincount(indices[start : start + _COUNT_CHUNK].long(), minlength=int(num_nodes))
    return counts


def most_frequent_neighbors(indices: torch.Tensor, num_nodes: int, count: int) -> torch.Tensor:
    """The ``count`` nodes with the highest :func:`neighbor_counts`, most frequent first (capped at ``num_nodes``).

    These are the rows a GPU hot-row cache should hold. Returns int64 ids on the device of ``indices``.

    Raises:
        ValueError: ``count < 0``.
    """
    if count < 0:
        raise ValueError(f"`count` must be >= 0, got {count}")
    counts = neighbor_counts(indices, num_nodes)
    return torch.topk(counts, min(int(count), int(num_nodes)), sorted=True).indices


def frequency_order(indices: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """All nodes by :func:`neighbor_counts`, most frequent first, ties by id: ``order[new_id] = old_id``.

    Sampled batches then read the frequent rows from a few dense pages instead of one page per row.
    """
    return torch.sort(neighbor_counts(indices, num_nodes), descending=True, stable=True).indices


def degree_order(graph: CSCGraph) -> NodeOrder:
    """Nodes by how often they are some node's in-neighbor, most often first (ties by id): :func:`frequency_order`.

    That count is the node's out-degree; sampling picks a node in proportion to it, so the rows most batches
    read share the first pages. On an undirected graph it is the degree. (In-degree would not do on a directed
    graph: ``docs/BENCHMARK_NOTES.md``, "Node order: pages touched per batch".)
    """
    return NodeOrder.from_order(frequency_order(graph.indices, graph.num_nodes))


def _neighbors_of(graph: CSCGraph, frontier: torch.Tensor) -> torch.Tensor:
    """Concatenated in-neighbors of ``frontier``, in frontier order."""
    starts = graph.indptr[frontier]
    counts = graph.indptr[frontier + 1] - starts
    total = int(counts.sum())
    if total == 0:
        return frontier.new_empty(0)
    shift = starts - (torch.cumsum(counts, 0) - counts)  # segment start minus its output offset
    positions = torch.repeat_interleave(shift, counts, output_size=total) + torch.arange(total, device=shift.device)
    return graph.indices[positions].long()


def bfs_order(graph: CSCGraph, *, start: Optional[int] = None) -> NodeOrder:
    """Breadth-first order over incoming edges, level by level, children in order of their first parent.

    Each connected piece starts from its highest in-degree unvisited node (``start`` for the first); when a
    search runs dry, the next roots are taken from the remaining nodes in descending degree, doubling their
    number on each restart so that graphs with many small components need only ``O(log n)`` restarts. Each
    restart drops the visited nodes from the remaining list in one vectorized step, so a restart after a
    search that covered most of the graph costs one pass, not one step per visited node.
    """
    n = graph.num_nodes
    device = graph.indptr.device
    degree = graph.degree()
    by_degree = torch.sort(degree, descending=True, stable=True).indices
    if start is not None:
        if not 0 <= start < n:
            raise ValueError(f"`start` must be a node id in [0, {n}), got {start}")
        by_degree = torch.cat([torch.tensor([start], device=device), by_degree[by_degree != start]])
    visited = torch.zeros(n, dtype=torch.bool, device=device)
    order = torch.empty(n, dtype=torch.int64, device=device)
    # first_seen[v] = smallest candidate position of v in the current level (reset after each level).
    first_seen = torch.full((n,), torch.iinfo(torch.int64).max, dtype=torch.int64, device=device)
    filled, num_roots = 0, 1
    remaining = by_degree  # candidate roots in degree order; visited ones are dropped at each restart
    frontier = by_degree.new_empty(0)
    while filled < n:
        if frontier.numel() == 0:  # restart from the highest-degree unvisited nodes
            remaining = remaining[~visited[remaining]]
            frontier, remaining = remaining[:num_roots], remaining[num_roots:]
            num_roots *= 2
        else:
            candidates = _neighbors_of(graph, frontier)
            candidates = candidates[~visited[candidates]]
            positions = torch.arange(candidates.numel(), device=device)
            first_seen.scatter_reduce_(0, candidates, positions, reduce="amin")
            frontier = candidates[first_seen[candidates] == positions]  # first occurrences, in order
            first_seen[candidates] = torch.iinfo(torch.int64).max
            if frontier.numel() == 0:
                continue
        visited[frontier] = True
        order[filled : filled + frontier.numel()] = frontier
        filled += frontier.numel()
    return NodeOrder.from_order(order)
