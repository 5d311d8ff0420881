"""Multi-hop uniform neighbor sampling with PyG ``NeighborLoader`` conventions, over a graph of any schema.

:class:`NeighborSampler` holds one CSC topology per edge type (incoming neighbors of ``v`` are
``indices[indptr[v]:indptr[v+1]]``) and the per-hop fanouts, and turns a batch of seed nodes plus a per-batch random
seed into PyG's layout: global node ids with the seeds first, local ``edge_index`` with messages flowing neighbor ->
target, original edge ids and per-hop counts.

An untyped graph (one CSC, fanouts a list) is the one-type case: one call of the fused multi-hop kernel per batch,
returning a :class:`SampledBatch`. A typed graph (a dict of CSCs by edge type, fanouts per edge type) returns a
:class:`~lightning_zerocopy.sampling.hetero.HeteroSampledBatch` (PyG's choice of output by graph, as its
``NeighborSampler`` returns ``SamplerOutput`` or ``HeteroSamplerOutput``): with one node type and one edge type it is
the same fused call; with several, one call of the kernel per hop over a CSC of every edge type
(:class:`~lightning_zerocopy.graph.fused_csc.FusedCSC`; one call per distinct fanout of the hop,
:func:`~.hetero.sample_hetero`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional, Protocol, Sequence, Union

import torch

from lightning_zerocopy import ops
from lightning_zerocopy.graph.fused_csc import FusedCSC, fuse_csc
from lightning_zerocopy.graph.schema import EDGE, EdgeType, GraphSchema
from lightning_zerocopy.options import SamplerDevice, check_choice, check_fanouts
from lightning_zerocopy.sampling.hetero import HeteroSampledBatch, sample_hetero, seeds_by_type
from lightning_zerocopy.sampling.topology import PlacedTopology, place_topology

__all__ = [
    "CSCKernel",
    "CSCLike",
    "HeteroNeighborSampler",
    "NeighborSampler",
    "Placement",
    "SampledBatch",
    "max_sampled_nodes",
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
    """One sampled mini-batch of an untyped graph, in PyG ``NeighborLoader`` layout.

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
    size (:func:`max_sampled_nodes`, ``pipeline.slots.capacity_bound``).
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


def max_sampled_nodes(batch_size: int, fanouts: Sequence[int], num_nodes: int, node_keyed: bool = False) -> int:
    """An upper bound on ``len(n_id)`` of a batch (:func:`sample_bound`), capped at ``num_nodes``; a fanout of ``-1``
    gives ``num_nodes``. Node-keyed (evaluation) sampling caps each hop's level instead (:func:`node_keyed_bound`).
    Sizes a builder's preallocated ``out`` buffers."""
    if node_keyed:
        return node_keyed_bound(batch_size, fanouts, num_nodes, 0)[0]
    bound = sample_bound(batch_size, fanouts)
    return num_nodes if bound is None else min(bound[0], num_nodes)


class CSCKernel:
    """One CSC topology where the sampling kernel reads it: the CPU kernel, or the CUDA kernel over a ``gpu`` copy
    or ``uva`` registrations (placed on first use, released by :meth:`close`; a :class:`PlacedTopology` is used as
    placed and its owner keeps it)."""

    def __init__(
        self,
        graph: CSCLike,
        placement: SamplerDevice,
        device: Optional[torch.device],
        uva_indptr: str,
        num_threads: Optional[int],
    ) -> None:
        self.indptr, self.indices = graph.indptr, graph.indices
        self.edge_perm: Optional[torch.Tensor] = getattr(graph, "edge_perm", None)
        self._placed: Optional[PlacedTopology] = None
        if isinstance(graph, PlacedTopology):  # placed by its owner: use as is, release nothing
            self._placed = PlacedTopology(graph.indptr, graph.indices, graph.edge_perm, graph.device)
            device = graph.device if device is None else device
        self.placement, self.device, self.uva_indptr, self.num_threads = placement, device, uva_indptr, num_threads

    def run(
        self, seeds: torch.Tensor, fanouts: list[int], seed: int, replace: bool, node_keyed: bool
    ) -> tuple[ops.SampledSubgraph, torch.Tensor]:
        """One call of the multi-hop kernel: its raw output and the sampled edges' ids (``edge_perm[edge_pos]``)."""
        return self._call(ops.sample_neighbors, seeds, fanouts, replace, seed, node_keyed)

    def pick(
        self, targets: torch.Tensor, fanout: int, seed: int, replace: bool, node_keyed: bool, target_ends: list[int]
    ) -> tuple[ops.PickedEdges, torch.Tensor]:
        """One hop without relabeling (:func:`~lightning_zerocopy.ops.pick_neighbors`): its raw output and the
        picked edges' ids."""
        return self._call(ops.pick_neighbors, targets, fanout, replace, seed, node_keyed, target_ends)

    def _call(self, op: Any, seeds: torch.Tensor, *args: Any) -> tuple[Any, torch.Tensor]:
        if self.placement == "cpu":
            with ops.host_threads(self.num_threads):
                out = op(self.indptr, self.indices, seeds, *args)
            return out, out.edge_pos if self.edge_perm is None else self.edge_perm[out.edge_pos]
        placed = self._place()
        with torch.cuda.device(self.device):
            out = op(placed.indptr, placed.indices, seeds.to(self.device), *args)
            if placed.edge_perm is None:
                e_id = out.edge_pos
            elif placed.edge_perm.is_cuda:
                e_id = placed.edge_perm[out.edge_pos]
            else:  # registered host memory: read the ids in place
                e_id = ops.gather_rows(placed.edge_perm.view(-1, 1), out.edge_pos).view(-1)
        return out, e_id

    def _place(self) -> PlacedTopology:
        """The topology as the CUDA kernel reads it, placed on first use (no CUDA work before)."""
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

    def close(self) -> None:
        placed, self._placed = self._placed, None
        if placed is not None:
            placed.close()


