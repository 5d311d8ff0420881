"""Per-hop counts for PyG ``NeighborLoader`` batches sampled by torch-sparse, so the PyG row trims like ours.

pyg-lib's sampler returns ``num_sampled_nodes`` / ``num_sampled_edges`` and PyG puts them on the batch; torch-sparse's
(the only backend on the GPU box) returns none, and a model that trims per hop (``lightning_zerocopy.models``'
``trim=True``) then runs every layer on the whole subgraph. torch-sparse samples hop by hop, so its output is
ordered as pyg-lib's: the seeds first, each hop's new nodes after the previous hop's, and edges grouped by the hop
of their target in target order (``col`` non-decreasing). The counts follow from ``row`` / ``col`` alone:
hop ``h``'s edges are those whose target lies in hop ``h - 1``'s node range, and hop ``h``'s new nodes end at the
largest local source id among those edges. :func:`add_hop_counts` (``NeighborLoader(transform_sampler_output=...)``,
run in the loader's workers on CPU tensors) fills them in as Python lists, as pyg-lib's are; it leaves a sample
that already has them alone.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["add_hop_counts", "hop_counts"]


def hop_counts(row: torch.Tensor, col: torch.Tensor, num_seeds: int, num_nodes: int, num_hops: int) -> tuple[list[int], list[int]]:
    """Nodes per hop (the seeds first, ``num_hops + 1`` entries) and edges per hop (``num_hops``) of a hop-ordered
    sample whose local edges are ``row`` (source) -> ``col`` (target).

    Raises:
        ValueError: the sample is not hop-ordered (``col`` decreases somewhere, or the counts do not add up to the
            sample's ``num_nodes`` nodes and ``row.numel()`` edges).
    """
    if col.numel() > 1 and not bool((col[1:] >= col[:-1]).all()):
        raise ValueError("the sampled edges' targets (col) are not in non-decreasing order: not a hop-ordered sample")
    nodes, edges = [num_seeds], []
    edge_start, node_end = 0, num_seeds
    for _ in range(num_hops):
        edge_end = int(torch.searchsorted(col, torch.tensor([node_end], dtype=col.dtype)).item())
        sources = row[edge_start:edge_end]
        new_end = max(node_end, int(sources.max()) + 1) if sources.numel() else node_end
        edges.append(edge_end - edge_start)
        nodes.append(new_end - node_end)
        edge_start, node_end = edge_end, new_end
    if edge_start != row.numel() or node_end != num_nodes:
        raise ValueError(f"{num_hops} hops account for {node_end} of {num_nodes} nodes and {edge_start} of "
                         f"{row.numel()} edges: the sample has another number of hops or is not hop-ordered")  # fmt: skip
    return nodes, edges


def add_hop_counts(out: Any, num_hops: int) -> Any:
    """``out`` (a PyG ``SamplerOutput`` of ``num_hops`` hops) with ``num_sampled_nodes`` / ``num_sampled_edges``
    filled in where the sampler left them out (torch-sparse); the seeds are ``out.metadata[0]``'s.

    A sample that is not hop-ordered keeps no counts (a warning says why): the module then runs it untrimmed and
    the benchmark's batch check and report show that row as untrimmed, rather than the row failing.
    """
    if out.num_sampled_nodes is not None and out.num_sampled_edges is not None:
        return out
    try:
        out.num_sampled_nodes, out.num_sampled_edges = hop_counts(
            out.row, out.col, num_seeds=int(out.metadata[0].numel()), num_nodes=int(out.node.numel()), num_hops=num_hops
        )
    except ValueError as exc:
        warnings.warn(f"PyG batch left without per-hop counts (runs untrimmed): {exc}", stacklevel=2)
    return out
