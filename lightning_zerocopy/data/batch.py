"""``build_batch``: one plan item -> one PyG mini-batch, exactly as ``NeighborLoader`` yields it: ``Data`` for an
untyped graph, ``HeteroData`` (the hetero ``NeighborLoader``'s fields) for a typed one.

A :class:`BatchBuilder` is made of picklable handles (graphs, features, labels, optional edge features), the
sampling options and a feature-cache spec; it carries no data, so it can be sent to another local process (a
pipeline worker, a DDP rank) and opened there with :meth:`BatchBuilder.open`, which takes that process's
:class:`~lightning_zerocopy.data.resources.DeviceResources`. One builder for every schema: sample
(:class:`~lightning_zerocopy.sampling.NeighborSampler`: one fused call for one type, a per-hop loop for several) ->
gather per featured type -> assemble (:func:`~lightning_zerocopy.data.assemble.assemble`). The batch has PyG
``NeighborLoader``'s fields: ``n_id`` (the ``batch_size`` seeds first), ``edge_index`` (local ids, neighbor ->
target), ``x = features[n_id]`` (in ``x_dtype``), ``y = labels[n_id]``, ``e_id``, each node/edge attribute of the
dataset at ``n_id``/``e_id`` (:mod:`~.attributes`), ``batch_size``, ``input_id`` (the seeds' positions in the split;
node ids for a split given as a mask, as PyG), ``num_sampled_nodes``/``_edges``.

Where a batch is built: with ``gather="cpu"`` and the CPU sampler in host memory (the trainer moves it); otherwise
on the GPU, on the current CUDA stream (a pipeline may run it on a side stream). A CPU sample's ids go to the GPU in
one pinned, non-blocking copy; ``uva``/``gpu`` samplers read the topologies the resources placed; ``hybrid``/``auto``
take one of the two per batch (:class:`~lightning_zerocopy.data.hybrid_lanes.HybridLanes`), the batch the same either
way; ``gather="zerocopy"`` reads each featured type's rows straight from registered host memory (into ``out["x"]``
when that is a CUDA buffer), the rows a cache spec chose from GPU memory; labels come from a compact GPU copy.

Node order (``HostGraphHandles.node_order``, one node type): the plan's seed ids are mapped to internal ids before
sampling, and ``n_id`` back on the device the batch is built on, so batches carry the dataset's ids; only which
neighbors are drawn differs (random streams are keyed by frontier position), with the same distribution.

Not yet typed: ``out`` buffers and a slot capacity bound (the pipeline copies a flattened typed batch into its slot,
sized from the first batch), and a node order (:mod:`lightning_zerocopy.data.host.share` says why).
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Any, Mapping, Optional, Sequence, Union

import torch
from torch_geometric.data import Data, HeteroData

from lightning_zerocopy.cache.provider import FeatureCacheSpec, HotRowsCache
from lightning_zerocopy.data.assemble import (
    GpuSide,
    SampledItem,
    StageMarks,
    assemble,
    complete_batch,
    sample_to_device,
    to_device_packed,
)
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.data.hybrid_lanes import HybridLanes, size_estimator
from lightning_zerocopy.data.plan import PlanItem
from lightning_zerocopy.data.resources import DeviceResources, HostData, resolve_cuda_device
from lightning_zerocopy.gather.host_table import feature_dtype_of
from lightning_zerocopy.graph.schema import EdgeType
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
from lightning_zerocopy.sampling.hybrid.policy import HybridPolicy, HybridStats
from lightning_zerocopy.sampling.neighbor_sampler import NeighborSampler, max_sampled_nodes

__all__ = ["BatchBuilder", "HeteroBatchBuilder", "SampledItem", "max_sampled_nodes"]

Fanouts = Union[Sequence[int], Mapping[EdgeType, Sequence[int]]]


class BatchBuilder:
    """Builds PyG mini-batches (``Data``, or ``HeteroData`` for a typed graph) from plan items; picklable, opened in
    each process that builds.

    Every option is plain data; what the options mean on this machine (the CUDA device, registrations, caches) is
    decided by the :class:`DeviceResources` it is opened with.

    Args:
        handles: where the graphs, features and labels live (and the node order they are stored in, if any:
            batches are in the dataset's ids either way).
        fanouts: neighbors per hop, e.g. ``[15, 10, 5]``; for a typed graph a list per edge type (every edge type,
            lists of one length); ``-1`` takes all neighbors.
        replace: sample with replacement.
        num_threads: threads of the CPU sampling kernel; ``None`` uses ``torch.get_num_threads()``.
        sampler_placement: where neighbors are sampled: ``"cpu"`` (C++ threads), ``"uva"`` (CUDA kernel reading
            the topology from registered host memory), ``"gpu"`` (CUDA kernel, topology copied to the GPU),
            ``"hybrid"`` (per batch the C++ threads or the ``"gpu"`` kernel, whichever a calibrated cost model expects
            to finish first) or ``"auto"`` (hybrid if both together measure faster, else the faster one). Every
            placement gives bitwise the CPU placement's sample; without a usable CUDA device ``hybrid``/``auto`` warn
            once and sample on the CPU.
        gather: how feature (and edge-feature) rows are fetched: ``"cpu"`` (CPU threads) or ``"zerocopy"`` (the
            GPU reads the rows from registered host memory); with ``"cpu"`` and a CPU sampler the batch is built in
            host memory, otherwise on the GPU.
        gather_mode: read order of the zero-copy gather: ``"auto"`` (time both, keep the faster), ``"direct"``
            (batch order) or ``"sorted"`` (address order); or ``"staged"`` (host threads and the copy engines,
            :mod:`~lightning_zerocopy.gather.staged`).
        hot_rows: shorthand for ``cache=HotRowsCache(hot_rows)``: feature rows kept in GPU memory, the nodes
            that appear most often as in-neighbors (per featured type). ``0`` = no cache. Needs ``gather="zerocopy"``.
        cache: the GPU feature cache (a picklable :class:`~lightning_zerocopy.cache.provider.FeatureCacheSpec`, or
            one per node type such as the Strategy's ``TypedFeatureCache``); not together with ``hot_rows``. Needs
            ``gather="zerocopy"``.
        device: CUDA device index that builds the batches (``None``: the resources' device).
        node_keyed: evaluation sampling: every batch sampled with one seed (a plan with ``sampler_seed="split"``),
            picks keyed by node id, nodes deduplicated per hop: a seed's prediction does not depend on its batch.
        x_dtype: the dtype of the batch's ``x`` (``"float32"`` by default, ``"bfloat16"``, ``"float16"``, or ``None``
            for the host table's): rows are read in the table's dtype and cast where the batch is built.

    Raises:
        ValueError / TypeError: an option is invalid (the message names it).
    """

    def __init__(
        self,
        handles: HostGraphHandles,
        fanouts: Fanouts,
        replace: bool = False,
        num_threads: Optional[int] = None,
        *,
        sampler_placement: SamplerPlacement = "cpu",
        gather: GatherBackend = "cpu",
        gather_mode: GatherMode = "auto",
        hot_rows: int = 0,
        cache: Optional[Any] = None,
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
        if handles.schema.is_typed:
            if not isinstance(fanouts, Mapping) or set(map(tuple, fanouts)) != set(handles.edge_types):
                raise ValueError(f"`fanouts` must name every edge type {handles.edge_types}, got {list(fanouts)}")
            self.fanouts: Any = {et: check_fanouts(list(fanouts[et]), "fanouts") for et in handles.edge_types}
        else:
            self.fanouts = check_fanouts(list(fanouts), "fanouts")  # type: ignore[arg-type]
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
        self._lanes = HybridLanes(sampler_placement)
        #: placement of the CUDA sampler (``"cpu"``: none): the fixed one, or a hybrid builder's GPU side here
        self.gpu_sampler_placement = self._lanes.gpu_placement
        #: the devices a hybrid builder samples on (``None``: one device)
        self.hybrid_lanes: Optional[tuple[str, ...]] = self._lanes.lanes
        #: the fields a pipeline's slot hands to ``gather_batch`` as ``out``: ``x``, ``y`` and the node attributes (a
        #: slot holds as many rows as nodes; a typed batch: none, the producer copies it into its slot)
        nodes = tuple(key.name for key, a in handles.attributes if key.level == "node" and a.dim == 0)
        self.slot_fields: tuple[str, ...] = () if handles.schema.is_typed else ("x", "y", *nodes)
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
    def input_type(self) -> Optional[str]:
        """The node type of a node plan's seeds (a typed link item seeds its endpoint types instead)."""
        return self.handles.schema.input_type

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
            resources: the process's :class:`DeviceResources` over this builder's host memory (shared with the other
                builders of its owner, which closes them); ``None``: private ones, closed by :meth:`close`.
            place: place the GPU side now (topologies, registrations, labels, feature caches); ``False`` defers that
                to the first batch (an owner that may never build here).

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
            self._cpu_sampler = self._sampler(self._host.graphs, self._host.fused)
            host = self._host
            self._lanes.open(lambda: size_estimator(host.graphs, host.num_nodes, self.fanouts, self.replace))
        elif resources is not None and resources is not self._resources:
            raise ValueError("this BatchBuilder is already open with other resources; close() it first")
        if place and self.on_gpu and self._gpu is None:
            self._place()
        return self

    def _sampler(self, graphs: Mapping[EdgeType, Any], fused: Any = None, **placement: Any) -> NeighborSampler:
        """The sampler over ``graphs`` (host CSCs, or topologies placed by the resources; several types: ``fused``)."""
        options = dict(fanouts=self.fanouts, replace=self.replace, node_keyed=self.node_keyed, **placement)
        if not self.handles.schema.is_typed:
            return NeighborSampler(next(iter(graphs.values())), num_threads=self.num_threads, **options)
        return NeighborSampler(graphs, num_threads=self.num_threads, node_types=self.handles.node_types,
                               num_nodes=dict(self.handles.num_nodes), fused=fused, **options)  # fmt: skip

    def _place(self) -> None:
        with self._lock:
            if self._gpu is not None:
                return
            r, host = self._resources, self._host
            assert r is not None and host is not None
            what = f"BatchBuilder(sampler_placement={self.sampler_placement!r}, gather={self.gather!r})"
            device = resolve_cuda_device(r.device_index, what)
            if self.device_index is not None and device.index != self.device_index:
                raise ValueError(f"BatchBuilder(device={self.device_index}) opened with resources on {device}")
            sampler, placement = None, self.gpu_sampler_placement
            if placement != "cpu":
                if host.fused is not None:  # several types: the fused CSC is all the sampler reads
                    graphs, fused = host.graphs, r.fused_topology(placement)  # type: ignore[arg-type]
                else:
                    graphs, fused = {et: r.topology(et, placement) for et in host.graphs}, None  # type: ignore[arg-type]
                sampler = self._sampler(graphs, fused, placement=placement, device=device)
            zerocopy = self.gather == "zerocopy"
            features = {t: r.feature_table(t, self.gather_mode, self.cache) for t in host.tables} if zerocopy else None
            attributes = {k: r.attribute_table(k, self.gather_mode) for k in host.attributes} if zerocopy else None
            self._gpu = GpuSide(device=device, sampler=sampler, features=features, attributes=attributes,
                                labels=r.labels(), order=r.node_order())  # fmt: skip

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
        """Nodes of an untyped graph."""
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

    def build_batch(self, item: PlanItem, out: Optional[Mapping[str, torch.Tensor]] = None) -> Union[Data, HeteroData]:
        """Sample the neighborhood of the item's seeds and gather its features and labels.

        The same as ``gather_batch(sample_batch(item), out)``: a pipeline runs the two stages one batch apart.

        Args:
            item: the plan item (seed ids, their positions in the split, the batch's sampler seed).
            out: optional preallocated buffers of an untyped batch, by field: ``"x"`` (``[rows, num_features]`` of
                the dtype ``x_dtype`` gives), ``"y"`` (``[rows]`` int64), an attribute's name (its rows). Each
                buffer must have at least as many rows as the batch needs; the batch's tensor is then the view
                ``buf[:n]``. Buffers on the device the batch is built on (:attr:`device`) are written in place; a
                buffer on another device is left alone and that field is returned as a new tensor.

        Returns:
            A ``Data`` (``HeteroData`` for a typed graph) with PyG's ``NeighborLoader`` fields, on :attr:`device`.
        """
        return self.gather_batch(self.sample_batch(item), out)

    def sample_batch(self, item: PlanItem, lane: Optional[str] = None) -> SampledItem:
        """First stage of :meth:`build_batch`: sample the neighborhood of the item's seeds.

        Needs no output buffer (a pipeline samples batch ``t + 2`` while ``t + 1`` is gathered); a GPU builder samples
        on the current CUDA stream of its device and leaves the structure there.

        Args:
            item: the plan item (input-type seeds, or a typed link item's seeds per endpoint type).
            lane: for a hybrid builder, the device to sample on (one of :attr:`hybrid_lanes`; a pipeline's
                dispatcher names it); ``None`` lets the builder's own cost model pick. The sample is the same.

        Raises:
            IndexError / ValueError: a seed id out of range or repeated (the kernel's checks).
            ValueError: ``lane`` is not one of this builder's devices.
        """
        self._lanes.check_lane(lane)
        if not self.is_open:
            self.open()
        if self._lanes.hybrid and lane is None:
            return self._lanes.run(self.expected_size(item), lambda chosen: self.sample_batch(item, lane=chosen))
        sampler = self._cpu_sampler
        assert sampler is not None
        seeds, input_type = self._seeds(item)
        if not self.on_gpu:
            return SampledItem(item, sampler.sample(seeds, item.batch_seed, input_type), item.batch_input_id)
        gpu = self._gpu
        assert gpu is not None
        with torch.cuda.device(gpu.device):  # the current stream of that device: a caller's side stream is kept
            if gpu.sampler is None or lane == "cpu":  # CPU sampler, then every id goes over in one pinned copy
                return sample_to_device(item, sampler.sample(seeds, item.batch_seed, input_type), gpu.device)
            if isinstance(seeds, torch.Tensor):
                seeds, input_id = to_device_packed([seeds, item.batch_input_id], gpu.device)
            else:
                *moved, input_id = to_device_packed([*seeds.values(), item.batch_input_id], gpu.device)
                seeds = dict(zip(seeds, moved))
            return SampledItem(item, gpu.sampler.sample(seeds, item.batch_seed, input_type), input_id)

    def _seeds(self, item: PlanItem) -> tuple[Union[torch.Tensor, dict[str, torch.Tensor]], Optional[str]]:
        """The sampler's seeds of ``item`` (internal ids) and their type: a typed link item's per endpoint type."""
        typed = item.typed_seeds
        if typed is not None:
            return typed, None
        if not self.handles.schema.is_typed:
            assert self._host is not None
            return self._host.internal_ids(item.seed_ids), None
        return item.seed_ids, self.input_type

    def expected_size(self, item: PlanItem) -> float:
        """Expected sampled edges of the batch of ``item`` (the hybrid cost models' size; a sum over its seeds, of
        every seeded type). Needs the host graph only (no GPU work).

        Raises:
            RuntimeError: the builder is not hybrid (``sampler_placement`` ``hybrid``/``auto`` with a GPU).
            IndexError: a seed id outside its type.
        """
        if self._resources is None:
            self.open(place=False)
        seeds, input_type = self._seeds(item)
        return self._lanes.expected_size(seeds if input_type is None else {input_type: seeds})

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
    ) -> Union[Data, HeteroData]:
        """Second stage of :meth:`build_batch`: gather the features, labels (and edge features) of a sample.

        Args:
            sampled: what :meth:`sample_batch` returned (in this process, for this builder).
            out: preallocated buffers, as in :meth:`build_batch` (``out["x"]`` of the dtype ``x_dtype`` gives).
            marks: told when the feature rows are gathered (``marks.mark("gather", nbytes)``, on the current
                stream), for a caller that splits the build's time into stages (the pipeline producer).

        Raises:
            ValueError: ``out`` buffers for a typed batch (see the module docstring).
        """
        if out and self.handles.schema.is_typed:
            raise ValueError("preallocated `out` buffers are not supported for heterogeneous batches yet")
        if not self.is_open:
            self.open()
        assert self._host is not None
        x_dtype = None if self.x_dtype is None else feature_dtype_of(self.x_dtype)
        gpu = self._gpu if self.on_gpu else None  # None: a host batch
        with nullcontext() if gpu is None else torch.cuda.device(gpu.device):
            data = assemble(self._host, gpu, sampled, out or {}, x_dtype, marks)
            return complete_batch(data, sampled.item, sampled.input_id)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_resources", "_owns_resources", "_host", "_cpu_sampler", "_gpu", "_lock"):
            state.pop(key, None)  # handles only: the receiving process maps the memory itself
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __repr__(self) -> str:
        shape = f"edge_types={len(self.fanouts)}" if self.handles.schema.is_typed else f"num_nodes={self.num_nodes}"
        return (
            f"{type(self).__name__}({shape}, fanouts={self.fanouts}, replace={self.replace}, "
            f"node_keyed={self.node_keyed}, sampler_placement={self.sampler_placement!r}, gather={self.gather!r}, "
            f"gather_mode={self.gather_mode!r}, cache={self.cache!r}, node_order={self.node_order!r}, "
            f"x_dtype={self.x_dtype!r}, device={self.device_index}, open={self.is_open})"
        )


#: A typed graph's builder is the same class (kept under this name for existing imports).
HeteroBatchBuilder = BatchBuilder

