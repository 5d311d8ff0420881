"""One CSC over every edge type of a typed graph (a CSC with edge-type offsets, as DGL GraphBolt's
``FusedCSCSamplingGraph``), so one call of the sampling kernel draws a hop for every edge type at once.

Two id spaces, laid out by :class:`FusedLayout`:

* targets: the concatenation, in edge-type order, of each edge type's destination nodes: edge type ``k``'s target
  ``j`` is ``target_offset[k] + j``, and its incoming edges are edge type ``k``'s incoming edges of ``j``;
* neighbors: a typed node space, node type ``t``'s node ``i`` is ``node_offset[t] + i``.

The kernel numbers both in one space of ``num_ids = max(targets, nodes)`` ids (``indptr`` has a flat tail past the
last target). ``edge_perm`` maps a fused edge position to the edge's position in its own edge type's edge list, so a
batch's ``e_id`` stays per edge type; edge type ``k``'s edges are the block ``[edge_offset[k], edge_offset[k + 1])``.
``indices`` are int32 while ``num_ids`` fits, else int64 (:func:`fused_index_dtype`).

:func:`fuse_csc` builds it from the per-edge-type CSCs (one pass of copies, no sort);
:func:`~lightning_zerocopy.data.host.share.share_host_data` builds it once per machine into shared memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from tqdm.auto import tqdm

from lightning_zerocopy.graph.csc import CSCGraph, CSCGraphHandle
from lightning_zerocopy.graph.schema import EdgeType
from lightning_zerocopy.graph.shared_memory import TensorSliceHandle

__all__ = ["FusedCSC", "FusedCSCHandle", "FusedLayout", "edge_perm_views", "fuse_csc", "fused_index_dtype"]

#: Fusing more edges than this shows a progress bar (a few seconds of copies).
_PROGRESS_EDGES = 10_000_000
#: Edges copied per step (bounds the temporaries of the int32 -> int64 casts).
_CHUNK = 1 << 24


def fused_index_dtype(num_ids: int) -> torch.dtype:
    """The dtype of the fused ``indices``: int32 while every id of the fused space fits it, else int64."""
    return torch.int32 if num_ids - 1 <= torch.iinfo(torch.int32).max else torch.int64


@dataclass(frozen=True)
class FusedLayout:
    """Where each edge type's targets and each node type's nodes sit in a fused CSC (ints only; picklable).

    Attributes:
        node_types: every node type, in order; ``node_offset[i]`` is the first fused id of ``node_types[i]``.
        edge_types: every edge type, in sampling order; ``target_offset[k]`` is the first target of ``edge_types[k]``,
            which has ``num_targets[k]`` targets (its destination type's node count).
        edge_offset: ``len(edge_types) + 1`` entries: edge type ``k``'s edges are
            ``[edge_offset[k], edge_offset[k + 1])``.
        num_ids: ``max(targets, nodes)``: the kernel's id space (``indptr`` has ``num_ids + 1`` entries).
    """

    node_types: tuple[str, ...]
    node_offset: tuple[int, ...]
    edge_types: tuple[EdgeType, ...]
    target_offset: tuple[int, ...]
    num_targets: tuple[int, ...]
    edge_offset: tuple[int, ...]
    num_ids: int

    def node_base(self, node_type: str) -> int:
        """The fused id of ``node_type``'s node 0."""
        return self.node_offset[self.node_types.index(node_type)]


@dataclass
class FusedCSC:
    """A fused CSC: its :class:`FusedLayout` and its topology (a :class:`~lightning_zerocopy.graph.csc.CSCGraph` in
    host memory, or the same tensors placed for the CUDA sampler)."""

    layout: FusedLayout
    graph: Any

    def share(self) -> "FusedCSC":
        """A copy in shared memory (the caller unlinks it once every local process has mapped it)."""
        return FusedCSC(self.layout, self.graph.share())

    def handle(self) -> "FusedCSCHandle":
        return FusedCSCHandle(self.layout, self.graph.handle())

    def unlink(self) -> None:
        self.graph.unlink()


@dataclass(frozen=True)
class FusedCSCHandle:
    """Picklable name of a :class:`FusedCSC` in shared memory (no data)."""

    layout: FusedLayout
    graph: CSCGraphHandle

    def open(self) -> FusedCSC:
        return FusedCSC(self.layout, self.graph.open())

    def unlink(self) -> None:
        self.graph.unlink()


def _node_counts(graphs: Mapping[EdgeType, Any], node_types: Sequence[str]) -> dict[str, int]:
    """Per node type, a count that covers its ids when the graph does not say: the smallest id space of an edge type
    touching it (a per-edge-type CSC spans both of its endpoint types)."""
    counts: dict[str, int] = {}
    for (src, _, dst), graph in graphs.items():
        ids = int(graph.indptr.numel()) - 1
        for t in (src, dst):
            counts[t] = min(counts.get(t, ids), ids)
    return {t: counts.get(t, 0) for t in node_types}


#: ``allocate(name, numel, dtype) -> (tensor, handle)``: where :func:`fuse_csc` writes the fused tensors.
Allocate = Callable[[str, int, torch.dtype], tuple[torch.Tensor, Any]]


def fuse_csc(
    graphs: Mapping[EdgeType, Any],
    num_nodes: Optional[Mapping[str, int]] = None,
    node_types: Optional[Sequence[str]] = None,
    allocate: Optional[Allocate] = None,
) -> FusedCSC:
    """The fused CSC of a typed graph's per-edge-type CSCs (in private memory, or where ``allocate`` puts it).

    Args:
        graphs: per edge type ``(s, r, d)``, in sampling order, a CSC (``indptr``, ``indices``, ``edge_perm``) whose
            targets are ``d``-type ids and whose ``indices`` are ``s``-type ids (it may span more ids than ``d`` has).
        num_nodes: nodes per type (default: what the CSCs imply, an upper bound that is as good for sampling).
        node_types: every node type, in order (default: as the edge types name them).
        allocate: creates each fused tensor and its handle (e.g. a shared segment, written in place, so the host copy
            holds one fused CSC, never two); with it the result has a :meth:`FusedCSC.handle`.

    Raises:
        ValueError: a CSC with edges into a target past ``num_nodes`` of its destination type.
    """
    edge_types = [(et[0], et[1], et[2]) for et in graphs]
    named = dict.fromkeys(t for s, _, d in edge_types for t in (s, d))
    types = list(node_types) if node_types is not None else list(named)
    counts = {t: int(n) for t, n in (num_nodes or _node_counts(graphs, types)).items()}
    node_offset, total_nodes = [], 0
    for t in types:
        node_offset.append(total_nodes)
        total_nodes += counts[t]
    target_offset, num_targets, edge_offset = [], [], [0]
    for (src, rel, dst), graph in graphs.items():
        target_offset.append(sum(num_targets))
        num_targets.append(counts[dst])
        edge_offset.append(edge_offset[-1] + int(graph.indices.numel()))
    num_ids = max(sum(num_targets), total_nodes)
    layout = FusedLayout(tuple(types), tuple(node_offset), tuple(edge_types), tuple(target_offset), tuple(num_targets),
                         tuple(edge_offset), num_ids)  # fmt: skip
    total_edges = edge_offset[-1]
    if allocate is None:
        allocate = lambda name, numel, dtype: (torch.empty(numel, dtype=dtype), None)  # noqa: E731
    (indptr, h_indptr), (indices, h_indices), (edge_perm, h_perm) = (
        allocate("fused_indptr", num_ids + 1, torch.int64),
        allocate("fused_indices", total_edges, fused_index_dtype(num_ids)),
        allocate("fused_edge_perm", total_edges, torch.int64),
    )
    indptr.fill_(total_edges)
    bar = tqdm(total=total_edges, desc=f"fusing {len(edge_types)} edge types' CSCs ({total_edges:,} edges)",
               disable=total_edges <= _PROGRESS_EDGES)  # fmt: skip
    with bar:
        for k, ((src, rel, dst), graph) in enumerate(graphs.items()):
            n, e0 = num_targets[k], edge_offset[k]
            if int(graph.indptr.numel()) - 1 < n or int(graph.indptr[n]) != int(graph.indices.numel()):
                raise ValueError(f"the CSC of {(src, rel, dst)} has edges into {dst!r} ids past its {n} nodes")
            t0 = target_offset[k]
            indptr[t0 : t0 + n].copy_(graph.indptr[:n]).add_(e0)
            base = node_offset[types.index(src)]
            for lo in range(0, edge_offset[k + 1] - e0, _CHUNK):
                hi = min(lo + _CHUNK, edge_offset[k + 1] - e0)
                indices[e0 + lo : e0 + hi].copy_(graph.indices[lo:hi]).add_(base)
                perm = getattr(graph, "edge_perm", None)
                if perm is None:
                    torch.arange(lo, hi, out=edge_perm[e0 + lo : e0 + hi])
                else:
                    edge_perm[e0 + lo : e0 + hi].copy_(perm[lo:hi])
                bar.update(hi - lo)
    handle = CSCGraphHandle(num_ids, h_indptr, h_indices, h_perm) if h_indptr is not None else None
    return FusedCSC(layout, CSCGraph(indptr, indices, edge_perm, num_ids, _handles=handle))


def edge_perm_views(fused: FusedCSCHandle, graphs: Mapping[EdgeType, CSCGraphHandle]) -> dict[EdgeType, CSCGraphHandle]:
    """The per-edge-type CSC handles with ``edge_perm`` as views of the fused one (edge type ``k``'s block holds
    the same values, in the same order), so the host copy holds the edge ids once (8 bytes per edge); the caller
    unlinks the per-type ``edge_perm`` segments these replace."""
    layout, perm = fused.layout, fused.graph.edge_perm
    if perm is None:
        raise ValueError("the fused CSC has no `edge_perm`")
    out = {}
    for k, et in enumerate(layout.edge_types):
        graph = graphs[et]
        view = TensorSliceHandle(perm, layout.edge_offset[k], layout.edge_offset[k + 1])  # type: ignore[arg-type]
        out[et] = CSCGraphHandle(graph.num_nodes, graph.indptr, graph.indices, view)
    return out
