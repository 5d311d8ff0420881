"""Sampling a typed graph of several types, with the semantics of PyG's hetero ``NeighborLoader`` (not disjoint).

The graph is one CSC topology per edge type ``(src, rel, dst)``: the incoming ``src``-type neighbors of every
``dst``-type node. Hop by hop, for every edge type in order, ``fanouts[edge_type][hop]`` incoming neighbors are
drawn for the ``dst``-type nodes the previous hop added (the seeds at hop 0); the picked ``src``-type nodes are
deduplicated per node type across hops, in order of first appearance (seeds first), as pyg-lib's
``hetero_neighbor_sample`` does: within a hop, the edge types in order, each edge type's picks by target, then pick.

:class:`~lightning_zerocopy.sampling.NeighborSampler` calls :func:`sample_hetero` for a typed graph of several types
(one type is one fused multi-hop call). Each hop is one kernel call over the graph's CSC of every edge type
(:class:`~lightning_zerocopy.graph.fused_csc.FusedCSC`, GraphBolt's CSC with edge-type offsets), one per distinct
fanout among the edge types at that hop (:func:`fanout_groups`; one in the usual case), so every placement (CPU
threads, ``uva``, ``gpu``) runs the same code. The frontier of a call is, in edge-type order, each edge type's
destination frontier shifted to its fused targets. The call is ``pick_neighbors`` (:mod:`lightning_zerocopy.ops`):
the one-hop sampler's picks without its deduplication and relabeling (this module deduplicates per type anyway),
ordered by target, so each edge type's picks are one contiguous range, whose end the call's one host read-back
returns; the picked ids are mapped back from the typed node space to per-type ids and ``e_id`` comes per edge type
from the fused ``edge_perm``. The call's random seed is derived from (batch seed, hop, fanout group)
(:func:`hop_seed`); the kernel keys a target's picks by (call seed, position of the target in the fused frontier)
(``csrc/ops/pick_policy.h``), and the frontier is the same on every device, so every placement draws the same sample.
The per-type deduplication and relabeling (:func:`~lightning_zerocopy.sampling.typed_dedup.dedup_by_type`) is one
call of the op ``dedup_typed_keys`` per hop over every node type (a hash table, on the device the sample lives on;
one host read-back on a GPU).

Node-keyed (evaluation) sampling passes the kernel's ``node_keyed`` flag: a target's picks are then keyed by
(call seed, fused target id), i.e. by (split seed, hop, edge type, node id) (the fanout groups are fixed by the
fanouts, not by the batch), and nodes are deduplicated per hop and type
only (hop ``k``'s picks of a type form level ``k + 1`` of that type's ``n_id`` even when they sit at a lower level
too; edges run from level ``k + 1`` to level ``k``), so a seed's sampled computation graph does not depend on its
batch -- the homogeneous node-keyed contract, per node type.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

import torch

from lightning_zerocopy.graph.schema import EdgeType
from lightning_zerocopy.sampling.typed_dedup import dedup_by_type, first_appearance

__all__ = [
    "EdgeType",
    "HeteroSampledBatch",
    "dedup_by_type",
    "fanout_groups",
    "first_appearance",
    "hop_seed",
    "sample_hetero",
    "seeds_by_type",
]

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def hop_seed(batch_seed: int, hop: int, group: int) -> int:
    """The kernel seed of one (hop, fanout group) call (``group``: its position in :func:`fanout_groups`): a
    splitmix64 chain over the three, a non-negative 63-bit int (the same mixing as the plan's ``derive_seed``); pure,
    so every device and process gets the same."""
    state = 0
    for part in (batch_seed, hop, group):
        state = _splitmix64(state ^ (int(part) & _MASK64))
    return state >> 1


@dataclass(frozen=True)
class HeteroSampledBatch:
    """One sampled typed mini-batch in PyG's hetero ``NeighborLoader`` layout (ids are the host memory's).

    Attributes:
        n_id: per node type, int64 ids of the sampled nodes (every node type, empty where none was sampled); the
            input type's first ``batch_size`` are the seeds in input order.
        edge_index: per edge type ``(s, r, d)``, int64 ``[2, E]`` local ids: row 0 indexes ``n_id[s]`` (the
            neighbor, message source), row 1 ``n_id[d]`` (the target). Edges by hop, then target, then pick.
        e_id: per edge type, positions of the sampled edges in that type's original edge list.
        num_sampled_nodes: per node type, nodes added per hop (``num_hops + 1`` entries, the seeds first).
        num_sampled_edges: per edge type, edges per hop (``num_hops`` entries).
        batch_size: number of seeds (of ``input_type``; of every type when the seeds came as a dict without one).
        input_type: the node type of the seeds, or ``None`` when they were given per node type (link prediction's
            two endpoint types).
    """

    n_id: dict[str, torch.Tensor]
    edge_index: dict[EdgeType, torch.Tensor]
    e_id: dict[EdgeType, torch.Tensor]
    num_sampled_nodes: dict[str, list[int]]
    num_sampled_edges: dict[EdgeType, list[int]]
    batch_size: int
    input_type: Optional[str]


def seeds_by_type(
    seeds: Union[torch.Tensor, Mapping[str, torch.Tensor]], input_type: Optional[str], node_types: Sequence[str]
) -> dict[str, torch.Tensor]:
    """A typed sample's seeds per node type (a tensor is ``input_type``'s).

    Raises:
        ValueError: an unknown node type (``input_type`` or a key of ``seeds``), a tensor without ``input_type``.
    """
    if input_type is not None and input_type not in node_types:
        raise ValueError(f"`input_type` {input_type!r} is not one of the node types {list(node_types)}")
    if isinstance(seeds, torch.Tensor):
        if input_type is None:
            raise ValueError("`input_type` names the node type of `seeds`; pass a dict to seed several types")
        return {input_type: seeds}
    unknown = [t for t in seeds if t not in node_types]
    if unknown:
        raise ValueError(f"`seeds` names {unknown[0]!r}, not one of the node types {list(node_types)}")
    return dict(seeds)


def fanout_groups(
    fanouts: Mapping[EdgeType, Sequence[int]], edge_types: Sequence[EdgeType], hop: int
) -> list[tuple[int, list[int]]]:
    """The kernel calls of one hop: ``(fanout, edge type indices)`` per distinct fanout, in order of first use (one
    group in the usual case of one fanout per hop). Fixed by the fanouts alone, so a group's call seed
    (:func:`hop_seed` of its position) does not depend on which frontiers a batch leaves empty."""
    groups: dict[int, list[int]] = {}
    for index, et in enumerate(edge_types):
        groups.setdefault(int(fanouts[et][hop]), []).append(index)
    return list(groups.items())


@dataclass
class _Drawn:
    """One edge type's picks of one hop: picked ids (local to the source type), targets (local to the destination
    type's ``n_id``) and edge ids."""

    src_ids: torch.Tensor
    col: torch.Tensor
    e_id: torch.Tensor


