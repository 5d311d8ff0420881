"""Typed Python wrappers over the compiled ``torch.ops.zerocopy`` ops, with their fake implementations.

Every op is registered once in ``csrc/library.cpp``; CPU kernels live in ``csrc/ops/cpu`` and CUDA kernels
in ``csrc/ops/cuda``. The fake implementations let the ops run under ``torch.compile``/FakeTensor and are
exercised by ``torch.library.opcheck`` in the tests.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, NamedTuple, Optional, Sequence

import torch

from lightning_zerocopy._extension import WITH_CUDA  # noqa: F401  (loads _C, registering the ops)

_ops = torch.ops.zerocopy


class CSC(NamedTuple):
    """Compressed-by-destination adjacency: incoming neighbors of ``v`` are ``indices[indptr[v]:indptr[v+1]]``."""

    indptr: torch.Tensor
    indices: torch.Tensor
    edge_perm: torch.Tensor


class SampledSubgraph(NamedTuple):
    """Raw output of :func:`sample_neighbors` (local ids, PyG edge direction)."""

    n_id: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    edge_pos: torch.Tensor
    num_sampled_nodes: torch.Tensor
    num_sampled_edges: torch.Tensor


@contextlib.contextmanager
def host_threads(count: Optional[int]) -> Iterator[None]:
    """Run the CPU kernels called inside on ``count`` of torch's intra-op threads (``None``: as they are), giving
    the process its own count back after, also on an error. The count is process-wide while inside."""
    if count is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def index_dtype_for(num_nodes: int) -> torch.dtype:
    """The dtype used for node ids in ``indices``: int32 when every id fits, else int64."""
    return torch.int32 if num_nodes <= torch.iinfo(torch.int32).max else torch.int64


def build_csc(
    src: torch.Tensor,
    dst: torch.Tensor,
    num_nodes: int,
    remove_self_loops: bool = False,
    remove_duplicates: bool = False,
) -> CSC:
    """Compress the COO edges ``src -> dst`` by destination (CSC over ``edge_index[1]``).

    Args:
        src: int64 source node of every edge (``edge_index[0]``), contiguous, on the CPU.
        dst: int64 destination node of every edge (``edge_index[1]``), same length as ``src``.
        num_nodes: number of nodes; every id must be in ``[0, num_nodes)``.
        remove_self_loops: drop edges ``v -> v``.
        remove_duplicates: keep one copy of each repeated ``(src, dst)`` pair (the first in input order).

    Returns:
        :class:`CSC` with int64 ``indptr`` of length ``num_nodes + 1``, ``indices`` (int32 when ids fit,
        else int64) sorted by source within each destination, and int64 ``edge_perm`` giving each compressed
        edge's position in the input edge list.
    """
    return CSC(*_ops.build_csc(src, dst, num_nodes, remove_self_loops, remove_duplicates))


@torch.library.register_fake("zerocopy::build_csc")
def _build_csc_fake(src, dst, num_nodes, remove_self_loops, remove_duplicates):
    # Mirrors the kernel's metadata checks (csrc/ops/build_csc.cpp) so meta/fake runs fail the same way.
    for name, t in (("src", src), ("dst", dst)):
        torch._check_value(t.device.type == "cpu", lambda: f"build_csc: `{name}` must be a CPU tensor, got {t.device}")
        torch._check_type(t.dtype == torch.int64, lambda: f"build_csc: `{name}` must be int64, got {t.dtype}")
        torch._check_value(t.dim() == 1, lambda: f"build_csc: `{name}` must be 1-D, got shape {tuple(t.shape)}")
    torch._check_value(
        src.shape[0] == dst.shape[0], lambda: "build_csc: `src` and `dst` must have the same length"
    )
    torch._check_value(num_nodes >= 0, lambda: f"build_csc: `num_nodes` must be >= 0, got {num_nodes}")
    if remove_self_loops or remove_duplicates:
        num_edges = torch.library.get_ctx().new_dynamic_size()
    else:
        num_edges = src.shape[0]
    return (
        src.new_empty((num_nodes + 1,), dtype=torch.int64),
        src.new_empty((num_edges,), dtype=index_dtype_for(num_nodes)),
        src.new_empty((num_edges,), dtype=torch.int64),
    )


def sample_neighbors(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    seeds: torch.Tensor,
    fanouts: Sequence[int],
    replace: bool = False,
    seed: int = 0,
    node_keyed: bool = False,
) -> SampledSubgraph:
    """Multi-hop uniform neighbor sampling over incoming edges, as PyG's ``NeighborLoader`` does.

    Args:
        indptr: int64 CSC pointer, length ``num_nodes + 1``.
        indices: int32/int64 source ids of incoming edges.
        seeds: int64 unique target nodes of the batch.
        fanouts: neighbors per hop, ``-1`` for all.
        replace: sample with replacement.
        seed: per-batch random seed; the same inputs and seed give bitwise the same sample on any thread
            count.
        node_keyed: evaluation sampling: a target's picks are drawn from a stream keyed by (``seed``, hop, node
            id) instead of its position in the batch, and nodes are deduplicated per hop only (hop ``k``'s
            neighbors form level ``k + 1`` of ``n_id`` even when they already sit at a lower level, so ids may
            repeat and edges only run from level ``k + 1`` to level ``k``). A seed's sampled computation graph,
            and so its prediction, is then the same whatever batch it is in.

    Returns:
        :class:`SampledSubgraph` with ``n_id`` (seeds first, then each hop's new nodes in order of first
        appearance), ``row``/``col`` (local ids; messages flow ``row -> col``), ``edge_pos`` (positions in
        ``indices``) and per-hop counts.
    """
    return SampledSubgraph(
        *_ops.sample_neighbors(indptr, indices, seeds, list(fanouts), replace, seed, bool(node_keyed))
    )


@torch.library.register_fake("zerocopy::sample_neighbors")
def _sample_neighbors_fake(indptr, indices, seeds, fanouts, replace, seed, node_keyed=False):
    ctx = torch.library.get_ctx()
    num_nodes = ctx.new_dynamic_size()
    num_edges = ctx.new_dynamic_size()
    cpu = torch.device("cpu")
    return (
        seeds.new_empty((num_nodes,), dtype=torch.int64),
        seeds.new_empty((num_edges,), dtype=torch.int64),
        seeds.new_empty((num_edges,), dtype=torch.int64),
        seeds.new_empty((num_edges,), dtype=torch.int64),
        torch.empty((len(fanouts) + 1,), dtype=torch.int64, device=cpu),
        torch.empty((len(fanouts),), dtype=torch.int64, device=cpu),
    )


class PickedEdges(NamedTuple):
    """Raw output of :func:`pick_neighbors`: per picked edge, the neighbor's id, its target's position and the
    edge's position in ``indices``; the edge counts at ``target_ends`` (int64, CPU)."""

    nbr: torch.Tensor
    col: torch.Tensor
    edge_pos: torch.Tensor
    edge_ends: torch.Tensor


