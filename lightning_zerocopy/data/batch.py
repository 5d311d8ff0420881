"""``build_batch``: one plan item -> one PyG ``Data`` mini-batch, exactly as ``NeighborLoader`` yields it.

A :class:`BatchBuilder` is made of picklable handles (graph, features, labels, optional edge features) and
the sampling options; it carries no data, so it can be sent to another local process (a pipeline worker, a
DDP rank) and opened there with :meth:`BatchBuilder.open`, which maps the same host memory by name.

The batch has PyG ``NeighborLoader``'s fields and conventions:

* ``n_id``: global ids of the sampled nodes, the ``batch_size`` seeds first;
* ``edge_index``: local ids, messages flow ``edge_index[0] -> edge_index[1]`` (neighbor -> target);
* ``x = features[n_id]``, ``y = labels[n_id]`` (every sampled node, as ``NeighborLoader`` slices ``y``);
* ``e_id``: ids of the sampled edges in the dataset's ``edge_index``, ``edge_attr = edge_attr[e_id]``;
* ``batch_size``, ``input_id`` (positions of the seeds in the split), ``num_sampled_nodes``/``_edges``.

Where a batch is built (the GPU data path)
------------------------------------------
``sampler_placement`` (``cpu`` | ``uva`` | ``gpu`` | ``hybrid`` | ``auto``) says where neighbors are sampled and ``gather`` (``cpu`` |
``zerocopy``) how feature rows are fetched. With ``gather="cpu"`` and the CPU sampler the batch is built in
host memory (the trainer moves it). Otherwise the whole batch is built on the GPU, on the current CUDA stream
(a pipeline may run it on a side stream):

* CPU sampler: the C++ threads sample, then ``n_id``/``edge_index``/``e_id``/``input_id`` go to the GPU in one
  pinned, non-blocking copy;
* ``uva``/``gpu`` sampler: the seeds go to the GPU (pinned, non-blocking) and the CUDA kernel samples there,
  reading the topology from registered host memory (``uva``) or a GPU copy (``gpu``);
* ``hybrid``/``auto``: each batch takes one of the two paths above (CPU threads, or the ``gpu`` kernel), where a
  calibrated cost model expects it to finish first (:mod:`lightning_zerocopy.data.hybrid_sampling`); the batch is
  the same either way, and the gather below does not depend on where it was sampled;
* ``gather="zerocopy"``: :class:`~lightning_zerocopy.gather.cuda_table.CudaFeatureTable` reads the rows of
  ``n_id`` straight from the registered host feature table into the GPU (into ``out["x"]`` when that is a
  CUDA buffer: no host staging), optionally serving the ``hot_rows`` most frequently sampled rows from a GPU
  cache; edge features likewise;
* labels: a GPU copy made once at ``open()`` in the smallest integer dtype that holds every label (1-2 bytes
  per node for usual class counts, e.g. 100-200 MB for 100M nodes), gathered with ``index_select`` and widened
  to int64. That is cheaper than a zero-copy read per node (an 8-byte row per PCIe transaction and a page
  translation each) and costs a fraction of what the feature rows cost.

Node order (``HostGraphHandles.node_order``)
--------------------------------------------
The host memory may hold the graph, feature rows and labels renumbered into a locality-preserving *internal*
order (``ZeroCopyDataModule(node_order="bfs" | "degree")``): nodes sampled together then sit on the same
memory pages, which is what the zero-copy gather is bound by. The renumbering is invisible in the batch: the
plan's seed ids (original ids) are mapped to internal ids before sampling (``rank``, on the CPU), sampling
and the feature/label gathers run on internal ids, and ``n_id`` is mapped back to original ids (``order``)
on the device the batch is built on, where a copy of ``order`` is placed once. So ``n_id``, ``x``, ``y``,
``e_id`` (edges keep their positions in the dataset's ``edge_index``) and ``input_id`` mean exactly what
they mean without a node order; only which neighbors are drawn differs (the sampler's random streams are
keyed by frontier position and a target's neighbor list is ordered by internal id), with the same
distribution.

GPU resources (host registrations, the hot-row cache, the label copy, the GPU/UVA topology) are created in
the process that builds, on :meth:`BatchBuilder.open` (or the first batch), shared by the builders of one
process that read the same memory with the same options (e.g. train and eval builders with different
fanouts), and released by :meth:`BatchBuilder.close`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional, Sequence

import torch
from torch_geometric.data import Data

from lightning_zerocopy.data.hybrid_sampling import HybridSampling, cuda_usable, gpu_lane_placement
from lightning_zerocopy.data.plan import PlanItem
from lightning_zerocopy.gather.host_table import FeatureTableHandle, HostFeatureTable
from lightning_zerocopy.graph.csc import CSCGraph, CSCGraphHandle
from lightning_zerocopy.graph.shared_memory import SharedTensorHandle, TensorHandle
from lightning_zerocopy.sampling.hybrid import HybridPolicy
from lightning_zerocopy.sampling.neighbor_sampler import NeighborSampler, SampledBatch, validate_fanouts

__all__ = [
    "BatchBuilder",
    "GatherBackend",
    "GatherMode",
    "HostGraphHandles",
    "NodeOrderHandles",
    "NodeOrderKind",
    "SampledItem",
    "SamplerPlacement",
    "hot_row_ids",
    "max_sampled_nodes",
]

#: Where neighbors are sampled: compiled CPU kernel, CUDA kernel over host topology (UVA), CUDA kernel over a
#: GPU copy of the topology, or per batch on whichever of the CPU threads and the GPU copy is expected to finish
#: first (``hybrid``; ``auto``: hybrid where that measures faster, else the faster of the two).
SamplerPlacement = Literal["cpu", "uva", "gpu", "hybrid", "auto"]
#: How feature rows are fetched: CPU threads (``cpu``) or the GPU reading registered host memory (``zerocopy``).
GatherBackend = Literal["cpu", "zerocopy"]
#: Read order of the zero-copy gather (see ``CudaFeatureTable``): measured choice, batch order, address order.
GatherMode = Literal["auto", "direct", "sorted"]

#: Layout of node ids in host memory: the dataset's own ids, or a locality-preserving internal order
#: (see :mod:`lightning_zerocopy.graph.reorder`).
NodeOrderKind = Literal["none", "bfs", "degree"]

_PLACEMENTS = ("cpu", "uva", "gpu", "hybrid", "auto")
_GATHERS = ("cpu", "zerocopy")
_GATHER_MODES = ("auto", "direct", "sorted")
_COUNT_CHUNK = 1 << 26  # edges per bincount chunk when choosing hot rows (bounds the int64 temporary)


@dataclass(frozen=True)
class NodeOrderHandles:
    """Picklable names of the node renumbering the host memory is stored in (no data).

    Attributes:
        kind: how the order was computed (``"bfs"`` or ``"degree"``).
        order: int64 ``[num_nodes]``, ``order[internal_id] = original_id`` (maps a batch's ``n_id`` back).
        rank: int64 ``[num_nodes]``, ``rank[original_id] = internal_id`` (maps the plan's seeds in).
    """

    kind: str
    order: TensorHandle
    rank: TensorHandle

    def unlink(self) -> None:
        """Remove the names of the shared segments (files on disk are kept); mappings stay valid."""
        for handle in (self.order, self.rank):
            if isinstance(handle, SharedTensorHandle):
                handle.unlink()


@dataclass(frozen=True)
class HostGraphHandles:
    """Picklable names of everything a batch is built from (no data).

    Attributes:
        graph: the CSC graph.
        features: the node feature table.
        labels: int64 labels of every node.
        splits: int64 node ids of each split (``"train"``, ``"val"``, ``"test"``), always original ids.
        edge_attr: edge features in the dataset's edge order, if the dataset has them.
        node_order: the renumbering ``graph``, ``features`` and ``labels`` are stored in, or ``None`` when
            they use the dataset's ids. Splits, ``edge_attr`` and the graph's edge ids (``edge_perm``) are
            never renumbered, and :class:`BatchBuilder` yields original ids either way.
    """

    graph: CSCGraphHandle
    features: FeatureTableHandle
    labels: TensorHandle
    splits: Mapping[str, TensorHandle]
    edge_attr: Optional[TensorHandle] = None
    node_order: Optional[NodeOrderHandles] = None

    def unlink(self) -> None:
        """Remove the names of every shared segment (files on disk are kept); mappings stay valid."""
        self.graph.unlink()
        self.features.unlink()
        if self.node_order is not None:
            self.node_order.unlink()
        for handle in (self.labels, self.edge_attr, *self.splits.values()):
            if isinstance(handle, SharedTensorHandle):
                handle.unlink()


def max_sampled_nodes(batch_size: int, fanouts: Sequence[int], num_nodes: int) -> int:
    """An upper bound on ``len(n_id)`` of a batch: ``batch_size * prod(1 + fanout)``, capped at ``num_nodes``.

    Useful to size preallocated ``out`` buffers; a fanout of ``-1`` gives ``num_nodes``.
    """
    if any(f < 0 for f in fanouts):
        return num_nodes
    bound, frontier = batch_size, batch_size
    for fanout in fanouts:
        frontier *= fanout
        bound += frontier
        if bound >= num_nodes:
            return num_nodes
    return min(bound, num_nodes)


def hot_row_ids(indices: torch.Tensor, num_nodes: int, count: int) -> torch.Tensor:
    """The ``count`` nodes that appear most often in ``indices`` (the CSC neighbor array), most frequent first.

    A node enters a sampled batch as a neighbor in proportion to how often it is some node's in-neighbor, so
    these are the rows a GPU hot-row cache should hold. Counts in chunks, so a graph with billions of edges
    needs no int64 copy of ``indices``; runs on the device of ``indices``. Returns int64 ids (on that device).
    """
    if count < 0:
        raise ValueError(f"`count` must be >= 0, got {count}")
    count = min(int(count), int(num_nodes))
    counts = torch.zeros(num_nodes, dtype=torch.int64, device=indices.device)
    for start in range(0, indices.numel(), _COUNT_CHUNK):
        counts += torch.bincount(indices[start : start + _COUNT_CHUNK].long(), minlength=num_nodes)
    return torch.topk(counts, count, sorted=True).indices


def _compact_int_dtype(values: torch.Tensor) -> torch.dtype:
    """The smallest signed integer dtype holding every entry of ``values`` (int64 for an empty tensor)."""
    if values.numel() == 0:
        return torch.int64
    lo, hi = int(values.min()), int(values.max())
    for dtype in (torch.int8, torch.int16, torch.int32):
        info = torch.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return dtype
    return torch.int64


@dataclass(frozen=True)
class SampledItem:
    """A sampled but not yet gathered batch (:meth:`BatchBuilder.sample_batch`), on the device it is built on.

    Attributes:
        item: the plan item it was sampled for.
        sample: the sampled structure; ``n_id`` holds *internal* ids (rows of the host memory), which
            :meth:`BatchBuilder.gather_batch` maps back to the dataset's ids.
        input_id: positions of the seeds in their split, on the same device.
    """

    item: PlanItem
    sample: SampledBatch
    input_id: torch.Tensor


class BatchBuilder:
    """Builds PyG ``Data`` mini-batches from plan items; picklable, opened lazily in each process.

    Every option is plain data, so the builder pickles to another process; what the options mean on this
    machine (the CUDA device, registrations, caches) is decided by :meth:`open` in the process that builds.

    Args:
        handles: where the graph, features and labels live (and the node order they are stored in, if any:
            batches are in the dataset's ids either way).
        fanouts: neighbors per hop, e.g. ``[15, 10, 5]``; ``-1`` takes all neighbors.
        replace: sample with replacement.
        num_threads: threads of the CPU sampling kernel; ``None`` uses ``torch.get_num_threads()``.
        sampler_placement: where neighbors are sampled: ``"cpu"`` (C++ threads), ``"uva"`` (CUDA kernel reading
            the topology from registered host memory), ``"gpu"`` (CUDA kernel, topology copied to the GPU),
            ``"hybrid"`` (per batch, C++ threads or the ``"gpu"`` kernel, whichever a cost model calibrated on
            measured times expects to finish first; a pipeline producer runs both at once) or ``"auto"`` (hybrid
            if both devices together measure faster, else the faster one). Every placement gives bitwise the CPU
            placement's sample for the same plan item. Without a usable CUDA device ``hybrid``/``auto`` warn once
            and sample on the CPU.
        gather: how feature (and edge-feature) rows are fetched: ``"cpu"`` (CPU threads) or ``"zerocopy"`` (the
            GPU reads the rows from registered host memory). With ``"cpu"`` and a CPU sampler the batch is built
            in host memory; any other combination builds it on the GPU.
        gather_mode: read order of the zero-copy gather: ``"auto"`` (time both on the first batches, keep the
            faster), ``"direct"`` (batch order) or ``"sorted"`` (address order).
        hot_rows: number of feature rows to keep in GPU memory (``hot_rows * num_features * dtype size``
            bytes): the nodes that appear most often as in-neighbors, i.e. that sampling picks most often.
            ``0`` = no cache. Needs ``gather="zerocopy"``; capped at the number of nodes.
        device: CUDA device index that builds the batches; ``None`` = the current device of the process (or
            thread) that calls :meth:`open`.

    Raises:
        ValueError / TypeError: an option is invalid (the message names it).
    """

    def __init__(
        self,
        handles: HostGraphHandles,
        fanouts: Sequence[int],
        replace: bool = False,
        num_threads: Optional[int] = None,
        *,
        sampler_placement: SamplerPlacement = "cpu",
        gather: GatherBackend = "cpu",
        gather_mode: GatherMode = "auto",
        hot_rows: int = 0,
        device: Optional[int] = None,
    ) -> None:
        if sampler_placement not in _PLACEMENTS:
            raise ValueError(f"`sampler_placement` must be one of {', '.join(map(repr, _PLACEMENTS))}, got {sampler_placement!r}")
        if gather not in _GATHERS:
            raise ValueError(f"`gather` must be 'cpu' or 'zerocopy', got {gather!r}")
        if gather_mode not in _GATHER_MODES:
            raise ValueError(f"`gather_mode` must be 'auto', 'direct' or 'sorted', got {gather_mode!r}")
        if isinstance(hot_rows, bool) or not isinstance(hot_rows, int):
            raise TypeError(f"`hot_rows` must be an int (a number of rows), got {type(hot_rows).__name__}")
        if hot_rows < 0:
            raise ValueError(f"`hot_rows` must be >= 0, got {hot_rows}")
        if hot_rows > 0 and gather != "zerocopy":
            raise ValueError(f"`hot_rows`={hot_rows} caches rows for the zero-copy gather: set gather='zerocopy'")
        if device is not None and (isinstance(device, bool) or not isinstance(device, int) or device < 0):
            raise ValueError(f"`device` must be a CUDA device index >= 0 or None, got {device!r}")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"`num_threads` must be >= 1 or None, got {num_threads}")
        self.handles = handles
        self.fanouts = validate_fanouts(list(fanouts))
        self.replace = bool(replace)
        self.num_threads = num_threads
        self.sampler_placement: SamplerPlacement = sampler_placement
        self.gather: GatherBackend = gather
        self.gather_mode: GatherMode = gather_mode
        self.hot_rows = int(hot_rows)
        self.device_index = device
        cuda, why = cuda_usable() if sampler_placement in ("hybrid", "auto") else (True, "")
        #: placement of the CUDA sampler ("cpu": none); a hybrid builder's GPU side, decided here for this machine
        self.gpu_sampler_placement = gpu_lane_placement(sampler_placement, cuda)
        self.hybrid_lanes: Optional[tuple[str, ...]] = None
        hybrid = HybridSampling.for_placement(sampler_placement, self.fanouts, self.replace, cuda, why)
        if hybrid is not None:
            self.hybrid_lanes = hybrid.lanes
        self._host: Optional[_Host] = None
        self._gpu: Optional[_GpuBuilder] = None

    # ---- lifecycle ---------------------------------------------------------------------------------------

    @property
    def on_gpu(self) -> bool:
        """Whether batches are built on a CUDA device (any GPU placement or the zero-copy gather)."""
        return self.gather == "zerocopy" or self.gpu_sampler_placement != "cpu"

    @property
    def device(self) -> torch.device:
        """The device batches are built on: ``cpu``, or the CUDA device resolved by :meth:`open`.

        Raises:
            RuntimeError: a GPU builder that is not open yet (its device is decided by :meth:`open`).
        """
        if not self.on_gpu:
            return torch.device("cpu")
        if self._gpu is None:
            raise RuntimeError("the CUDA device of a GPU BatchBuilder is decided by open(); call open() first")
        return self._gpu.state.device

    def map_host(self) -> "BatchBuilder":
        """Map the host memory named by the handles in this process (idempotent; no CUDA work). Returns ``self``.

        Do it while the shared segments still have names; the GPU side can be set up later by :meth:`open`
        (or the first :meth:`build_batch`) in the process that builds.
        """
        if self._host is None:
            graph = self.handles.graph.open()
            node_order = self.handles.node_order
            self._host = _Host(
                graph=graph,
                sampler=NeighborSampler(graph, fanouts=self.fanouts, replace=self.replace, num_threads=self.num_threads),
                hybrid=None if self.hybrid_lanes is None else HybridSampling(
                    self.sampler_placement, self.hybrid_lanes, self.fanouts, self.replace),  # type: ignore[arg-type]
                features=self.handles.features.open(),
                labels=self.handles.labels.open(),
                edge_attr=None if self.handles.edge_attr is None else self.handles.edge_attr.open(),
                order=None if node_order is None else node_order.order.open(),
                rank=None if node_order is None else node_order.rank.open(),
            )
        return self

    def open(self) -> "BatchBuilder":
        """Map the host memory and, for a GPU builder, set up its CUDA side on the chosen device (idempotent).

        The CUDA side: host registrations for zero-copy reads, the label copy, the hot-row cache, the GPU/UVA
        topology. It is shared with other open builders of this process over the same memory and options.

        Raises:
            RuntimeError: a GPU builder without a usable CUDA device or without the CUDA kernels, or pinning
                the host memory failed (the message names the memlock limit).
        """
        self.map_host()
        if self.on_gpu and self._gpu is None:
            assert self._host is not None
            device = _resolve_device(self)
            state = _DeviceState.acquire(self, self._host, device)
            try:
                sampler = None
                if self.gpu_sampler_placement != "cpu":
                    indptr, indices, edge_perm = state.topology  # type: ignore[misc]
                    sampler = NeighborSampler(
                        indptr, indices, edge_perm, fanouts=self.fanouts, replace=self.replace,
                        placement=self.gpu_sampler_placement, device=device,
                    )  # fmt: skip
            except BaseException:
                state.release()
                raise
            self._gpu = _GpuBuilder(state=state, sampler=sampler)
        return self

    def close(self) -> None:
        """Release this builder's GPU resources (host registrations once no other builder of this process uses
        them) and its host mappings. Idempotent; a later :meth:`open` maps the memory again by name."""
        gpu, self._gpu = self._gpu, None
        host, self._host = self._host, None
        if host is not None and host.hybrid is not None:
            host.hybrid.close()
        if gpu is not None:
            if gpu.sampler is not None:
                gpu.sampler.close()
            gpu.state.release()

    @property
    def is_open(self) -> bool:
        """Whether the host memory is mapped in this process (and, for a GPU builder, the CUDA side set up)."""
        return self._host is not None and (self._gpu is not None or not self.on_gpu)

    @property
    def num_nodes(self) -> int:
        return self.handles.graph.num_nodes

    @property
    def node_order(self) -> NodeOrderKind:
        """The internal node order of the host memory (``"none"``: the dataset's ids); batches use original ids."""
        order = self.handles.node_order
        return "none" if order is None else order.kind  # type: ignore[return-value]

    def max_nodes(self, batch_size: int) -> int:
        """Upper bound on the sampled nodes of a batch with ``batch_size`` seeds (see :func:`max_sampled_nodes`)."""
        return max_sampled_nodes(batch_size, self.fanouts, self.num_nodes)

    # ---- building ----------------------------------------------------------------------------------------

    def build_batch(self, item: PlanItem, out: Optional[Mapping[str, torch.Tensor]] = None) -> Data:
        """Sample the neighborhood of ``item.seed_ids`` and gather its features and labels.

        The same as ``gather_batch(sample_batch(item), out)``: a pipeline runs the two stages one batch apart.

        Args:
            item: the plan item (seed ids, their positions in the split, the batch's sampler seed).
            out: optional preallocated buffers, by field: ``"x"`` (``[rows, num_features]`` of the feature
                dtype), ``"y"`` (``[rows]`` int64), ``"edge_attr"`` (``[rows, ...]``). Each buffer must have
                at least as many rows as the batch needs; the batch's tensor is then the view ``buf[:n]``.
                Buffers on the device the batch is built on (:attr:`device`; a CUDA buffer for a GPU builder)
                are written in place; a buffer on another device is left alone and that field is returned
                as a new tensor.

        Returns:
            A ``torch_geometric.data.Data`` with ``x``, ``edge_index``, ``y``, ``n_id``, ``e_id``,
            ``batch_size``, ``input_id``, ``num_sampled_nodes``, ``num_sampled_edges`` (and ``edge_attr`` when
            the graph has edge features), as PyG's ``NeighborLoader`` yields; on :attr:`device`.
        """
        return self.gather_batch(self.sample_batch(item), out)

    def sample_batch(self, item: PlanItem, lane: Optional[str] = None) -> "SampledItem":
        """First stage of :meth:`build_batch`: sample the neighborhood of ``item.seed_ids``.

        Needs no output buffer, so a pipeline can sample batch ``t + 2`` while batch ``t + 1`` is gathered into
        its slot. A GPU builder samples on the current CUDA stream of its device and leaves the structure there
        (a caller that gathers on another stream makes that stream wait for this one first).

        Args:
            item: the plan item.
            lane: for a hybrid builder, the device to sample on (one of :attr:`hybrid_lanes`; a pipeline's
                dispatcher names it); ``None`` lets the builder's own cost model pick. The sample is the same.

        Raises:
            IndexError: a seed id outside the graph.
            ValueError: ``lane`` is not one of this builder's devices.
        """
        if not self.is_open:
            self.open()
        host = self._host
        assert host is not None
        if lane is not None and lane not in (self.hybrid_lanes or ()):
            raise ValueError(f"`lane` must be one of this builder's sampling devices {self.hybrid_lanes}, got {lane!r}")
        if host.hybrid is not None and lane is None:
            return host.hybrid.run(self.expected_size(item), lambda chosen: self.sample_batch(item, lane=chosen))
        seed_ids = host.internal_ids(item.seed_ids)
        if not self.on_gpu:
            return SampledItem(item, host.sampler.sample(seed_ids, seed=item.batch_seed), item.input_id)
        gpu = self._gpu
        assert gpu is not None
        device = gpu.state.device
        with torch.cuda.device(device):  # the current stream of that device: a caller's side stream is kept
            if gpu.sampler is None or lane == "cpu":  # CPU sampler, then the ids go over in one pinned copy
                sample = host.sampler.sample(seed_ids, seed=item.batch_seed)
                n_id, edge_index, e_id, input_id = _to_device_packed(
                    [sample.n_id, sample.edge_index, sample.e_id, item.input_id], device
                )
                sample = SampledBatch(n_id, edge_index, e_id, sample.num_sampled_nodes, sample.num_sampled_edges,
                                      sample.batch_size)  # fmt: skip
            else:
                seeds, input_id = _to_device_packed([seed_ids, item.input_id], device)
                sample = gpu.sampler.sample(seeds, seed=item.batch_seed)
        return SampledItem(item, sample, input_id)

    def expected_size(self, item: PlanItem) -> float:
        """Expected sampled edges of the batch of ``item`` (the hybrid cost models' size; a sum over its seeds).

        Raises:
            RuntimeError: the builder is not hybrid (``sampler_placement`` ``hybrid``/``auto`` with a GPU).
        """
        host = self.map_host()._host  # the estimate needs the host graph only
        assert host is not None
        if host.hybrid is None:
            raise RuntimeError(f"expected_size() is for hybrid builders; this one samples on {self.gpu_sampler_placement!r}")
        return host.hybrid.expected_size(host.graph, host.internal_ids(item.seed_ids))

    def hybrid_policy(self) -> Optional[Any]:
        """A fresh :class:`~lightning_zerocopy.sampling.HybridPolicy` over this builder's devices for a pipeline
        producer that samples batches ahead on all of them, or ``None`` for a single-device builder."""
        if self.hybrid_lanes is None:
            return None
        return HybridPolicy(self.hybrid_lanes, mode=self.sampler_placement)  # type: ignore[arg-type]

    @property
    def sampling_stats(self) -> Optional[Any]:
        """Where this builder's own cost model placed the batches it sampled (hybrid builders used directly)."""
        host = self._host
        return None if host is None or host.hybrid is None else host.hybrid.stats

    def gather_batch(self, sampled: "SampledItem", out: Optional[Mapping[str, torch.Tensor]] = None) -> Data:
        """Second stage of :meth:`build_batch`: gather the features, labels (and edge features) of a sample.

        Args:
            sampled: what :meth:`sample_batch` returned (in this process, for this builder).
            out: preallocated buffers, as in :meth:`build_batch`.
        """
        if not self.is_open:
            self.open()
        if self.on_gpu:
            return self._gather_gpu(sampled, out or {})
        return self._gather_host(sampled, out or {})

    def _gather_host(self, sampled: "SampledItem", out: Mapping[str, torch.Tensor]) -> Data:
        host = self._host
        assert host is not None
        cpu = torch.device("cpu")
        sample = sampled.sample
        n_id = sample.n_id  # internal ids: rows of the host feature table and labels
        x = host.features.gather(n_id, out=_rows(out, "x", n_id.numel(), cpu))
        y_out = _rows(out, "y", n_id.numel(), cpu)
        y = torch.index_select(host.labels, 0, n_id, out=y_out) if y_out is not None else host.labels[n_id]
        if host.order is not None:
            n_id = torch.index_select(host.order, 0, n_id)
        data = _data(x, sample.edge_index, y, n_id, sample.e_id, sampled.input_id, sample)
        if host.edge_attr is not None:
            attr_out = _rows(out, "edge_attr", sample.e_id.numel(), cpu)
            if attr_out is not None:
                torch.index_select(host.edge_attr, 0, sample.e_id, out=attr_out)
                data.edge_attr = attr_out
            else:
                data.edge_attr = host.edge_attr[sample.e_id]
        return data

    def _gather_gpu(self, sampled: "SampledItem", out: Mapping[str, torch.Tensor]) -> Data:
        host, gpu = self._host, self._gpu
        assert host is not None and gpu is not None
        state = gpu.state
        device = state.device
        sample = sampled.sample
        n_id, edge_index, e_id = sample.n_id, sample.edge_index, sample.e_id
        with torch.cuda.device(device):
            rows = n_id.numel()
            x_out = _rows(out, "x", rows, device)
            if state.features is not None:
                x = state.features.gather(n_id, out=x_out)
            else:  # CPU gather of GPU-sampled ids: the ids come back, the rows go over pinned
                x = _host_gather_to(host.features.data, n_id, x_out, device)
            y_out = _rows(out, "y", rows, device)
            y_small = torch.index_select(state.labels, 0, n_id)
            y = y_out.copy_(y_small) if y_out is not None else y_small.to(torch.int64)
            if state.order is not None:  # internal -> original ids, on the GPU
                n_id = torch.index_select(state.order, 0, n_id).to(torch.int64)
            data = _data(x, edge_index, y, n_id, e_id, sampled.input_id, sample)
            if host.edge_attr is not None:
                attr_out = _rows(out, "edge_attr", e_id.numel(), device)
                shape = (e_id.numel(), *host.edge_attr.shape[1:])
                if state.edge_attr is not None:
                    flat = None if attr_out is None else attr_out.view(e_id.numel(), state.edge_attr.dim)
                    data.edge_attr = state.edge_attr.gather(e_id, out=flat).view(shape)
                else:
                    data.edge_attr = _host_gather_to(host.edge_attr, e_id, attr_out, device)
        return data

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_host"] = None  # handles only: the receiving process maps the memory itself
        state["_gpu"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"BatchBuilder(num_nodes={self.num_nodes}, fanouts={self.fanouts}, replace={self.replace}, "
            f"sampler_placement={self.sampler_placement!r}, gather={self.gather!r}, gather_mode={self.gather_mode!r}, "
            f"hot_rows={self.hot_rows}, node_order={self.node_order!r}, device={self.device_index}, "
            f"open={self.is_open})"
        )


@dataclass
class _Host:
    graph: CSCGraph
    sampler: NeighborSampler
    features: HostFeatureTable
    labels: torch.Tensor
    edge_attr: Optional[torch.Tensor]
    order: Optional[torch.Tensor] = None  # internal -> original id (None: no node order)
    rank: Optional[torch.Tensor] = None  # original -> internal id
    hybrid: Optional[HybridSampling] = None  # hybrid builders: size estimate and the serial placement policy

    def internal_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Internal ids of original node ids (the ids themselves without a node order); checked, on the CPU.

        Raises:
            IndexError: an id outside ``[0, num_nodes)`` (it would otherwise wrap around or read past the map).
        """
        if self.rank is None:
            return ids
        ids = ids.to(device="cpu", dtype=torch.int64)
        if ids.numel() > 0:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.rank.numel():
                bad = lo if lo < 0 else hi
                raise IndexError(f"seed node id {bad} is out of range for a graph of {self.rank.numel()} nodes")
        return torch.index_select(self.rank, 0, ids)


@dataclass
class _GpuBuilder:
    state: "_DeviceState"
    sampler: Optional[NeighborSampler]  # None: the CPU sampler of the host side


def _resolve_device(builder: BatchBuilder) -> torch.device:
    from lightning_zerocopy import WITH_CUDA

    what = f"BatchBuilder(sampler_placement={builder.sampler_placement!r}, gather={builder.gather!r})"
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} builds batches on a CUDA GPU, but none is available; use 'cpu' for both")
    if not WITH_CUDA:
        raise RuntimeError(
            f"{what} needs the CUDA kernels, but lightning_zerocopy._C was built without them; rebuild on a CUDA "
            "machine (FORCE_CUDA=1 python setup.py build_ext --inplace) or use 'cpu' for both"
        )
    index = torch.cuda.current_device() if builder.device_index is None else builder.device_index
    if index >= torch.cuda.device_count():
        raise RuntimeError(f"BatchBuilder(device={index}) but this process sees {torch.cuda.device_count()} GPU(s)")
    return torch.device("cuda", index)


@dataclass
class _DeviceState:
    """The CUDA side of open GPU builders over one host memory and one set of options, in one process."""

    key: tuple
    device: torch.device
    labels: torch.Tensor  # compact integer copy on the GPU
    order: Optional[torch.Tensor] = None  # internal -> original id on the GPU (int32 where ids fit), node order only
    features: Optional[Any] = None  # CudaFeatureTable when gather == "zerocopy"
    edge_attr: Optional[Any] = None  # CudaFeatureTable over edge_attr viewed (E, -1), when gather == "zerocopy"
    topology: Optional[tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]] = None
    registrations: list = field(default_factory=list)
    refs: int = 1

    @classmethod
    def acquire(cls, builder: BatchBuilder, host: _Host, device: torch.device) -> "_DeviceState":
        h = builder.handles
        key = (h.graph, h.features, h.labels, h.edge_attr, h.node_order, device.index, builder.gpu_sampler_placement,
               builder.gather, builder.gather_mode, builder.hot_rows)  # fmt: skip
        with _REGISTRY_LOCK:
            state = _REGISTRY.get(key)
            if state is not None:
                state.refs += 1
                return state
            state = cls._create(key, builder, host, device)
            _REGISTRY[key] = state
            return state

    @classmethod
    def _create(cls, key: tuple, builder: BatchBuilder, host: _Host, device: torch.device) -> "_DeviceState":
        from lightning_zerocopy.gather.cuda_table import CudaFeatureTable, register_host_tensor

        labels = host.labels.to(_compact_int_dtype(host.labels))
        with torch.cuda.device(device):
            state = cls(key=key, device=device, labels=labels.to(device))
            try:
                if host.order is not None:  # placed once; n_id is mapped back on the GPU
                    fits32 = host.order.numel() - 1 <= torch.iinfo(torch.int32).max
                    state.order = host.order.to(torch.int32 if fits32 else torch.int64).to(device)
                graph = host.graph
                if builder.gpu_sampler_placement == "gpu":
                    state.topology = (
                        graph.indptr.to(device),
                        graph.indices.to(device),
                        None if graph.edge_perm is None else graph.edge_perm.to(device),
                    )
                elif builder.gpu_sampler_placement == "uva":
                    for tensor, name in ((graph.indices, "indices"), (graph.edge_perm, "edge_perm")):
                        if tensor is not None:
                            state.registrations.append(_register(register_host_tensor, tensor, name))
                    state.topology = (graph.indptr.to(device), graph.indices, graph.edge_perm)
                if builder.gather == "zerocopy":
                    hot = None
                    if builder.hot_rows > 0:
                        indices = state.topology[1] if state.topology is not None else graph.indices
                        hot = hot_row_ids(indices, graph.num_nodes, builder.hot_rows)
                    table = host.features.data
                    state.registrations.append(_register(register_host_tensor, table, "features"))
                    state.features = CudaFeatureTable(
                        table, device, mode=builder.gather_mode, hot_rows=hot, register=False
                    )
                    if host.edge_attr is not None and host.edge_attr.shape[0] > 0:
                        attr = host.edge_attr.reshape(host.edge_attr.shape[0], _row_width(host.edge_attr))
                        state.registrations.append(_register(register_host_tensor, attr, "edge_attr"))
                        state.edge_attr = CudaFeatureTable(attr, device, mode="direct", register=False)
            except BaseException:
                state._free()
                raise
        return state

    def release(self) -> None:
        """Drop one reference; the last one frees the GPU memory and unregisters the host memory."""
        with _REGISTRY_LOCK:
            self.refs -= 1
            if self.refs > 0:
                return
            if _REGISTRY.get(self.key) is self:
                del _REGISTRY[self.key]
        self._free()

    def _free(self) -> None:
        with torch.cuda.device(self.device):  # unregistering synchronizes the current device: make it ours
            self._free_on_device()

    def _free_on_device(self) -> None:
        for table in (self.features, self.edge_attr):
            if table is not None:
                table.close()
        self.features = self.edge_attr = self.topology = self.order = None
        registrations, self.registrations = self.registrations, []
        errors = []
        for registration in reversed(registrations):
            try:
                registration.close()
            except Exception as exc:  # noqa: BLE001 - close the rest, then report
                errors.append(exc)
        if errors:
            raise errors[0]


#: Open device states of this process, by (handles, device, options); guarded by ``_REGISTRY_LOCK``.
_REGISTRY: "dict[tuple, _DeviceState]" = {}
_REGISTRY_LOCK = threading.Lock()


def _register(register_host_tensor: Any, tensor: torch.Tensor, name: str) -> Any:
    try:
        return register_host_tensor(tensor, name=name)
    except RuntimeError as exc:
        raise RuntimeError(
            f"{exc}\nThe zero-copy GPU data path pins the host {name} (data.init_args.gather='zerocopy' or "
            "data.init_args.sampler_placement='uva'); with data.init_args.feature_storage='mmap' that pins the "
            "whole feature file in RAM. Use gather='cpu' / sampler_placement='cpu' or 'gpu' where pinning is "
            "not possible."
        ) from exc


def _to_device_packed(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Copy int64 CPU tensors to ``device`` as one pinned, non-blocking transfer; returns views of the copy."""
    flat = [t.reshape(-1).to(torch.int64) for t in tensors]
    staged = torch.empty(sum(t.numel() for t in flat), dtype=torch.int64, pin_memory=True)
    torch.cat(flat, out=staged)
    on_device = staged.to(device, non_blocking=True)  # the caching host allocator keeps `staged` until done
    views, start = [], 0
    for t in tensors:
        views.append(on_device[start : start + t.numel()].view(t.shape))
        start += t.numel()
    return views


def _host_gather_to(
    table: torch.Tensor, ids: torch.Tensor, out: Optional[torch.Tensor], device: torch.device
) -> torch.Tensor:
    """``table[ids]`` gathered by the CPU (ids come back from the GPU), sent to ``device`` (into ``out``)."""
    from lightning_zerocopy import ops

    flat = table.reshape(table.shape[0], _row_width(table)) if table.dim() != 2 else table
    staged = torch.empty((ids.numel(), flat.shape[1]), dtype=table.dtype, pin_memory=True)
    ops.gather_rows(flat, ids.cpu(), staged)
    staged = staged.view((ids.numel(), *table.shape[1:]))
    if out is not None:
        return out.copy_(staged, non_blocking=True)
    return staged.to(device, non_blocking=True)


def _row_width(t: torch.Tensor) -> int:
    width = 1
    for size in t.shape[1:]:
        width *= int(size)
    return width


def _data(x, edge_index, y, n_id, e_id, input_id, sample) -> Data:
    return Data(
        x=x,
        edge_index=edge_index,
        y=y,
        n_id=n_id,
        e_id=e_id,
        input_id=input_id,
        batch_size=sample.batch_size,
        num_sampled_nodes=sample.num_sampled_nodes,
        num_sampled_edges=sample.num_sampled_edges,
    )


def _rows(out: Mapping[str, torch.Tensor], key: str, rows: int, device: torch.device) -> Optional[torch.Tensor]:
    buffer = out.get(key)
    if buffer is None or not _same_device(buffer.device, device):
        return None
    if buffer.shape[0] < rows:
        raise ValueError(
            f"out[{key!r}] has {buffer.shape[0]} rows but this batch needs {rows}: allocate at least "
            f"BatchBuilder.max_nodes(batch_size) rows (or grow the buffer and retry)"
        )
    return buffer[:rows]


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    current = torch.cuda.current_device
    return (a.index if a.index is not None else current()) == (b.index if b.index is not None else current())
