"""``build_batch``: one plan item -> one PyG ``Data`` mini-batch, exactly as ``NeighborLoader`` yields it.

A :class:`BatchBuilder` is made of picklable handles (graph, features, labels, optional edge features), the
sampling options and a feature-cache spec; it carries no data, so it can be sent to another local process (a
pipeline worker, a DDP rank) and opened there with :meth:`BatchBuilder.open`, which takes that process's
:class:`~lightning_zerocopy.data.resources.DeviceResources` (the mapped host memory and everything placed on
the GPU from it).

The batch has PyG ``NeighborLoader``'s fields and conventions:

* ``n_id``: global ids of the sampled nodes, the ``batch_size`` seeds first;
* ``edge_index``: local ids, messages flow ``edge_index[0] -> edge_index[1]`` (neighbor -> target);
* ``x = features[n_id]`` (in the builder's ``x_dtype``, float32 by default, whatever dtype the host table stores),
  ``y = labels[n_id]`` (every sampled node, as ``NeighborLoader`` slices ``y``);
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
  reading the topology the resources placed (registered host memory, or a GPU copy);
* ``hybrid``/``auto``: each batch takes one of the two paths above (CPU threads, or the ``gpu`` kernel), where a
  calibrated cost model expects it to finish first (:mod:`lightning_zerocopy.sampling.hybrid.placement`); the batch is
  the same either way, and the gather below does not depend on where it was sampled;
* ``gather="zerocopy"``: the resources' feature table reads the rows of ``n_id`` straight from the registered
  host feature table into the GPU (into ``out["x"]`` when that is a CUDA buffer: no host staging), serving the
  rows the cache spec chose (``hot_rows``: the most frequently sampled rows) from GPU memory; edge features
  likewise;
* labels: a compact GPU copy (the smallest integer dtype that holds every label), gathered with
  ``index_select`` and widened to int64: cheaper than a zero-copy read per node.

Node order (``HostGraphHandles.node_order``)
--------------------------------------------
The host memory may hold the graph, feature rows and labels renumbered into a locality-preserving *internal*
order (``ZeroCopyDataModule(node_order="bfs" | "degree")``). The renumbering is invisible in the batch: the
plan's seed ids (original ids) are mapped to internal ids before sampling (``rank``, on the CPU), sampling
and the feature/label gathers run on internal ids, and ``n_id`` is mapped back to original ids (``order``)
on the device the batch is built on. So ``n_id``, ``x``, ``y``, ``e_id`` and ``input_id`` mean exactly what
they mean without a node order; only which neighbors are drawn differs (the sampler's random streams are
keyed by frontier position and a target's neighbor list is ordered by internal id), with the same
distribution.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Optional, Sequence

import torch
from torch_geometric.data import Data

from lightning_zerocopy.data.assemble import (
    GpuSide,
    SampledItem,
    StageMarks,
    assemble_on_gpu,
    assemble_on_host,
    complete_batch,
    to_device_packed,
)
from lightning_zerocopy.cache.provider import FeatureCacheSpec, HotRowsCache
from lightning_zerocopy.data.handles import HostGraphHandles, NodeOrderHandles
from lightning_zerocopy.data.hybrid_lanes import HybridLanes
from lightning_zerocopy.data.plan import PlanItem
from lightning_zerocopy.data.resources import DeviceResources, HostData, resolve_cuda_device
from lightning_zerocopy.gather.host_table import feature_dtype_of
from lightning_zerocopy.options import (
    FeatureDtype,
    GatherBackend,
    GatherMode,
    NodeOrderKind,
    SamplerPlacement,
    check_choice,
    check_count,
    check_fanouts,
)
from lightning_zerocopy.sampling.cost_model import SampleSizeEstimator
from lightning_zerocopy.sampling.hybrid.policy import HybridPolicy, HybridStats
from lightning_zerocopy.sampling.neighbor_sampler import NeighborSampler, SampledBatch, node_keyed_bound, sample_bound

__all__ = [
    "BatchBuilder",
    "GatherBackend",
    "GatherMode",
    "HostGraphHandles",
    "NodeOrderHandles",
    "NodeOrderKind",
    "SampledItem",
    "SamplerPlacement",
    "max_sampled_nodes",
]


def max_sampled_nodes(batch_size: int, fanouts: Sequence[int], num_nodes: int, node_keyed: bool = False) -> int:
    """An upper bound on ``len(n_id)`` of a batch (:func:`~lightning_zerocopy.sampling.sample_bound`), capped at
    ``num_nodes``; a fanout of ``-1`` gives ``num_nodes``. Node-keyed (evaluation) sampling caps each hop's level
    instead (:func:`~lightning_zerocopy.sampling.node_keyed_bound`). Sizes preallocated ``out`` buffers."""
    if node_keyed:
        return node_keyed_bound(batch_size, fanouts, num_nodes, 0)[0]
    bound = sample_bound(batch_size, fanouts)
    return num_nodes if bound is None else min(bound[0], num_nodes)


class BatchBuilder:
    """Builds PyG ``Data`` mini-batches from plan items; picklable, opened in each process that builds.

    Every option is plain data, so the builder pickles to another process; what the options mean on this
    machine (the CUDA device, registrations, caches) is decided by the :class:`DeviceResources` it is opened with.

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
        hot_rows: shorthand for ``cache=HotRowsCache(hot_rows)``: feature rows kept in GPU memory, the nodes
            that appear most often as in-neighbors. ``0`` = no cache. Needs ``gather="zerocopy"``.
        cache: the GPU feature cache (a picklable :class:`~lightning_zerocopy.cache.provider.FeatureCacheSpec`, e.g.
            a Strategy's replicated or sharded cache); not together with ``hot_rows``. Needs ``gather="zerocopy"``.
        device: CUDA device index that builds the batches; ``None`` = the device of the resources it is opened
            with (the current device of the process, by default).
        node_keyed: evaluation sampling (:class:`~lightning_zerocopy.sampling.NeighborSampler`): every batch is
            sampled with one seed (``item.batch_seed`` of a plan with ``sampler_seed="split"``), picks keyed by node
            id and nodes deduplicated per hop, so a seed's prediction does not depend on its batch.
        x_dtype: the dtype of the batch's ``x``: ``"float32"`` (default), ``"bfloat16"``, ``"float16"``, or ``None``
            for the host table's own dtype. Rows are read in the table's dtype (a ``bfloat16`` table moves half the
            bytes of a ``float32`` one) and cast where the batch is built (on the GPU for a GPU builder).

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
        cache: Optional[FeatureCacheSpec] = None,
        device: Optional[int] = None,
        node_keyed: bool = False,
        x_dtype: Optional[FeatureDtype] = "float32",
    ) -> None:
        check_choice(sampler_placement, SamplerPlacement, "sampler_placement")
        if x_dtype is not None:
            check_choice(x_dtype, FeatureDtype, "x_dtype")
        check_choice(gather, GatherBackend, "gather")
        check_choice(gather_mode, GatherMode, "gather_mode")
        check_count(hot_rows, "hot_rows")
        if hot_rows > 0 and cache is not None:
            raise ValueError(f"give either `hot_rows` ({hot_rows}) or `cache` ({cache!r}), not both")
        if hot_rows > 0:
            cache = HotRowsCache(hot_rows)
        if cache is not None and gather != "zerocopy":
            what = f"`hot_rows`={hot_rows}" if hot_rows > 0 else f"`cache`={cache!r}"
            raise ValueError(f"{what} caches rows for the zero-copy gather: set gather='zerocopy'")
        if device is not None and (isinstance(device, bool) or not isinstance(device, int) or device < 0):
            raise ValueError(f"`device` must be a CUDA device index >= 0 or None, got {device!r}")
        check_count(num_threads, "num_threads", minimum=1, allow_none=True)
        self.handles = handles
        self.fanouts = check_fanouts(list(fanouts), "fanouts")
        self.replace = bool(replace)
        self.node_keyed = bool(node_keyed)
        self.num_threads = num_threads
        self.sampler_placement: SamplerPlacement = sampler_placement
        self.gather: GatherBackend = gather
        self.gather_mode: GatherMode = gather_mode
        self.cache: Optional[FeatureCacheSpec] = cache
        self.device_index = device
        #: the dtype of the batches' ``x`` (``None``: the host table's)
        self.x_dtype: Optional[FeatureDtype] = x_dtype
        self._lanes = HybridLanes(sampler_placement)  # the hybrid side, shared with the heterogeneous builder
        #: placement of the CUDA sampler (``"cpu"``: none): the fixed one, or a hybrid builder's GPU side here
        self.gpu_sampler_placement = self._lanes.gpu_placement
        #: the devices a hybrid builder samples on (``None``: one device)
        self.hybrid_lanes: Optional[tuple[str, ...]] = self._lanes.lanes
        self._reset()

    def _reset(self) -> None:
        self._resources: Optional[DeviceResources] = None
        self._owns_resources = False
        self._host: Optional[HostData] = None
        self._cpu_sampler: Optional[NeighborSampler] = None
        self._gpu: Optional[GpuSide] = None
        self._lock = threading.Lock()

    # ---- lifecycle ---------------------------------------------------------------------------------------

    @property
    def hot_rows(self) -> int:
        """Rows of a :class:`HotRowsCache` (``0`` without a cache or with another kind of cache)."""
        return self.cache.rows if isinstance(self.cache, HotRowsCache) else 0

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
        return self._gpu.device

    @property
    def resources(self) -> Optional[DeviceResources]:
        """The resources this builder is open with (``None`` when closed)."""
        return self._resources

    def open(self, resources: Optional[DeviceResources] = None, *, place: bool = True) -> "BatchBuilder":
        """Bind this builder to ``resources`` and, for a GPU builder, fetch its GPU side from them (idempotent).

        Args:
            resources: the process's :class:`DeviceResources` over this builder's host memory (shared with the
                other builders of its owner, which also closes them). ``None``: the builder creates private
                resources (mapping the host memory by name) and closes them in :meth:`close`.
            place: place the GPU side now (topology, registrations, label copy, feature cache, as the resources
                share them); ``False`` defers that to the first batch (an owner that may never build here).

        Raises:
            ValueError: ``resources`` over other host memory, or on another device than ``device``.
            RuntimeError: a GPU builder without a usable CUDA device or without the CUDA kernels, or pinning
                the host memory failed (the message names the memlock limit).
        """
        if self._resources is None:
            owns = resources is None
            if resources is None:
                resources = DeviceResources(self.handles, self.device_index)
            elif resources.handles.key() != self.handles.key():
                raise ValueError("`resources` map other host memory than this builder's handles")
            self._resources, self._owns_resources, self._host = resources, owns, resources.host
            self._cpu_sampler = NeighborSampler(
                self._host.graph, fanouts=self.fanouts, replace=self.replace, num_threads=self.num_threads,
                node_keyed=self.node_keyed,
            )  # fmt: skip
            graph = self._host.graph
            self._lanes.open(lambda: SampleSizeEstimator.from_graph(graph.indptr, graph.indices, self.fanouts, self.replace))
        elif resources is not None and resources is not self._resources:
            raise ValueError("this BatchBuilder is already open with other resources; close() it first")
        if place and self.on_gpu and self._gpu is None:
            self._place()
        return self

    def _place(self) -> None:
        with self._lock:
            if self._gpu is not None:
                return
            r = self._resources
            assert r is not None
            what = f"BatchBuilder(sampler_placement={self.sampler_placement!r}, gather={self.gather!r})"
            device = resolve_cuda_device(r.device_index, what)
            if self.device_index is not None and device.index != self.device_index:
                raise ValueError(f"BatchBuilder(device={self.device_index}) opened with resources on {device}")
            sampler = None
            if self.gpu_sampler_placement != "cpu":
                sampler = NeighborSampler(
                    r.topology(None, self.gpu_sampler_placement), fanouts=self.fanouts, replace=self.replace,
                    placement=self.gpu_sampler_placement, device=device, node_keyed=self.node_keyed,
                )  # fmt: skip
            zerocopy = self.gather == "zerocopy"
            self._gpu = GpuSide(
                device=device,
                sampler=sampler,
                features=r.feature_table(None, self.gather_mode, self.cache) if zerocopy else None,
                edge_attr=r.edge_attr_table() if zerocopy else None,
                labels=r.labels(),
                order=r.node_order(),
            )

    def close(self) -> None:
        """Unbind from the resources (closing them if the builder created them). Idempotent; a later
        :meth:`open` binds again (a private open maps the memory by name again)."""
        resources, owns = self._resources, self._owns_resources
        self._lanes.close()
        self._reset()
        if resources is not None and owns:
            resources.close()

    @property
    def is_open(self) -> bool:
        """Whether the builder is bound to resources (and, for a GPU builder, has fetched its GPU side)."""
        return self._resources is not None and (self._gpu is not None or not self.on_gpu)

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
        return max_sampled_nodes(batch_size, self.fanouts, self.num_nodes, self.node_keyed)

    # ---- building ----------------------------------------------------------------------------------------

    def build_batch(self, item: PlanItem, out: Optional[Mapping[str, torch.Tensor]] = None) -> Data:
        """Sample the neighborhood of ``item.seed_ids`` and gather its features and labels.

        The same as ``gather_batch(sample_batch(item), out)``: a pipeline runs the two stages one batch apart.

        Args:
            item: the plan item (seed ids, their positions in the split, the batch's sampler seed).
            out: optional preallocated buffers, by field: ``"x"`` (``[rows, num_features]`` of the dtype
                ``x_dtype`` gives), ``"y"`` (``[rows]`` int64), ``"edge_attr"`` (``[rows, ...]``). Each buffer must have
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

    def sample_batch(self, item: PlanItem, lane: Optional[str] = None) -> SampledItem:
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
        self._lanes.check_lane(lane)
        if not self.is_open:
            self.open()
        if self._lanes.hybrid and lane is None:
            return self._lanes.run(self.expected_size(item), lambda chosen: self.sample_batch(item, lane=chosen))
        host, sampler = self._host, self._cpu_sampler
        assert host is not None and sampler is not None
        seed_ids = host.internal_ids(item.seed_ids)
        if not self.on_gpu:
            return SampledItem(item, sampler.sample(seed_ids, seed=item.batch_seed), item.input_id)
        gpu = self._gpu
        assert gpu is not None
        device = gpu.device
        with torch.cuda.device(device):  # the current stream of that device: a caller's side stream is kept
            if gpu.sampler is None or lane == "cpu":  # CPU sampler, then the ids go over in one pinned copy
                sample = sampler.sample(seed_ids, seed=item.batch_seed)
                n_id, edge_index, e_id, input_id = to_device_packed(
                    [sample.n_id, sample.edge_index, sample.e_id, item.input_id], device
                )
                sample = SampledBatch(n_id, edge_index, e_id, sample.num_sampled_nodes, sample.num_sampled_edges,
                                      sample.batch_size)  # fmt: skip
            else:
                seeds, input_id = to_device_packed([seed_ids, item.input_id], device)
                sample = gpu.sampler.sample(seeds, seed=item.batch_seed)
        return SampledItem(item, sample, input_id)

    def expected_size(self, item: PlanItem) -> float:
        """Expected sampled edges of the batch of ``item`` (the hybrid cost models' size; a sum over its seeds).
        Needs the host graph only (no GPU work).

        Raises:
            RuntimeError: the builder is not hybrid (``sampler_placement`` ``hybrid``/``auto`` with a GPU).
        """
        if self._resources is None:
            self.open(place=False)
        host = self._host
        assert host is not None
        return self._lanes.expected_size(host.internal_ids(item.seed_ids))

    def hybrid_policy(self) -> Optional[HybridPolicy]:
        """A fresh :class:`~lightning_zerocopy.sampling.HybridPolicy` over this builder's devices for a pipeline
        producer that samples batches ahead on all of them, or ``None`` for a single-device builder."""
        return self._lanes.policy()

    @property
    def sampling_stats(self) -> Optional[HybridStats]:
        """Where this builder's own cost model placed the batches it sampled (hybrid builders used directly)."""
        return self._lanes.stats

    def gather_batch(
        self,
        sampled: SampledItem,
        out: Optional[Mapping[str, torch.Tensor]] = None,
        *,
        marks: Optional[StageMarks] = None,
    ) -> Data:
        """Second stage of :meth:`build_batch`: gather the features, labels (and edge features) of a sample.

        Args:
            sampled: what :meth:`sample_batch` returned (in this process, for this builder).
            out: preallocated buffers, as in :meth:`build_batch` (``out["x"]`` of the dtype ``x_dtype`` gives).
            marks: told when the feature rows are gathered (``marks.mark("gather", nbytes)``, on the current
                stream), for a caller that splits the build's time into stages (the pipeline producer).
        """
        if not self.is_open:
            self.open()
        assert self._host is not None
        x_dtype = None if self.x_dtype is None else feature_dtype_of(self.x_dtype)
        if self.on_gpu:
            assert self._gpu is not None
            with torch.cuda.device(self._gpu.device):
                data = assemble_on_gpu(self._host, self._gpu, sampled, out or {}, x_dtype, marks)
                return complete_batch(data, sampled.item)
        return complete_batch(assemble_on_host(self._host, sampled, out or {}, x_dtype, marks), sampled.item)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_resources", "_owns_resources", "_host", "_cpu_sampler", "_gpu", "_lock"):
            state.pop(key, None)  # handles only: the receiving process maps the memory itself
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __repr__(self) -> str:
        return (
            f"BatchBuilder(num_nodes={self.num_nodes}, fanouts={self.fanouts}, replace={self.replace}, "
            f"node_keyed={self.node_keyed}, "
            f"sampler_placement={self.sampler_placement!r}, gather={self.gather!r}, gather_mode={self.gather_mode!r}, "
            f"cache={self.cache!r}, node_order={self.node_order!r}, x_dtype={self.x_dtype!r}, device={self.device_index}, "
            f"open={self.is_open})"
        )
