"""``HeteroBatchBuilder``: one plan item -> one PyG ``HeteroData`` batch, as PyG's hetero ``NeighborLoader`` yields it.

The heterogeneous builder on the node spine: the plan is the homogeneous :class:`~lightning_zerocopy.data.plan.BatchPlan`
over the input type's split (a plan item's seeds are input-type ids), the builder has
:class:`~lightning_zerocopy.data.batch.BatchBuilder`'s interface (``open``/``close``, ``build_batch`` =
``gather_batch(sample_batch(item))``, picklable: handles and options only), so :class:`~lightning_zerocopy.data.loader.PlanLoader`
and the DataModule's split builders drive it unchanged; types are data (the handles' node and edge types, the
fanouts per edge type). Sampling is :class:`~lightning_zerocopy.sampling.hetero.HeteroNeighborSampler` (the
homogeneous kernel per hop and edge type), assembly :mod:`lightning_zerocopy.data.hetero_assemble` (the same gathers).

Placements: ``sampler_placement`` ``cpu`` | ``uva`` | ``gpu`` (every edge type's CSC placed by the resources, one
sampler per edge type and hop over it) | ``hybrid`` | ``auto``; ``gather`` ``cpu`` | ``zerocopy`` (one zero-copy table
per featured type). With ``gather="cpu"`` and the CPU sampler the batch is built in host memory, otherwise on the GPU
(a CPU sample's ids go over in one pinned copy).

``hybrid``/``auto`` are the homogeneous builder's, through the same
:class:`~lightning_zerocopy.data.hybrid_lanes.HybridLanes`: each batch is sampled either by the C++ threads (lane
``"cpu"``, then every id goes over in one pinned copy) or by the ``gpu`` samplers over GPU copies of every edge type's
CSC (lane ``"gpu"``), where the cost model expects it to finish first; the typed sampler draws bitwise the same sample
on both, so the batch does not depend on the lane. The cost model's size is the typed expected sample
(:class:`~lightning_zerocopy.sampling.TypedSampleSizeEstimator`: per node type, summed over the edge types into it),
summed over the seeds of every seeded type. ``auto`` decides by the same measurement as for one type (both lanes
calibrated on the run's batches, both kept only where together they are faster). A pipeline producer samples ahead on
both lanes at once (``hybrid_policy()``, ``expected_size(item)``, ``sample_batch(item, lane=...)``).

Link batches go through the same builder: a :class:`~lightning_zerocopy.data.link_plan.LinkPlanItem` over a typed edge
type carries its seeds per node type (``item.typed_seeds``: both endpoint types start the sample, as PyG's
``seed_dict``), and its link fields are attached after the gather
(:func:`~lightning_zerocopy.data.hetero_assemble.complete_hetero_batch`).
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Optional, Sequence

import torch
from torch_geometric.data import HeteroData

from lightning_zerocopy.data.assemble import StageMarks, to_device_packed
from lightning_zerocopy.data.handles import HeteroHostGraphHandles
from lightning_zerocopy.data.hetero_assemble import (
    HeteroGpuSide,
    HeteroSampledItem,
    assemble_hetero_on_gpu,
    assemble_hetero_on_host,
    complete_hetero_batch,
)
from lightning_zerocopy.data.hybrid_lanes import HybridLanes
from lightning_zerocopy.data.plan import PlanItem
from lightning_zerocopy.data.resources import DeviceResources, HostData, resolve_cuda_device
from lightning_zerocopy.gather.host_table import feature_dtype_of
from lightning_zerocopy.options import (
    FeatureDtype,
    GatherBackend,
    GatherMode,
    SamplerPlacement,
    check_choice,
    check_count,
    check_fanouts,
)
from lightning_zerocopy.sampling.cost_model import TypedSampleSizeEstimator
from lightning_zerocopy.sampling.hetero import EdgeType, HeteroSampledBatch
from lightning_zerocopy.sampling.neighbor_sampler import HeteroNeighborSampler
from lightning_zerocopy.sampling.hybrid.policy import HybridPolicy, HybridStats

__all__ = ["HeteroBatchBuilder"]


class HeteroBatchBuilder:
    """Builds PyG ``HeteroData`` mini-batches from plan items; picklable, opened in each process that builds.

    Args:
        handles: the heterogeneous host memory.
        fanouts: per edge type, neighbors per hop (every edge type of the handles, lists of one length).
        replace: sample with replacement.
        num_threads: threads of the CPU sampling kernel (``None``: ``torch.get_num_threads()``).
        sampler_placement: ``"cpu"``, ``"uva"``, ``"gpu"``, ``"hybrid"`` (per batch the C++ threads or the ``"gpu"``
            samplers, whichever the cost model expects to finish first) or ``"auto"`` (both only where together they
            measure faster, else the faster one); see the module docstring. Every placement gives the CPU placement's
            batch. Without a usable CUDA device ``hybrid``/``auto`` warn once and sample on the CPU.
        gather: ``"cpu"`` or ``"zerocopy"`` (the GPU reads each featured type's rows from registered host memory).
        gather_mode: read order of the zero-copy gather (``auto``/``direct``/``sorted``).
        device: CUDA device index (``None``: the resources').
        node_keyed: evaluation sampling (:mod:`lightning_zerocopy.sampling.hetero`).
        x_dtype: the dtype of every type's ``x`` (``None``: the host table's).
        cache: the GPU feature cache over typed rows (a picklable
            :class:`~lightning_zerocopy.cache.typed_provider.TypedFeatureCache`, the Strategy's), or ``None``. Needs
            ``gather="zerocopy"``.

    Raises:
        ValueError: a bad option (naming it).
    """

    def __init__(
        self,
        handles: HeteroHostGraphHandles,
        fanouts: Mapping[EdgeType, Sequence[int]],
        replace: bool = False,
        num_threads: Optional[int] = None,
        *,
        sampler_placement: SamplerPlacement = "cpu",
        gather: GatherBackend = "cpu",
        gather_mode: GatherMode = "auto",
        device: Optional[int] = None,
        node_keyed: bool = False,
        x_dtype: Optional[FeatureDtype] = "float32",
        cache: Optional[Any] = None,
    ) -> None:
        check_choice(sampler_placement, SamplerPlacement, "sampler_placement")
        check_choice(gather, GatherBackend, "gather")
        check_choice(gather_mode, GatherMode, "gather_mode")
        if x_dtype is not None:
            check_choice(x_dtype, FeatureDtype, "x_dtype")
        check_count(num_threads, "num_threads", minimum=1, allow_none=True)
        if set(map(tuple, fanouts)) != set(handles.edge_types):
            raise ValueError(f"`fanouts` must name every edge type {handles.edge_types}, got {list(fanouts)}")
        if cache is not None and gather != "zerocopy":
            raise ValueError(f"`cache`={cache!r} caches rows for the zero-copy gather: set gather='zerocopy'")
        self.handles = handles
        self.cache = cache
        self.fanouts = {et: check_fanouts(list(fanouts[et]), "fanouts") for et in handles.edge_types}
        self.replace = bool(replace)
        self.num_threads = num_threads
        self.sampler_placement: SamplerPlacement = sampler_placement
        self._lanes = HybridLanes(sampler_placement)  # the hybrid side, shared with the homogeneous builder
        #: the CUDA sampler's placement (``"cpu"``: none): the fixed one, or a hybrid builder's GPU side
        self.gpu_sampler_placement = self._lanes.gpu_placement
        self.gather: GatherBackend = gather
        self.gather_mode: GatherMode = gather_mode
        self.device_index = device
        self.node_keyed = bool(node_keyed)
        self.x_dtype: Optional[FeatureDtype] = x_dtype
        #: the devices a hybrid builder samples on (``None``: one device)
        self.hybrid_lanes: Optional[tuple[str, ...]] = self._lanes.lanes
        #: the fields a pipeline's slot hands to ``gather_batch`` as ``out``: none (the producer copies the batch
        #: into its slot, :mod:`lightning_zerocopy.pipeline.hetero_slots`)
        self.slot_fields: tuple[str, ...] = ()
        self._reset()

    def _reset(self) -> None:
        self._resources: Optional[DeviceResources] = None
        self._owns_resources = False
        self._host: Optional[HostData] = None
        self._cpu_sampler: Optional[HeteroNeighborSampler] = None
        self._gpu: Optional[HeteroGpuSide] = None
        self._lock = threading.Lock()

    # ---- lifecycle ---------------------------------------------------------------------------------------

    @property
    def input_type(self) -> str:
        return self.handles.input_type

    @property
    def on_gpu(self) -> bool:
        """Whether batches are built on a CUDA device (a GPU sampler or the zero-copy gather)."""
        return self.gather == "zerocopy" or self.gpu_sampler_placement != "cpu"

    @property
    def device(self) -> torch.device:
        """``cpu``, or the CUDA device resolved by :meth:`open` (``RuntimeError`` for a GPU builder not open yet)."""
        if not self.on_gpu:
            return torch.device("cpu")
        if self._gpu is None:
            raise RuntimeError("the CUDA device of a GPU HeteroBatchBuilder is decided by open(); call open() first")
        return self._gpu.device

    @property
    def resources(self) -> Optional[DeviceResources]:
        return self._resources

    @property
    def is_open(self) -> bool:
        return self._resources is not None and (self._gpu is not None or not self.on_gpu)

    @property
    def sampling_stats(self) -> Optional[HybridStats]:
        """Where this builder's own cost model placed the batches it sampled (hybrid builders used directly)."""
        return self._lanes.stats

    def hybrid_policy(self) -> Optional[HybridPolicy]:
        """A fresh :class:`~lightning_zerocopy.sampling.HybridPolicy` over this builder's devices for a pipeline
        producer that samples batches ahead on all of them, or ``None`` for a single-device builder."""
        return self._lanes.policy()

    def expected_size(self, item: PlanItem) -> float:
        """Expected sampled edges (over every edge type) of the batch of ``item``: the hybrid cost models' size, a
        sum over its seeds of every seeded type (a link item's endpoints). Needs the host graph only (no GPU work).

        Raises:
            RuntimeError: the builder is not hybrid (``sampler_placement`` ``hybrid``/``auto`` with a GPU).
            IndexError: a seed id outside its type.
        """
        if self._resources is None:
            self.open(place=False)
        typed = item.typed_seeds
        return self._lanes.expected_size({self.input_type: item.seed_ids} if typed is None else typed)

    def capacity_bound(self, seeds: int) -> None:
        """A pipeline slot's capacity bound per field: none known (per-type bounds are not derived), so the slots
        are sized from the first batch and grow as a batch needs."""
        return None

    def open(self, resources: Optional[DeviceResources] = None, *, place: bool = True) -> "HeteroBatchBuilder":
        """Bind to ``resources`` (``None``: private ones, closed by :meth:`close`) and, for a GPU builder, place its
        GPU side now or (``place=False``) at the first batch. Idempotent.

        Raises:
            ValueError: ``resources`` over other host memory, or the builder is open with other resources.
        """
        if self._resources is None:
            owns = resources is None
            if resources is None:
                resources = DeviceResources(self.handles, self.device_index)
            elif resources.handles != self.handles:
                raise ValueError("`resources` map other host memory than this builder's handles")
            self._resources, self._owns_resources, self._host = resources, owns, resources.host
            self._cpu_sampler = HeteroNeighborSampler(
                self._host.graphs, list(self._host.num_nodes), self.fanouts, replace=self.replace,
                num_threads=self.num_threads, node_keyed=self.node_keyed,
            )  # fmt: skip
            host = self._host
            self._lanes.open(lambda: TypedSampleSizeEstimator.from_graphs(
                {et: (g.indptr, g.indices) for et, g in host.graphs.items()}, host.num_nodes, self.fanouts,
                self.replace))  # fmt: skip
        elif resources is not None and resources is not self._resources:
            raise ValueError("this HeteroBatchBuilder is already open with other resources; close() it first")
        if place and self.on_gpu and self._gpu is None:
            self._place()
        return self

    def _place(self) -> None:
        with self._lock:
            if self._gpu is not None:
                return
            r = self._resources
            assert r is not None and self._host is not None
            what = f"HeteroBatchBuilder(sampler_placement={self.sampler_placement!r}, gather={self.gather!r})"
            device = resolve_cuda_device(r.device_index, what)
            sampler = None
            if self.gpu_sampler_placement != "cpu":
                placement = self.gpu_sampler_placement
                graphs = {et: r.topology(et, placement) for et in self._host.graphs}  # type: ignore[arg-type]
                sampler = HeteroNeighborSampler(
                    graphs, list(self._host.num_nodes), self.fanouts, replace=self.replace,
                    placement=placement, device=device, node_keyed=self.node_keyed,  # type: ignore[arg-type]
                )  # fmt: skip
            features = None
            if self.gather == "zerocopy":
                features = {t: r.feature_table(t, self.gather_mode, self.cache) for t in self._host.features}
            self._gpu = HeteroGpuSide(device=device, sampler=sampler, features=features, labels=r.labels())

    def close(self) -> None:
        """Unbind from the resources (closing them if the builder created them). Idempotent."""
        resources, owns = self._resources, self._owns_resources
        self._lanes.close()
        self._reset()
        if resources is not None and owns:
            resources.close()

    # ---- building ----------------------------------------------------------------------------------------

    def build_batch(self, item: PlanItem, out: Optional[Mapping[str, torch.Tensor]] = None) -> HeteroData:
        """Sample the neighborhood of ``item.seed_ids`` (input-type ids) and gather features and labels.

        ``gather_batch(sample_batch(item))``. ``out`` (preallocated buffers, a pipeline's slots) is not supported
        for heterogeneous batches yet and must be empty.

        Returns:
            A ``HeteroData`` with PyG's hetero ``NeighborLoader`` fields (:mod:`lightning_zerocopy.data.hetero_assemble`).
        """
        return self.gather_batch(self.sample_batch(item), out)

    def sample_batch(self, item: PlanItem, lane: Optional[str] = None) -> HeteroSampledItem:
        """First stage of :meth:`build_batch`: sample (on the current CUDA stream for a GPU builder).

        Args:
            item: the plan item (input-type seeds, or a link item's seeds per endpoint type).
            lane: for a hybrid builder, the device to sample on (one of :attr:`hybrid_lanes`; a pipeline's
                dispatcher names it); ``None`` lets the builder's own cost model pick. The sample is the same.

        Raises:
            ValueError: ``lane`` is not one of this builder's devices.
            IndexError / ValueError: a seed id out of range or repeated (the kernel's checks).
        """
        self._lanes.check_lane(lane)
        if not self.is_open:
            self.open()
        if self._lanes.hybrid and lane is None:
            return self._lanes.run(self.expected_size(item), lambda chosen: self.sample_batch(item, lane=chosen))
        sampler = self._cpu_sampler
        assert sampler is not None
        typed = item.typed_seeds  # a link batch's seeds per endpoint type; None: input-type seeds
        input_type = self.input_type if typed is None else None
        seeds = item.seed_ids if typed is None else typed
        if not self.on_gpu:
            return HeteroSampledItem(item, sampler.sample(seeds, item.batch_seed, input_type), item.input_id)
        gpu = self._gpu
        assert gpu is not None
        with torch.cuda.device(gpu.device):
            if gpu.sampler is None or lane == "cpu":  # CPU sampler, then every id goes over in one pinned copy
                sample = _to_device(sampler.sample(seeds, item.batch_seed, input_type), item.input_id, gpu.device)
                return HeteroSampledItem(item, sample[0], sample[1])
            if typed is None:
                seeds, input_id = to_device_packed([item.seed_ids, item.input_id], gpu.device)
            else:
                *moved, input_id = to_device_packed([*typed.values(), item.input_id], gpu.device)
                seeds = dict(zip(typed, moved))
            return HeteroSampledItem(item, gpu.sampler.sample(seeds, item.batch_seed, input_type), input_id)

    def gather_batch(
        self,
        sampled: HeteroSampledItem,
        out: Optional[Mapping[str, torch.Tensor]] = None,
        *,
        marks: Optional[StageMarks] = None,
    ) -> HeteroData:
        """Second stage of :meth:`build_batch`: gather every featured type's rows and the input type's labels."""
        if out:
            raise ValueError("preallocated `out` buffers are not supported for heterogeneous batches yet")
        if not self.is_open:
            self.open()
        assert self._host is not None
        x_dtype = None if self.x_dtype is None else feature_dtype_of(self.x_dtype)
        if self.on_gpu:
            assert self._gpu is not None
            with torch.cuda.device(self._gpu.device):
                data = assemble_hetero_on_gpu(self._host, self._gpu, sampled, x_dtype, marks)
                return complete_hetero_batch(data, sampled.item, sampled.input_id)
        data = assemble_hetero_on_host(self._host, sampled, x_dtype, marks)
        return complete_hetero_batch(data, sampled.item, sampled.input_id)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_resources", "_owns_resources", "_host", "_cpu_sampler", "_gpu", "_lock"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __repr__(self) -> str:
        return (
            f"HeteroBatchBuilder(edge_types={len(self.fanouts)}, fanouts={self.fanouts}, replace={self.replace}, "
            f"node_keyed={self.node_keyed}, sampler_placement={self.sampler_placement!r}, gather={self.gather!r}, "
            f"x_dtype={self.x_dtype!r}, cache={self.cache!r}, device={self.device_index}, open={self.is_open})"
        )


def _to_device(
    sample: HeteroSampledBatch, input_id: torch.Tensor, device: torch.device
) -> tuple[HeteroSampledBatch, torch.Tensor]:
    """A CPU sample and its ``input_id`` on ``device``: every int64 tensor in one pinned, non-blocking copy."""
    node_types, edge_types = list(sample.n_id), list(sample.edge_index)
    tensors = [sample.n_id[t] for t in node_types] + [sample.edge_index[et] for et in edge_types]
    tensors += [sample.e_id[et] for et in edge_types] + [input_id]
    moved = to_device_packed(tensors, device)
    nodes, rest = moved[: len(node_types)], moved[len(node_types) :]
    edges, e_ids = rest[: len(edge_types)], rest[len(edge_types) : 2 * len(edge_types)]
    placed = HeteroSampledBatch(
        n_id=dict(zip(node_types, nodes)),
        edge_index=dict(zip(edge_types, edges)),
        e_id=dict(zip(edge_types, e_ids)),
        num_sampled_nodes=sample.num_sampled_nodes,
        num_sampled_edges=sample.num_sampled_edges,
        batch_size=sample.batch_size,
        input_type=sample.input_type,
    )
    return placed, moved[-1]