def pick_neighbors(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    targets: torch.Tensor,
    fanout: int,
    replace: bool = False,
    seed: int = 0,
    node_keyed: bool = False,
    target_ends: Sequence[int] = (),
) -> PickedEdges:
    """One hop of :func:`sample_neighbors` without its deduplication and relabeling: the same picks (``nbr[k]`` is
    ``n_id[row[k]]`` of ``sample_neighbors(indptr, indices, targets, [fanout], replace, seed, node_keyed)``, ``col``
    and ``edge_pos`` are its ``col`` and ``edge_pos``), without the node map of a relabel (on the CPU a dense array
    of ``num_nodes`` entries), and on a GPU with one read-back. ``targets`` need not be unique.

    Args:
        target_ends: positions in ``targets`` (non-decreasing); ``edge_ends[s]`` is the number of edges of
            ``targets[:target_ends[s]]`` (the picks come ordered by target, so a range of targets owns a range of
            edges): how a caller splits the picks by target range without another read-back.
    """
    return PickedEdges(*_ops.pick_neighbors(indptr, indices, targets, int(fanout), bool(replace), int(seed),
                                            bool(node_keyed), [int(e) for e in target_ends]))  # fmt: skip


@torch.library.register_fake("zerocopy::pick_neighbors")
def _pick_neighbors_fake(indptr, indices, targets, fanout, replace, seed, node_keyed, target_ends):
    num_edges = torch.library.get_ctx().new_dynamic_size()
    edges = [targets.new_empty((num_edges,), dtype=torch.int64) for _ in range(3)]
    return (*edges, torch.empty((len(target_ends),), dtype=torch.int64, device="cpu"))