def _draw_hop(
    sampler: Any, n_id: Mapping[str, torch.Tensor], frontier: Mapping[str, tuple[int, int]], hop: int, seed: int
) -> dict[int, _Drawn]:
    """Every edge type's picks of hop ``hop``: one kernel call per fanout group over the fused CSC (the frontier:
    each member edge type's destination frontier shifted to its fused targets, in edge-type order), then the picks
    split by edge type (they come ordered by target, so each edge type is a contiguous range, whose end the call's
    one read-back returns) and mapped back to per-type ids."""
    layout = sampler.fused.layout
    edge_types = layout.edge_types
    drawn: dict[int, _Drawn] = {}
    for group, (fanout, members) in enumerate(fanout_groups(sampler.fanouts, edge_types, hop)):
        members = [k for k in members if frontier[edge_types[k][2]][1] > frontier[edge_types[k][2]][0]]
        if not members:
            continue
        parts = []
        for k in members:
            begin, end = frontier[edge_types[k][2]]
            parts.append(n_id[edge_types[k][2]][begin:end] + layout.target_offset[k])
        sizes = [int(p.numel()) for p in parts]
        ends = list(itertools.accumulate(sizes))
        out, e_id = sampler.fused_kernel.pick(torch.cat(parts), fanout, hop_seed(seed, hop, group), sampler.replace,
                                              sampler.node_keyed, ends)  # fmt: skip
        lo = start = 0
        for k, size, hi in zip(members, sizes, out.edge_ends.tolist()):  # edge_ends: on the host already
            src, _, dst = edge_types[k]
            col = out.col[lo:hi] + (frontier[dst][0] - start)
            drawn[k] = _Drawn(out.nbr[lo:hi] - layout.node_base(src), col, e_id[lo:hi])
            lo, start = hi, start + size
    return drawn