def _one_graph(indptr: Any, indices: Optional[torch.Tensor], edge_perm: Optional[torch.Tensor]) -> Any:
    """The CSC an untyped sampler is given: a graph object, or its tensors (checked, naming the argument)."""
    if not isinstance(indptr, torch.Tensor):
        if indices is not None or edge_perm is not None:
            raise ValueError("pass either a graph object as `indptr` or the `indptr`/`indices` tensors")
        return indptr
    if indices is None:
        raise ValueError("`indices` is required when `indptr` is a tensor")
    if edge_perm is not None and edge_perm.shape != indices.shape:
        raise ValueError(f"`edge_perm` must have one entry per edge in `indices` ({indices.shape[0]}), "
                         f"got shape {tuple(edge_perm.shape)}")  # fmt: skip
    return _Tensors(indptr, indices, edge_perm)


@dataclass
class _Tensors:
    indptr: torch.Tensor
    indices: torch.Tensor
    edge_perm: Optional[torch.Tensor]


def _typed_fanouts(fanouts: Any, edge_types: list[EdgeType]) -> dict[EdgeType, list[int]]:
    if not isinstance(fanouts, Mapping) or set(map(tuple, fanouts)) != set(edge_types):
        raise ValueError(f"`fanouts` must name exactly the edge types {edge_types}, got {list(fanouts)}")
    resolved = {et: check_fanouts(list(fanouts[et]), f"fanouts[{'__'.join(et)}]") for et in edge_types}
    lengths = {len(f) for f in resolved.values()}
    if len(lengths) > 1:
        raise ValueError(f"every edge type needs as many fanouts (hops), got lengths {sorted(lengths)}")
    return resolved