def gather_rows(
    table: torch.Tensor,
    ids: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    *,
    sort_ids: bool = False,
    cache_slot: Optional[torch.Tensor] = None,
    cache: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Return ``table[ids]``, written into ``out`` when given (for example a pinned or GPU buffer).

    Args:
        table: 2-D row-major table (any dtype). On the CPU, or host memory registered for the GPU when
            ``ids`` and ``out`` are CUDA tensors (zero-copy), or a CUDA tensor.
        ids: int32/int64 row ids; every id must be in ``[0, table.shape[0])``.
        out: optional contiguous ``(len(ids), table.shape[1])`` tensor of ``table.dtype``; a view of a larger
            buffer is fine if it is contiguous.
        sort_ids: (CUDA) read rows in ascending id (address) order and write each back to its batch position;
            the CPU kernel reads in batch order. The result is the same either way.
        cache_slot: (CUDA only) int32 tensor on the GPU of ``ids`` with one entry per table row: the row's index
            in ``cache``, or -1.
        cache: (CUDA only) hot rows (same width and dtype as ``table``) on the GPU, read instead of ``table``.

    Returns:
        ``out`` (or a new tensor), bitwise equal to ``table[ids]``. With CUDA ids the call runs on the current
        CUDA stream and returns once the rows are written (it waits for that stream to check the ids).
    """
    if out is None:
        device = ids.device if ids.is_cuda else table.device
        out = torch.empty((ids.shape[0],) + tuple(table.shape[1:]), dtype=table.dtype, device=device)
    _ops.gather_rows_into(table, ids, out, sort_ids, cache_slot, cache)
    return out


@torch.library.register_fake("zerocopy::gather_rows_into")
def _gather_rows_into_fake(table, ids, out, sort_ids=False, cache_slot=None, cache=None):
    # Mirrors the kernels' metadata checks (csrc/ops/gather_rows.cpp); ids are range-checked only by kernels.
    op = "gather_rows_into"
    torch._check_value(table.dim() == 2, lambda: f"{op}: `table` must be 2-D, got shape {tuple(table.shape)}")
    torch._check_value(table.is_contiguous(), lambda: f"{op}: `table` must be contiguous")
    torch._check_type(
        ids.dtype in (torch.int32, torch.int64), lambda: f"{op}: `ids` must be int64 or int32, got {ids.dtype}"
    )
    torch._check_value(ids.dim() == 1, lambda: f"{op}: `ids` must be 1-D, got shape {tuple(ids.shape)}")
    torch._check_value(ids.is_contiguous(), lambda: f"{op}: `ids` must be contiguous")
    torch._check_type(
        out.dtype == table.dtype,
        lambda: f"{op}: `out` must have the dtype of `table` ({table.dtype}), got {out.dtype}",
    )
    torch._check_value(
        out.dim() == 2 and out.shape[0] == ids.shape[0] and out.shape[1] == table.shape[1],
        lambda: f"{op}: `out` must have shape (len(ids), table.shape[1]), got {tuple(out.shape)}",
    )
    torch._check_value(out.is_contiguous(), lambda: f"{op}: `out` must be contiguous")
    torch._check_value(
        out.device == ids.device,
        lambda: f"{op}: `out` must be on the device of `ids` ({ids.device}), got {out.device}",
    )
    torch._check_value(
        table.device.type == "cpu" or table.device == ids.device,
        lambda: f"{op}: `table` must be in host memory or on the device of `ids` ({ids.device}), got {table.device}",
    )
    torch._check_value(
        (cache_slot is None) == (cache is None), lambda: f"{op}: give both `cache_slot` and `cache` or neither"
    )
    if cache_slot is not None:
        torch._check_value(ids.device.type == "cuda", lambda: f"{op}: `cache_slot`/`cache` need CUDA `ids`")
        torch._check_type(
            cache_slot.dtype == torch.int32, lambda: f"{op}: `cache_slot` must be int32, got {cache_slot.dtype}"
        )
        torch._check_value(
            cache_slot.dim() == 1 and cache_slot.shape[0] == table.shape[0],
            lambda: f"{op}: `cache_slot` must have one entry per table row",
        )
        torch._check_value(
            cache.dim() == 2 and cache.shape[1] == table.shape[1] and cache.dtype == table.dtype,
            lambda: f"{op}: `cache` must be 2-D with the width and dtype of `table`",
        )
    return None


def gather_segmented(
    table: torch.Tensor,
    ids: torch.Tensor,
    location: torch.Tensor,
    slot_bits: int,
    segments: Sequence[torch.Tensor],
    out: Optional[torch.Tensor] = None,
    counts: Optional[torch.Tensor] = None,
    *,
    sort_ids: bool = False,
) -> torch.Tensor:
    """``table[ids]`` with cached rows read from ``segments`` (the shards of a GPU feature cache), in one launch.

    Args:
        table: 2-D table of every row: registered host memory (zero-copy) or a tensor on the GPU of ``ids``
            (a CPU tensor for the CPU kernel).
        ids: int32/int64 row ids; every id must be in ``[0, table.shape[0])`` (else IndexError naming it).
        location: int32/int64 lookup with one entry per table row: ``< 0`` = read from ``table``, else
            ``(segment << slot_bits) | slot`` (see :meth:`lightning_zerocopy.gather.CachePlan.build_location`).
        slot_bits: bits of the slot in ``location`` (at most 31 for int32, 62 for int64).
        segments: at most 32 2-D tensors with ``table``'s width and dtype; on CUDA each on the GPU of ``ids`` or
            on a GPU it can peer with (peer access is enabled on first use), e.g. a shard opened over CUDA IPC.
        out: optional contiguous ``(len(ids), table.shape[1])`` tensor on the device of ``ids``.
        counts: optional int64 tensor of ``len(segments) + 1`` entries on the device of ``ids``: rows served from
            each segment, then from ``table``, are added to it (on the GPU, no host sync).
        sort_ids: (CUDA) read the rows in ascending id (address) order and write each back to its batch position;
            the same result, fewer pages touched per batch in host memory.

    Returns:
        ``out`` (or a new tensor), bitwise equal to ``table[ids]`` when the segments hold the rows ``location``
        says. On CUDA it runs on the current stream and returns once the rows are written (it waits for that
        stream to check the ids). A lookup entry naming a missing segment or slot raises ValueError.
    """
    if out is None:
        device = ids.device if ids.is_cuda else table.device
        out = torch.empty((ids.shape[0],) + tuple(table.shape[1:]), dtype=table.dtype, device=device)
    _ops.gather_segmented_into(table, ids, out, location, slot_bits, list(segments), counts, sort_ids)
    return out


@torch.library.register_fake("zerocopy::gather_segmented_into")
def _gather_segmented_into_fake(table, ids, out, location, slot_bits, segments, counts=None, sort_ids=False):
    # Mirrors csrc/ops/gather_segmented.cpp; ids and lookup entries are range-checked only by the kernels.
    op = "gather_segmented_into"
    _gather_rows_into_fake(table, ids, out)
    torch._check_type(
        location.dtype in (torch.int32, torch.int64),
        lambda: f"{op}: `location` must be int64 or int32, got {location.dtype}",
    )
    torch._check_value(
        location.dim() == 1 and location.shape[0] == table.shape[0] and location.is_contiguous(),
        lambda: f"{op}: `location` must be contiguous with one entry per table row",
    )
    max_bits = 31 if location.dtype == torch.int32 else 62
    torch._check_value(1 <= slot_bits <= max_bits, lambda: f"{op}: `slot_bits` must be in [1, {max_bits}]")
    torch._check_value(len(segments) <= 32, lambda: f"{op}: at most 32 `segments` per call")
    for seg in segments:
        torch._check_value(
            seg.dim() == 2 and seg.shape[1] == table.shape[1] and seg.dtype == table.dtype and seg.is_contiguous(),
            lambda: f"{op}: every segment must be 2-D and contiguous with the width and dtype of `table`",
        )
    if counts is not None:
        torch._check_type(counts.dtype == torch.int64, lambda: f"{op}: `counts` must be int64, got {counts.dtype}")
        torch._check_value(
            counts.dim() == 1 and counts.shape[0] == len(segments) + 1,
            lambda: f"{op}: `counts` must have len(segments) + 1 entries",
        )
    return None


def negative_nodes(
    positions: torch.Tensor, num_nodes: int, seed: int, endpoint: int, cum_weight: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Node ids for negative edges, ``out[i]`` drawn from the counter-based stream keyed by
    ``(seed, endpoint, positions[i])``: the same ids on the CPU and on a GPU, whatever the order of the draws.

    Args:
        positions: int64 1-D stream counters (e.g. the position of each negative in its batch); the device of the
            draw.
        num_nodes: ids are drawn from ``[0, num_nodes)`` (``>= 1``).
        seed: the batch's 63-bit seed (e.g. a plan item's ``batch_seed``).
        endpoint: ``0`` for source nodes, ``1`` for destination nodes (separate streams).
        cum_weight: ``None`` for uniform draws, or float64 ``[num_nodes]`` inclusive prefix sums of non-negative
            per-node weights (positive total) on the device of ``positions``: node ``v`` is drawn with
            probability ``weight[v] / total``.

    Returns:
        int64 ids, the shape and device of ``positions``.
    """
    return _ops.negative_nodes(positions, num_nodes, seed, endpoint, cum_weight)


@torch.library.register_fake("zerocopy::negative_nodes")
def _negative_nodes_fake(positions, num_nodes, seed, endpoint, cum_weight=None):
    torch._check_type(
        positions.dtype == torch.int64, lambda: f"negative_nodes: `positions` must be int64, got {positions.dtype}"
    )
    torch._check_value(positions.dim() == 1, lambda: "negative_nodes: `positions` must be 1-D")
    torch._check_value(num_nodes >= 1, lambda: f"negative_nodes: `num_nodes` must be >= 1, got {num_nodes}")
    torch._check_value(endpoint in (0, 1), lambda: f"negative_nodes: `endpoint` must be 0 or 1, got {endpoint}")
    if cum_weight is not None:
        torch._check_type(cum_weight.dtype == torch.float64, lambda: "negative_nodes: `cum_weight` must be float64")
        torch._check_value(cum_weight.dim() == 1 and cum_weight.shape[0] == num_nodes,
                           lambda: "negative_nodes: `cum_weight` must have one entry per node")  # fmt: skip
    return torch.empty_like(positions)


def _require_cuda_build(op: str) -> None:
    if not WITH_CUDA:
        raise RuntimeError(
            f"{op}: lightning_zerocopy._C was built without its CUDA kernels; rebuild it on a machine with CUDA "
            "and nvcc (pip install --no-build-isolation -e .)"
        )


def cuda_ipc_handle(tensor: torch.Tensor) -> tuple[bytes, int]:
    """The CUDA IPC memory handle of the allocation holding ``tensor`` (a non-empty, contiguous CUDA tensor made by
    torch's allocator) and the byte offset of its first element in that allocation. Exports no event and writes no
    file (see :mod:`lightning_zerocopy.graph.cuda_ipc`, which is what to use)."""
    _require_cuda_build("cuda_ipc_handle")
    handle, offset = _ops.cuda_ipc_handle(tensor)
    return bytes(handle.numpy().tobytes()), int(offset)


def cuda_ipc_open(ipc: bytes, offset: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """``nbytes`` bytes from ``offset`` of the allocation that another process exported as ``ipc``, as a uint8
    tensor mapped for (and labelled with) the reading GPU ``device``; the memory may live on a peer GPU. The
    mapping closes when the last tensor over it is freed."""
    _require_cuda_build("cuda_ipc_open")
    torch.cuda.init()  # the caching allocator, which opens the handle, exists once torch's CUDA state is initialized
    raw = torch.frombuffer(bytearray(ipc), dtype=torch.uint8)
    return _ops.cuda_ipc_open(raw, int(offset), int(nbytes), torch.device(device))


# ---- the CUDA sampler's process-wide switches (benchmarks and tests compare its paths; no tensors, no fakes) ----

#: The order of ``zerocopy::sampler_graph_stats``'s counters.
SAMPLER_GRAPH_COUNTERS = ("captures", "replays", "failures", "evictions", "cached")


def set_lean_sampler(enabled: bool) -> bool:
    """Whether CUDA sampler batches with every fanout >= 1 take the lean path (one read-back per batch; off: the
    per-hop path). Process-wide; returns the previous setting. CUDA builds only."""
    _require_cuda_build("set_lean_sampler")
    return bool(_ops.set_lean_sampler(bool(enabled)))


def set_sampler_graphs(enabled: bool) -> bool:
    """Whether lean CUDA sampler batches replay a CUDA graph captured per batch shape (off: their kernels launch
    directly; ``LZC_SAMPLER_GRAPHS=0`` in the environment starts a process with it off). Process-wide; returns the
    previous setting. CUDA builds only."""
    _require_cuda_build("set_sampler_graphs")
    return bool(_ops.set_sampler_graphs(bool(enabled)))


def sampler_graph_stats() -> dict[str, int]:
    """The CUDA sampler's graph-path counters since the process started: shapes captured, batches sampled by a
    replay, failed captures, graphs evicted, graphs held now (:data:`SAMPLER_GRAPH_COUNTERS`). CUDA builds only."""
    _require_cuda_build("sampler_graph_stats")
    return dict(zip(SAMPLER_GRAPH_COUNTERS, (int(v) for v in _ops.sampler_graph_stats())))
