"""Multi-hop uniform neighbor sampling with PyG ``NeighborLoader`` conventions.

:class:`NeighborSampler` holds a CSC graph (incoming neighbors of ``v`` are ``indices[indptr[v]:indptr[v+1]]``)
and the per-hop fanouts, and turns a batch of seed nodes plus a per-batch random seed into a
:class:`SampledBatch`: global node ids with the seeds first, local ``edge_index`` with messages flowing
neighbor -> target, original edge ids and per-hop counts, exactly what PyG's ``NeighborLoader`` yields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Protocol, Sequence, Union

import torch

from lightning_zerocopy import ops
from lightning_zerocopy.options import SamplerDevice, check_choice, check_fanouts
from lightning_zerocopy.sampling.topology import PlacedTopology, place_topology

__all__ = [
    "CSCLike",
    "NeighborSampler",
    "Placement",
    "SampledBatch",
    "node_keyed_bound",
    "sample_bound",
    "validate_fanouts",
]

#: Where the sampler runs and reads the topology (:data:`lightning_zerocopy.options.SamplerDevice`).
Placement = SamplerDevice


class CSCLike(Protocol):
    """Anything with CSC tensors, such as :class:`lightning_zerocopy.graph.csc.CSCGraph`."""

    indptr: torch.Tensor
    indices: torch.Tensor
    edge_perm: Optional[torch.Tensor]


@dataclass(frozen=True)
class SampledBatch:
    """One sampled mini-batch, in PyG ``NeighborLoader`` layout.

    Attributes:
        n_id: int64 global ids of the sampled nodes; the first ``batch_size`` are the seeds in input order,
            then each hop's new nodes in order of first appearance.
        edge_index: int64 ``(2, E)`` local ids; ``edge_index[0]`` is the sampled neighbor (message source),
            ``edge_index[1]`` the target. Edges are ordered by hop, then target, then pick.
        e_id: int64 ids of the sampled edges in the original edge list (``edge_perm[edge_pos]``), or positions
            in ``indices`` when the sampler has no ``edge_perm``.
        num_sampled_nodes: nodes per hop, seeds first (``len(fanouts) + 1`` entries).
        num_sampled_edges: edges per hop (``len(fanouts)`` entries).
        batch_size: number of seeds.
    """

    n_id: torch.Tensor
    edge_index: torch.Tensor
    e_id: torch.Tensor
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    batch_size: int


def _sampled_batch(out: "ops.SampledSubgraph", e_id: torch.Tensor, batch_size: int) -> SampledBatch:
    """The op's raw output in PyG's layout: ``edge_index = [row; col]`` (neighbor -> target), per-hop counts."""
    return SampledBatch(
        n_id=out.n_id,
        edge_index=torch.stack([out.row, out.col]),
        e_id=e_id,
        num_sampled_nodes=out.num_sampled_nodes.tolist(),
        num_sampled_edges=out.num_sampled_edges.tolist(),
        batch_size=batch_size,
    )


def validate_fanouts(fanouts: Sequence[int]) -> list[int]:
    """Return ``fanouts`` as a list of ints, raising ``ValueError``/``TypeError`` naming the bad entry.

    Each fanout is a positive number of neighbors per target for one hop, or ``-1`` for all neighbors
    (:func:`lightning_zerocopy.options.check_fanouts` with the argument name ``fanouts``).
    """
    return check_fanouts(fanouts, "fanouts")


def sample_bound(batch_size: int, fanouts: Sequence[int]) -> Optional[tuple[int, int]]:
    """Upper bounds ``(nodes, edges)`` on one sample of ``batch_size`` seeds, or ``None`` with a ``-1`` fanout.

    Each target draws at most ``fanout`` neighbors per hop (exactly ``fanout`` with replacement), so hop ``l``
    adds at most ``batch_size * prod(fanouts[:l])`` edges and new nodes. Callers cap the result at the graph's
    size (:func:`~lightning_zerocopy.data.batch.max_sampled_nodes`, ``pipeline.slots.capacity_bound``).
    """
    if any(int(f) < 0 for f in fanouts):
        return None
    nodes, edges, frontier = int(batch_size), 0, int(batch_size)
    for fanout in fanouts:
        frontier *= int(fanout)
        edges += frontier
        nodes += frontier
    return nodes, edges


def node_keyed_bound(batch_size: int, fanouts: Sequence[int], num_nodes: int, num_edges: int) -> tuple[int, int]:
    """Upper bounds ``(nodes, edges)`` on one node-keyed sample (``NeighborSampler(node_keyed=True)``).

    Nodes are deduplicated per hop only, so the graph's size caps each level, not the whole sample: level ``l``
    holds at most ``min(level[l - 1] * fanouts[l - 1], num_nodes)`` nodes (``num_nodes`` for a ``-1`` fanout), and
    hop ``l`` at most ``level[l] * fanouts[l]`` edges (the degree sum of the level, at most ``num_edges``, for ``-1``).
    The CUDA sampler sizes its buffers with the same node bound.
    """
    level = int(batch_size)
    nodes, edges = level, 0
    for fanout in (int(f) for f in fanouts):
        edges += int(num_edges) if fanout < 0 else level * fanout
        level = int(num_nodes) if fanout < 0 else min(level * fanout, int(num_nodes))
        nodes += level
    return nodes, edges


class NeighborSampler:
    """Uniform multi-hop neighbor sampler over incoming edges, running the compiled CPU kernel.

    The same seeds and per-batch ``seed`` give bitwise the same :class:`SampledBatch` on any thread count.

    Args:
        indptr: int64 CSC pointer of length ``num_nodes + 1``, or a graph object with ``indptr``,
            ``indices`` and ``edge_perm`` attributes (then leave ``indices`` and ``edge_perm`` unset). A
            :class:`~lightning_zerocopy.sampling.topology.PlacedTopology` is used as placed (its owner keeps it).
        indices: int32/int64 source node of every incoming edge, grouped by target.
        edge_perm: int64 original edge id of every position in ``indices`` (from ``build_csc``), or ``None``
            to report positions in ``indices`` as edge ids.
        fanouts: neighbors per target for each hop, e.g. ``[15, 10, 5]``; ``-1`` takes all neighbors. Required.
        replace: sample with replacement (exactly ``fanout`` picks per target with neighbors).
        num_threads: threads for the sampling kernel; ``None`` uses ``torch.get_num_threads()``. When set, the
            process-wide ``torch.set_num_threads`` is switched for the duration of each call and restored.
        placement: ``"cpu"`` (default), ``"gpu"`` (CUDA kernel; ``indptr``/``indices``/``edge_perm`` copied to
            ``device`` on first use) or ``"uva"`` (CUDA kernel; ``indices`` and ``edge_perm`` stay in host memory,
            registered for zero-copy reads on first use; ``indptr`` goes to the GPU unless ``uva_indptr="host"``).
            GPU placements return CUDA tensors (counts as lists) and, for the same inputs and seed, bitwise the
            CPU placement's sample.
        device: the CUDA device of the ``gpu``/``uva`` placements (default: the current one).
        uva_indptr: where ``uva`` keeps ``indptr``: ``"gpu"`` (default; 8 bytes per node) or ``"host"``.
        node_keyed: evaluation sampling (see :func:`lightning_zerocopy.ops.sample_neighbors`): a node's picks at a
            hop are keyed by (``seed``, hop, node id) and nodes are deduplicated per hop, so with one ``seed`` for
            all batches a seed's sampled computation graph does not depend on its batch (ids in ``n_id`` may
            repeat across hops, as in PyG's disjoint mode). ``False`` (training): the sample of a batch.
    """

    def __init__(
        self,
        indptr: Union[torch.Tensor, CSCLike],
        indices: Optional[torch.Tensor] = None,
        edge_perm: Optional[torch.Tensor] = None,
        fanouts: Optional[Sequence[int]] = None,
        replace: bool = False,
        num_threads: Optional[int] = None,
        placement: Placement = "cpu",
        device: Union[torch.device, str, int, None] = None,
        uva_indptr: Literal["gpu", "host"] = "gpu",
        node_keyed: bool = False,
    ) -> None:
        placed: Optional[PlacedTopology] = None
        if not isinstance(indptr, torch.Tensor):
            if indices is not None or edge_perm is not None:
                raise ValueError("pass either a graph object as `indptr` or the `indptr`/`indices` tensors")
            graph = indptr
            indptr, indices, edge_perm = graph.indptr, graph.indices, getattr(graph, "edge_perm", None)
            if isinstance(graph, PlacedTopology):  # placed by its owner: use as is, release nothing
                placed = PlacedTopology(graph.indptr, graph.indices, graph.edge_perm, graph.device)
                device = graph.device if device is None else device
        if indices is None:
            raise ValueError("`indices` is required when `indptr` is a tensor")
        if edge_perm is not None and edge_perm.shape != indices.shape:
            raise ValueError(
                f"`edge_perm` must have one entry per edge in `indices` ({indices.shape[0]}), "
                f"got shape {tuple(edge_perm.shape)}"
            )
        if fanouts is None:
            raise ValueError("`fanouts` is required: one neighbor count per hop, e.g. [15, 10, 5]")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"`num_threads` must be >= 1 or None, got {num_threads}")
        self.indptr = indptr
        self.indices = indices
        self.edge_perm = edge_perm
        self.fanouts = validate_fanouts(fanouts)
        self.replace = bool(replace)
        self.node_keyed = bool(node_keyed)
        self.num_threads = num_threads
        check_choice(placement, SamplerDevice, "placement")
        if uva_indptr not in ("gpu", "host"):
            raise ValueError(f"`uva_indptr` must be 'gpu' or 'host', got {uva_indptr!r}")
        self.placement: Placement = placement
        self.uva_indptr = uva_indptr
        self.device = None if device is None else torch.device(device)
        self._placed = placed

    @property
    def num_nodes(self) -> int:
        """Number of nodes of the graph."""
        return self.indptr.shape[0] - 1

    @property
    def num_hops(self) -> int:
        """Number of hops (``len(fanouts)``)."""
        return len(self.fanouts)

    def sample(self, seeds: torch.Tensor, seed: int) -> SampledBatch:
        """Sample the multi-hop neighborhood of ``seeds``.

        Args:
            seeds: unique int64 node ids of the batch (the targets of the last GNN layer).
            seed: per-batch random seed, for example derived from (base seed, epoch, batch index).

        Returns:
            The :class:`SampledBatch`.

        Raises:
            ValueError, TypeError, IndexError: naming the offending argument (duplicate or out-of-range seeds,
                wrong dtypes, a malformed graph).
        """
        if self.placement != "cpu":
            return self._sample_cuda(seeds, seed)
        out = self._sample_raw(seeds, seed)
        e_id = out.edge_pos if self.edge_perm is None else self.edge_perm[out.edge_pos]
        return _sampled_batch(out, e_id, int(seeds.shape[0]))

    def _sample_raw(self, seeds: torch.Tensor, seed: int) -> ops.SampledSubgraph:
        args = (self.indptr, self.indices, seeds, self.fanouts, self.replace, seed, self.node_keyed)
        if self.num_threads is None:
            return ops.sample_neighbors(*args)
        previous = torch.get_num_threads()
        torch.set_num_threads(self.num_threads)
        try:
            return ops.sample_neighbors(*args)
        finally:
            torch.set_num_threads(previous)

    # ------------------------------------------------------------------------------- gpu / uva placements

    def _place(self) -> PlacedTopology:
        """The topology as the CUDA kernel reads it, placed on first use (no CUDA work before); tensors that are
        already placed (e.g. from :class:`~lightning_zerocopy.data.resources.DeviceResources`) stay as they are."""
        if self._placed is not None:
            return self._placed
        if not torch.cuda.is_available():
            raise RuntimeError(f"placement={self.placement!r} needs a CUDA device; use placement='cpu'")
        if self.device is None or self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._placed = place_topology(
            self.indptr, self.indices, self.edge_perm, self.placement, self.device, uva_indptr=self.uva_indptr
        )
        return self._placed

    def _sample_cuda(self, seeds: torch.Tensor, seed: int) -> SampledBatch:
        placed = self._place()
        indptr, indices, edge_perm = placed.indptr, placed.indices, placed.edge_perm
        with torch.cuda.device(self.device):
            out = ops.sample_neighbors(
                indptr, indices, seeds.to(self.device), self.fanouts, self.replace, seed, self.node_keyed
            )
            if edge_perm is None:
                e_id = out.edge_pos
            elif edge_perm.is_cuda:
                e_id = edge_perm[out.edge_pos]
            else:  # registered host memory: read the ids in place
                e_id = ops.gather_rows(edge_perm.view(-1, 1), out.edge_pos).view(-1)
        return _sampled_batch(out, e_id, int(seeds.shape[0]))

    def close(self) -> None:
        """Release the GPU copies / host registrations of the ``gpu``/``uva`` placements (no-op for ``cpu``)."""
        placed, self._placed = self._placed, None
        if placed is not None:
            placed.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_nodes={self.num_nodes}, num_edges={self.indices.shape[0]}, "
            f"fanouts={self.fanouts}, replace={self.replace}, placement={self.placement!r}, "
            f"node_keyed={self.node_keyed})"
        )