def sample_hetero(
    sampler: Any, by_type: Mapping[str, torch.Tensor], seed: int, input_type: Optional[str]
) -> HeteroSampledBatch:
    """The per-hop sample of a typed graph of several types (see the module docstring): per hop, every edge type in
    order draws for the destination nodes the previous hop added (one fused kernel call per fanout group), then each
    node type's picks are deduplicated.

    ``sampler`` is the :class:`~lightning_zerocopy.sampling.NeighborSampler` (its types, fanouts per edge type,
    ``fused`` CSC and ``fused_kernel``, ``replace`` and ``node_keyed``)."""
    node_types, edge_types = sampler.node_types, sampler.edge_types
    node_keyed = sampler.node_keyed
    first = next(iter(by_type.values()))
    n_id = {t: by_type[t].to(torch.int64) if t in by_type else first.new_empty(0, dtype=torch.int64)
            for t in node_types}  # fmt: skip
    seeds = n_id[input_type] if input_type is not None else first
    counts = {t: [int(n_id[t].numel())] for t in node_types}
    frontier = {t: (0, int(n_id[t].numel())) for t in node_types}  # [begin, end) of the last hop's nodes
    rows: dict[EdgeType, list[torch.Tensor]] = {et: [] for et in edge_types}
    cols: dict[EdgeType, list[torch.Tensor]] = {et: [] for et in edge_types}
    e_ids: dict[EdgeType, list[torch.Tensor]] = {et: [] for et in edge_types}
    edge_counts: dict[EdgeType, list[int]] = {et: [] for et in edge_types}
    for hop in range(sampler.num_hops):
        drawn = _draw_hop(sampler, n_id, frontier, hop, seed)
        picked: dict[str, list[tuple[EdgeType, torch.Tensor]]] = {t: [] for t in node_types}
        for index, et in enumerate(edge_types):
            got = drawn.get(index)
            edge_counts[et].append(0 if got is None else int(got.src_ids.numel()))
            if got is not None and got.src_ids.numel() > 0:
                cols[et].append(got.col)
                e_ids[et].append(got.e_id)
                picked[et[0]].append((et, got.src_ids))
        before = {t: int(n_id[t].numel()) for t in node_types}
        for node_type, (new, local) in dedup_by_type(n_id, picked, node_keyed).items():
            parts = picked[node_type]
            n_id[node_type] = torch.cat([n_id[node_type], new])
            for (et, ids), part in zip(parts, torch.split(local, [int(i.numel()) for _, i in parts])):
                rows[et].append(part)
        for node_type in node_types:
            after = int(n_id[node_type].numel())
            frontier[node_type] = (before[node_type], after)
            counts[node_type].append(after - before[node_type])
    empty = seeds.new_empty(0)
    edge_index = {
        et: torch.stack([torch.cat(rows[et]), torch.cat(cols[et])]) if rows[et] else seeds.new_empty((2, 0))
        for et in edge_types
    }
    e_id_of = {et: torch.cat(e_ids[et]) if e_ids[et] else empty for et in edge_types}
    size = counts[input_type][0] if input_type is not None else sum(c[0] for c in counts.values())
    return HeteroSampledBatch(n_id, edge_index, e_id_of, counts, edge_counts, size, input_type)
