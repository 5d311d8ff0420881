"""Heterogeneous neighbor sampling with the semantics of PyG's hetero ``NeighborLoader`` (not disjoint).

The graph is one CSC topology per edge type ``(src, rel, dst)``: the incoming ``src``-type neighbors of every
``dst``-type node. Hop by hop, for every edge type in order, ``fanouts[edge_type][hop]`` incoming neighbors are
drawn for the ``dst``-type nodes the previous hop added (the seeds at hop 0); the picked ``src``-type nodes are
deduplicated per node type across hops, in order of first appearance (seeds first), as pyg-lib's
``hetero_neighbor_sample`` does: within a hop, the edge types in order, each edge type's picks by target, then pick.

Each (hop, edge type) is one call of the homogeneous one-hop kernel (``fanouts=[k]``) through
:class:`~lightning_zerocopy.sampling.NeighborSampler`, so every placement (CPU threads, ``uva``, ``gpu``) runs
unchanged code. The call's random seed is derived from (batch seed, hop, edge type index) (:func:`hop_seed`); the
kernel keys a target's picks by (call seed, position of the target in the frontier) (``csrc/ops/pick_policy.h``),
and the frontier is the same on every device, so every placement draws the same sample. The kernel deduplicates
ids in one id space, so its ``n_id`` mixes the frontier's ``dst`` ids with the picked ``src`` ids; the picked
source *id* is still ``n_id[row]`` (deduplication keeps values) and its target is ``col``, which is all this module
reads. The per-type deduplication and relabeling (:func:`first_appearance`) is vectorised torch (sort-based), on
the device the sample lives on.

Node-keyed (evaluation) sampling passes the kernel's ``node_keyed`` flag: a target's picks are then keyed by
(call seed, node id), i.e. by (split seed, hop, edge type, node id), and nodes are deduplicated per hop and type
only (hop ``k``'s picks of a type form level ``k + 1`` of that type's ``n_id`` even when they sit at a lower level
too; edges run from level ``k + 1`` to level ``k``), so a seed's sampled computation graph does not depend on its
batch -- the homogeneous node-keyed contract, per node type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

import torch

from lightning_zerocopy.options import SamplerDevice, check_choice, check_fanouts
from lightning_zerocopy.sampling.neighbor_sampler import CSCLike, NeighborSampler

__all__ = ["EdgeType", "HeteroNeighborSampler", "HeteroSampledBatch", "first_appearance", "hop_seed"]

#: ``(source node type, relation, destination node type)``, PyG's key of an edge type.
EdgeType = tuple[str, str, str]

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def hop_seed(batch_seed: int, hop: int, edge_type_index: int) -> int:
    """The kernel seed of one (hop, edge type) call: a splitmix64 chain over the three, a non-negative 63-bit int
    (the same mixing as the plan's ``derive_seed``); pure, so every device and process gets the same."""
    state = 0
    for part in (batch_seed, hop, edge_type_index):
        state = _splitmix64(state ^ (int(part) & _MASK64))
    return state >> 1


def first_appearance(existing: torch.Tensor, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Deduplicate ``candidates`` against the unique ids ``existing``, keeping the order of first appearance.

    Args:
        existing: int64 unique ids already numbered ``0 .. len(existing) - 1``.
        candidates: int64 ids (repeats allowed), in the order they were picked.

    Returns:
        ``(new, local)``: the ids of ``candidates`` not in ``existing``, in order of first appearance, and the
        local index of every candidate in ``cat([existing, new])``. One sort (``torch.unique``) and one
        ``scatter_reduce``; no loop over nodes, on the tensors' device.
    """
    if candidates.numel() == 0:
        return candidates.new_empty(0), candidates.new_empty(0)
    ids = torch.cat([existing, candidates])
    uniq, inverse = torch.unique(ids, return_inverse=True)
    positions = torch.arange(ids.numel(), device=ids.device)
    first = torch.full((uniq.numel(),), ids.numel(), dtype=torch.int64, device=ids.device)
    first.scatter_reduce_(0, inverse, positions, reduce="amin")
    order = torch.argsort(first)  # first positions are distinct: the order is unique
    local_of = torch.empty_like(order)
    local_of[order] = torch.arange(order.numel(), device=ids.device)
    count = existing.numel()  # existing ids are unique, so they keep their positions 0 .. count - 1
    return uniq[order[count:]], local_of[inverse[count:]]


@dataclass(frozen=True)
class HeteroSampledBatch:
    """One sampled heterogeneous mini-batch in PyG's hetero ``NeighborLoader`` layout (ids are the host memory's).

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


class HeteroNeighborSampler:
    """PyG-style heterogeneous multi-hop sampler over one CSC topology per edge type.

    Args:
        graphs: per edge type ``(s, r, d)``, a CSC graph (or a placed topology) whose targets are ``d``-type ids
            and whose ``indices`` are ``s``-type ids; ``indptr`` may cover more than ``num_nodes[d]`` targets (the
            host copy sizes both id spaces to the larger type, so the kernel's bounds hold; see
            :mod:`lightning_zerocopy.data.host.hetero`). The dict's order is the edge types' sampling order.
        node_types: every node type, in order (the batch has all of them).
        fanouts: per edge type, neighbors per hop (all lists the same length; ``-1`` takes all).
        replace: sample with replacement.
        num_threads: threads of the CPU kernel (``None``: ``torch.get_num_threads()``).
        placement: ``"cpu"``, ``"uva"`` or ``"gpu"`` (as :class:`~lightning_zerocopy.sampling.NeighborSampler`).
        device: the CUDA device of the GPU placements.
        node_keyed: evaluation sampling (see the module docstring).

    Raises:
        ValueError: an edge type without fanouts (or fanouts for an edge type without a graph), lists of
            different lengths, an edge type naming an unknown node type.
    """

    def __init__(
        self,
        graphs: Mapping[EdgeType, CSCLike],
        node_types: Sequence[str],
        fanouts: Mapping[EdgeType, Sequence[int]],
        replace: bool = False,
        num_threads: Optional[int] = None,
        placement: SamplerDevice = "cpu",
        device: Union[torch.device, str, int, None] = None,
        node_keyed: bool = False,
    ) -> None:
        check_choice(placement, SamplerDevice, "placement")
        self.edge_types: list[EdgeType] = [tuple(et) for et in graphs]  # type: ignore[misc]
        self.node_types = list(node_types)
        if set(map(tuple, fanouts)) != set(self.edge_types):
            raise ValueError(f"`fanouts` must name exactly the edge types {self.edge_types}, got {list(fanouts)}")
        lengths = {len(fanouts[et]) for et in self.edge_types}
        if len(lengths) > 1:
            raise ValueError(f"every edge type needs as many fanouts (hops), got lengths {sorted(lengths)}")
        for src, _, dst in self.edge_types:
            for node_type in (src, dst):
                if node_type not in self.node_types:
                    raise ValueError(f"edge type {(src, _, dst)} names {node_type!r}, not one of {self.node_types}")
        self.fanouts = {et: check_fanouts(list(fanouts[et]), f"fanouts[{'__'.join(et)}]") for et in self.edge_types}
        self.num_hops = lengths.pop() if lengths else 0
        self.replace = bool(replace)
        self.node_keyed = bool(node_keyed)
        self.placement: SamplerDevice = placement
        # one homogeneous one-hop sampler per (edge type, hop): the same kernel, placement and id mapping
        self._samplers = {
            et: [
                NeighborSampler(graphs[et], fanouts=[k], replace=replace, num_threads=num_threads,
                                placement=placement, device=device, node_keyed=node_keyed)  # fmt: skip
                for k in self.fanouts[et]
            ]
            for et in self.edge_types
        }

    def sample(
        self,
        seeds: Union[torch.Tensor, Mapping[str, torch.Tensor]],
        seed: int,
        input_type: Optional[str] = None,
    ) -> HeteroSampledBatch:
        """Sample the multi-hop neighborhood of the seed nodes.

        Args:
            seeds: unique int64 ids of ``input_type`` nodes, or a dict of them per node type (PyG's ``seed_dict``:
                a link batch seeds both endpoint types; every type's seeds are hop 0 of its ``n_id``), on the device
                the sample is built on.
            seed: the batch's random seed (the plan's ``batch_seed``).
            input_type: the seeds' node type (needed for a tensor); with a dict, the type whose seeds count as
                ``batch_size`` (``None``: the batch has no input type, ``batch_size`` counts every seed).

        Raises:
            ValueError: an unknown node type (``input_type`` or a key of ``seeds``), a tensor without
                ``input_type``; the kernel's errors (out-of-range or repeated seeds).
        """
        if input_type is not None and input_type not in self.node_types:
            raise ValueError(f"`input_type` {input_type!r} is not one of the node types {self.node_types}")
        if isinstance(seeds, torch.Tensor):
            if input_type is None:
                raise ValueError("`input_type` names the node type of `seeds`; pass a dict to seed several types")
            by_type = {input_type: seeds}
        else:
            unknown = [t for t in seeds if t not in self.node_types]
            if unknown:
                raise ValueError(f"`seeds` names {unknown[0]!r}, not one of the node types {self.node_types}")
            by_type = dict(seeds)
        first = next(iter(by_type.values()))
        n_id = {t: by_type[t].to(torch.int64) if t in by_type else first.new_empty(0, dtype=torch.int64)
                for t in self.node_types}  # fmt: skip
        seeds = n_id[input_type] if input_type is not None else first
        counts = {t: [int(n_id[t].numel())] for t in self.node_types}
        frontier = {t: (0, int(n_id[t].numel())) for t in self.node_types}  # [begin, end) of the last hop's nodes
        rows: dict[EdgeType, list[torch.Tensor]] = {et: [] for et in self.edge_types}
        cols: dict[EdgeType, list[torch.Tensor]] = {et: [] for et in self.edge_types}
        e_ids: dict[EdgeType, list[torch.Tensor]] = {et: [] for et in self.edge_types}
        edge_counts: dict[EdgeType, list[int]] = {et: [] for et in self.edge_types}
        for hop in range(self.num_hops):
            picked: dict[str, list[tuple[EdgeType, torch.Tensor]]] = {t: [] for t in self.node_types}
            for index, et in enumerate(self.edge_types):
                src, _, dst = et
                begin, end = frontier[dst]
                if end == begin:
                    edge_counts[et].append(0)
                    continue
                out = self._samplers[et][hop].sample(n_id[dst][begin:end], seed=hop_seed(seed, hop, index))
                src_ids = out.n_id[out.edge_index[0]]  # the kernel's n_id keeps the id values (see the docstring)
                cols[et].append(out.edge_index[1] + begin)
                e_ids[et].append(out.e_id)
                edge_counts[et].append(int(src_ids.numel()))
                picked[src].append((et, src_ids))
            for node_type in self.node_types:
                before = int(n_id[node_type].numel())
                parts = picked[node_type]
                if parts:
                    candidates = torch.cat([ids for _, ids in parts])
                    existing = n_id[node_type] if not self.node_keyed else n_id[node_type][:0]
                    new, local = first_appearance(existing, candidates)
                    if self.node_keyed:
                        local = local + before
                    n_id[node_type] = torch.cat([n_id[node_type], new])
                    for (et, ids), part in zip(parts, torch.split(local, [int(i.numel()) for _, i in parts])):
                        rows[et].append(part)
                after = int(n_id[node_type].numel())
                frontier[node_type] = (before, after)
                counts[node_type].append(after - before)
        empty = seeds.new_empty(0)
        edge_index = {
            et: torch.stack([torch.cat(rows[et]), torch.cat(cols[et])]) if rows[et] else seeds.new_empty((2, 0))
            for et in self.edge_types
        }
        e_id = {et: torch.cat(e_ids[et]) if e_ids[et] else empty for et in self.edge_types}
        size = counts[input_type][0] if input_type is not None else sum(c[0] for c in counts.values())
        return HeteroSampledBatch(n_id, edge_index, e_id, counts, edge_counts, size, input_type)

    def close(self) -> None:
        """Release what the GPU placements placed themselves (nothing for topologies placed by their owner)."""
        for samplers in self._samplers.values():
            for sampler in samplers:
                sampler.close()

    def __repr__(self) -> str:
        return (
            f"HeteroNeighborSampler(edge_types={len(self.edge_types)}, hops={self.num_hops}, replace={self.replace}, "
            f"placement={self.placement!r}, node_keyed={self.node_keyed})"
        )