class NeighborSampler:
    """Uniform multi-hop neighbor sampler over incoming edges, of an untyped or a typed graph.

    The same seeds and per-batch ``seed`` give bitwise the same sample on any thread count and placement.

    Args:
        indptr: the graph: int64 CSC pointer of length ``num_nodes + 1`` (with ``indices``/``edge_perm``), a graph
            object with ``indptr``, ``indices`` and ``edge_perm`` attributes (a
            :class:`~lightning_zerocopy.sampling.topology.PlacedTopology` is used as placed), or, for a typed
            graph, a dict of such graph objects by edge type ``(s, r, d)`` (targets ``d``-type ids, ``indices``
            ``s``-type ids; the dict's order is the order edge types are sampled in).
        indices: int32/int64 source node of every incoming edge, grouped by target (with a tensor ``indptr``).
        edge_perm: int64 original edge id of every position in ``indices`` (from ``build_csc``), or ``None``
            to report positions in ``indices`` as edge ids.
        fanouts: neighbors per target for each hop, e.g. ``[15, 10, 5]`` (per edge type for a typed graph, lists
            of one length); ``-1`` takes all neighbors. Required.
        replace: sample with replacement (exactly ``fanout`` picks per target with neighbors).
        num_threads: threads for the CPU kernel; ``None`` uses ``torch.get_num_threads()``. When set, the
            process-wide ``torch.set_num_threads`` is switched for the duration of each call and restored.
        placement: ``"cpu"`` (default), ``"gpu"`` (CUDA kernel; the topology copied to ``device`` on first use) or
            ``"uva"`` (CUDA kernel; ``indices`` and ``edge_perm`` stay in host memory, registered for zero-copy
            reads on first use; ``indptr`` goes to the GPU unless ``uva_indptr="host"``). GPU placements return
            CUDA tensors (counts as lists) and, for the same inputs and seed, bitwise the CPU placement's sample.
        device: the CUDA device of the ``gpu``/``uva`` placements (default: the current one).
        uva_indptr: where ``uva`` keeps ``indptr``: ``"gpu"`` (default; 8 bytes per node) or ``"host"``.
        node_keyed: evaluation sampling (see :func:`lightning_zerocopy.ops.sample_neighbors`): a node's picks at a
            hop are keyed by (``seed``, hop, node id) and nodes are deduplicated per hop, so with one ``seed`` for
            all batches a seed's sampled computation graph does not depend on its batch (ids in ``n_id`` may
            repeat across hops, as in PyG's disjoint mode). ``False`` (training): the sample of a batch.
        node_types: a typed graph's node types, in order (default: as its edge types name them).
        num_nodes: a typed graph's nodes per type (default: what its CSCs imply), for the fused CSC it builds.
        fused: a typed graph of several types: its CSC of every edge type (:func:`~lightning_zerocopy.graph.fused_csc.
            fuse_csc` of the per-edge-type CSCs, or that topology placed by its owner, e.g. the host copy's shared
            one), which is all this sampler reads; default: fused here, in private memory.
    """

    def __init__(
        self,
        indptr: Union[torch.Tensor, CSCLike, Mapping[EdgeType, CSCLike]],
        indices: Optional[torch.Tensor] = None,
        edge_perm: Optional[torch.Tensor] = None,
        fanouts: Optional[Union[Sequence[int], Mapping[EdgeType, Sequence[int]]]] = None,
        replace: bool = False,
        num_threads: Optional[int] = None,
        placement: Placement = "cpu",
        device: Union[torch.device, str, int, None] = None,
        uva_indptr: Literal["gpu", "host"] = "gpu",
        node_keyed: bool = False,
        *,
        node_types: Optional[Sequence[str]] = None,
        num_nodes: Optional[Mapping[str, int]] = None,
        fused: Optional[FusedCSC] = None,
    ) -> None:
        check_choice(placement, SamplerDevice, "placement")
        if isinstance(indptr, Mapping):  # a typed graph: one CSC per edge type
            if indices is not None or edge_perm is not None:
                raise ValueError("a typed graph is a dict of graph objects by edge type; leave `indices` unset")
            graphs = {(et[0], et[1], et[2]): g for et, g in indptr.items()}
            edge_types = list(graphs)
            named = list(dict.fromkeys(t for s, _, d in edge_types for t in (s, d)))
            types = list(node_types) if node_types is not None else named
            for edge_type in edge_types:
                for node_type in (edge_type[0], edge_type[2]):
                    if node_type not in types:
                        raise ValueError(f"edge type {edge_type} names {node_type!r}, not one of {types}")
            self.schema = GraphSchema(tuple(types), tuple(edge_types), None)
        else:
            graphs = {EDGE: _one_graph(indptr, indices, edge_perm)}
            self.schema = GraphSchema.untyped()
        if fanouts is None:
            raise ValueError("`fanouts` is required: one neighbor count per hop, e.g. [15, 10, 5]")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"`num_threads` must be >= 1 or None, got {num_threads}")
        if uva_indptr not in ("gpu", "host"):
            raise ValueError(f"`uva_indptr` must be 'gpu' or 'host', got {uva_indptr!r}")
        if self.schema.is_typed:
            self.fanouts: Any = _typed_fanouts(fanouts, list(graphs))
            self.num_hops = len(next(iter(self.fanouts.values()), []))
        else:
            self.fanouts = validate_fanouts(fanouts)  # type: ignore[arg-type]
            self.num_hops = len(self.fanouts)
        self.replace = bool(replace)
        self.node_keyed = bool(node_keyed)
        self.num_threads = num_threads
        self.placement: Placement = placement
        self.uva_indptr = uva_indptr
        device = None if device is None else torch.device(device)
        #: the fused CSC of a typed graph of several types, and its kernel (the per-edge-type CSCs are not read)
        self.fused: Optional[FusedCSC] = None
        self.fused_kernel: Optional[CSCKernel] = None
        self.kernels: dict[EdgeType, CSCKernel] = {}
        if self.schema.is_typed and not self.schema.one_type:
            self.fused = fused if fused is not None else fuse_csc(graphs, num_nodes, self.schema.node_types)
            if list(self.fused.layout.edge_types) != edge_types:
                covered = list(self.fused.layout.edge_types)
                raise ValueError(f"`fused` covers the edge types {covered}, not {edge_types}")
            self.fused_kernel = CSCKernel(self.fused.graph, placement, device, uva_indptr, num_threads)
        else:
            self.kernels = {et: CSCKernel(g, placement, device, uva_indptr, num_threads) for et, g in graphs.items()}

    # ---- the one CSC of an untyped graph -----------------------------------------------------------------------

    @property
    def _kernel(self) -> CSCKernel:
        (kernel,) = self.kernels.values()
        return kernel

    indptr = property(lambda self: self._kernel.indptr)
    indices = property(lambda self: self._kernel.indices)
    edge_perm = property(lambda self: self._kernel.edge_perm)
    device = property(lambda self: self._kernel.device)

    @property
    def num_nodes(self) -> int:
        """Number of nodes of an untyped graph."""
        return self.indptr.shape[0] - 1

    @property
    def edge_types(self) -> list[EdgeType]:
        return list(self.schema.edge_types)

    @property
    def node_types(self) -> list[str]:
        return list(self.schema.node_types)

    # ---- sampling ----------------------------------------------------------------------------------------------

    def sample(
        self, seeds: Union[torch.Tensor, Mapping[str, torch.Tensor]], seed: int, input_type: Optional[str] = None
    ) -> Any:
        """Sample the multi-hop neighborhood of ``seeds``.

        Args:
            seeds: unique int64 node ids of the batch (the targets of the last GNN layer); for a typed graph, ids
                of ``input_type`` nodes, or a dict of them per node type (PyG's ``seed_dict``: a link batch seeds
                both endpoint types; every type's seeds are hop 0 of its ``n_id``).
            seed: per-batch random seed, for example derived from (base seed, epoch, batch index).
            input_type: a typed graph's seed type (needed for a tensor); with a dict, the type whose seeds count as
                ``batch_size`` (``None``: ``batch_size`` counts every seed).

        Returns:
            A :class:`SampledBatch` for an untyped graph, a :class:`~.hetero.HeteroSampledBatch` for a typed one.

        Raises:
            ValueError, TypeError, IndexError: naming the offending argument (duplicate or out-of-range seeds,
                wrong dtypes, a malformed graph, an unknown node type).
        """
        if not self.schema.is_typed:
            return self._fused(seeds, seed)  # type: ignore[arg-type]
        by_type = seeds_by_type(seeds, input_type, self.schema.node_types)
        if not self.schema.one_type:
            return sample_hetero(self, by_type, seed, input_type)
        (node_type,), (edge_type,) = self.schema.node_types, self.schema.edge_types
        batch = self._fused(by_type[node_type], seed)
        return HeteroSampledBatch({node_type: batch.n_id}, {edge_type: batch.edge_index}, {edge_type: batch.e_id},
                                  {node_type: batch.num_sampled_nodes}, {edge_type: batch.num_sampled_edges},
                                  batch.batch_size, input_type)  # fmt: skip

    def _fused(self, seeds: torch.Tensor, seed: int) -> SampledBatch:
        """The one-type case: every hop in one call of the fused multi-hop kernel."""
        fanouts = self.fanouts if not self.schema.is_typed else next(iter(self.fanouts.values()))
        out, e_id = self._kernel.run(seeds, fanouts, seed, self.replace, self.node_keyed)
        return SampledBatch(
            n_id=out.n_id,
            edge_index=torch.stack([out.row, out.col]),
            e_id=e_id,
            num_sampled_nodes=out.num_sampled_nodes.tolist(),
            num_sampled_edges=out.num_sampled_edges.tolist(),
            batch_size=int(seeds.shape[0]),
        )

    def close(self) -> None:
        """Release the GPU copies / host registrations the ``gpu``/``uva`` placements made (nothing for ``cpu``, or
        for topologies placed by their owner)."""
        for kernel in [*self.kernels.values(), *([self.fused_kernel] if self.fused_kernel is not None else [])]:
            kernel.close()

    def __repr__(self) -> str:
        if self.schema.is_typed:
            shape = f"edge_types={len(self.schema.edge_types)}, hops={self.num_hops}"
        else:
            shape = f"num_nodes={self.num_nodes}, num_edges={self.indices.shape[0]}, fanouts={self.fanouts}"
        return (f"{type(self).__name__}({shape}, replace={self.replace}, placement={self.placement!r}, "
                f"node_keyed={self.node_keyed})")  # fmt: skip


class HeteroNeighborSampler(NeighborSampler):
    """:class:`NeighborSampler` of a typed graph, with the node types first (a constructor only, kept for its name).

    Args:
        graphs: a CSC (or a placed topology) per edge type, in sampling order.
        node_types: every node type, in order (the batch has all of them).
        fanouts: per edge type, neighbors per hop (lists of one length; ``-1`` takes all).
        options: ``replace``, ``num_threads``, ``placement``, ``device``, ``node_keyed`` as :class:`NeighborSampler`.
    """

    def __init__(
        self, graphs: Mapping[EdgeType, CSCLike], node_types: Sequence[str], fanouts: Mapping[EdgeType, Sequence[int]],
        **options: Any,
    ) -> None:  # fmt: skip
        super().__init__(graphs, fanouts=fanouts, node_types=node_types, **options)
