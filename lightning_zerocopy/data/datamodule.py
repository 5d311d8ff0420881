"""``ZeroCopyDataModule``: a LightningDataModule that samples PyG mini-batches from shared host memory.

Lifecycle (every hook is wiring; the work is in :mod:`~lightning_zerocopy.data.host`, ``plan`` and ``batch``):

* ``prepare_data`` (one process per machine): the dataset builds or converts its on-disk cache, then the node-order
  cache and converted feature file are built next to it (:mod:`~lightning_zerocopy.data.host.prepare`).
* ``setup``: local rank 0 loads the dataset, builds the CSC graph and copies graph, labels, splits and
  features into job-unique shared segments; the segment handles (names only) go to every rank through the
  process group; every rank maps them; callbacks implementing :class:`HostMemoryConsumer` map them in
  their own processes; after a barrier local rank 0 unlinks the names. From then on the memory lives exactly
  as long as some process maps it, so a crash leaks nothing.
* ``*_dataloader``: :class:`~lightning_zerocopy.data.loader.PlanLoader` over this rank's
  :class:`~lightning_zerocopy.data.plan.BatchPlan`, building batches in this process.
* ``transfer_batch_to_device``: moves what is not on the device yet (``non_blocking``); a batch built on the
  GPU (``gather='zerocopy'`` or a GPU sampler) is handed over as it is.
* ``teardown``/``on_exception``: the builders are closed and the process's
  :class:`~lightning_zerocopy.data.resources.DeviceResources` (created in ``setup``) are released: GPU copies
  and caches freed, host registrations undone.

GPU data path (``sampler_placement``, ``gather``, ``gather_mode``, ``hot_rows``): node features stay in host
memory and the GPU reads exactly the rows a mini-batch needs (see :mod:`lightning_zerocopy.data.batch`).
``node_order`` stores graph, features and labels in a locality-preserving internal order, which the batches
never show (see :mod:`lightning_zerocopy.data.host`); ``prepare_data`` builds its disk cache. ``feature_dtype``
stores the feature table in ``bfloat16``/``float16`` (half the bytes over PCIe), ``x_dtype`` says what ``batch.x``
is (``float32`` by default: the rows are cast where the batch is built, so a float32 model runs unchanged).

For other execution paths (a pipeline worker, a custom loop), :meth:`ZeroCopyDataModule.plan` and
:meth:`ZeroCopyDataModule.builder` give the same plan and a picklable, unopened builder; every builder carries
the DataModule's feature-cache spec (:meth:`ZeroCopyDataModule.set_feature_cache`), so every process that builds
batches serves the same rows from GPU memory.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal, Optional, Sequence, Union

import pytorch_lightning as pl
import torch
from torch_geometric.data import Data
from pytorch_lightning.utilities import rank_zero_warn
from typing_extensions import override

from lightning_zerocopy.data.assemble import move_batch
from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.cache.provider import FeatureCacheSpec, HotRowsCache
from lightning_zerocopy.cache.typed_provider import TypedFeatureCache
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.data.gpu_options import KEY_PREFIX, ResolvedGpuOptions, check_gpu_options, resolve_gpu_options
from lightning_zerocopy.data.hooks import HostMemoryConsumer, LoaderFactory, attach_consumers
from lightning_zerocopy.data.host.share import exchange_handles
from lightning_zerocopy.data.host.builder import HostCopyBuilder
from lightning_zerocopy.data.host.prepare import prepare_disk_caches
from lightning_zerocopy.data.loader import PlanLoader
from lightning_zerocopy.data.plan import SPLIT_STREAMS, BatchPlan
from lightning_zerocopy.data.process_group_exit import destroy_process_group_at_exit, run_failed
from lightning_zerocopy.data.resources import DeviceResources
from lightning_zerocopy.data.resume import align_fit_progress
from lightning_zerocopy.data.split_builders import SplitBuilders
from lightning_zerocopy.data.x_dtype_precision import check_x_dtype_fits_precision
from lightning_zerocopy.datasets.base import NodeDataset
from lightning_zerocopy.datasets.splits import check_trainable
from lightning_zerocopy.options import (
    FeatureDtype,
    FeatureStorage,
    GatherChoice,
    GatherMode,
    NodeOrderKind,
    SamplerPlacement,
    check_choice,
    check_loader_options,
)

__all__ = ["GatherChoice", "HostMemoryConsumer", "LoaderFactory", "Split", "ZeroCopyDataModule"]

Split = Literal["train", "val", "test", "predict"]
_KEY = KEY_PREFIX  # how errors name this class's arguments: the recipe's YAML keys


class ZeroCopyDataModule(pl.LightningDataModule):
    """Mini-batches like PyG's ``NeighborLoader``, sampled in-process from host memory shared by all ranks.

    Args:
        dataset: the node-classification dataset (``class_path``/``init_args`` in a recipe).
        fanouts: neighbors sampled per hop for training, e.g. ``[15, 10, 5]``; ``-1`` takes all.
        batch_size: seed nodes per training batch (per rank).
        eval_fanouts: fanouts for validation/test/predict; default: ``fanouts``. Unless every one is ``-1``,
            evaluation samples node-keyed (one sampler seed per split, a node's picks keyed by its id, nodes
            deduplicated per hop), so each node's prediction is the same on any rank count, batch size or order.
        eval_batch_size: seeds per evaluation batch; default: ``batch_size``.
        replace: sample neighbors with replacement.
        shuffle: reshuffle the training seeds every epoch.
        drop_last: drop the training seeds that do not fill a whole batch (and equal rank shares).
        num_threads: threads of the sampling kernel; default: ``torch.get_num_threads()``.
        seed: base seed of the shuffles and of every batch's sampler seed.
        predict_split: the nodes ``predict`` runs on: ``"train"``, ``"val"``, ``"test"`` or ``"all"``. A split is
            sampled as its evaluation samples it (same seed), so ``predict`` outputs equal ``test``'s for test nodes.
        feature_storage: ``"shared_memory"`` (features copied into RAM shared by all local processes) or
            ``"mmap"`` (map the dataset's ``.npy`` feature file; for features larger than RAM).
        sampler_placement: where neighbors are sampled: ``"cpu"`` (C++ threads, default), ``"uva"`` (CUDA
            kernel reading the graph from pinned host memory; needs no GPU memory for the edges) or ``"gpu"``
            (CUDA kernel, graph copied to GPU memory: fastest when it fits), ``"hybrid"`` (per batch on the CPU
            threads or the ``gpu`` kernel, whichever a cost model calibrated on measured times expects to finish
            first; with a :class:`~lightning_zerocopy.callbacks.PipelineCallback` both sample at once) or
            ``"auto"`` (hybrid if both together measure faster, else the faster device). ``uva``/``gpu`` need a
            GPU trainer; ``hybrid``/``auto`` on a CPU trainer say so in one line and sample on the CPU. Every
            placement gives the same batches as ``cpu``.
        gather: how feature rows reach the model: ``"auto"`` (default: ``"zerocopy"`` when the trainer runs on
            a CUDA GPU, else ``"cpu"``), ``"cpu"`` (CPU threads gather, the trainer copies the batch) or
            ``"zerocopy"`` (the GPU reads exactly the batch's rows from pinned host memory; no CPU gather, no
            staging copy). With a GPU sampler or ``"zerocopy"``, batches are built on the GPU.
        gather_mode: read order of the zero-copy gather: ``"auto"`` (time both orders on the first batches and
            keep the faster), ``"direct"`` (batch order) or ``"sorted"`` (address order: fewer pages touched).
        hot_rows: number of feature rows kept in GPU memory (``hot_rows * num_features * bytes per value``),
            chosen as the nodes sampling picks most often (most frequent in-neighbors); ``0`` = none. Needs
            the zero-copy gather; capped at the number of nodes.
        node_order: how nodes are numbered in host memory: ``"none"`` (default: the dataset's ids), ``"bfs"``
            (breadth-first over in-edges: a node's neighbors get nearby ids) or ``"degree"`` (the nodes that
            sampling picks most often, i.e. the highest out-degree, first). With an order, the rows a batch reads
            can share memory pages, so the zero-copy gather touches fewer pages (the lever for narrow rows; how
            much depends on the graph's locality: measure with ``benchmarks/micro/gather.py --pages-only``). The graph,
            features and labels are relabeled once when the host memory is built (cached on disk next to the
            dataset's cache when it has one); batches are the same as with ``"none"`` in meaning -- ``n_id`` and
            ``e_id`` are the dataset's ids, ``x``/``y`` their rows, same seeds per step, ``input_id`` unchanged --
            but the sampled neighbors themselves differ (same distribution: the sampler's random draws are keyed
            by position in the renumbered adjacency).
        check_features: scan the features once at setup for NaN/inf (an error naming node and column; a memory-mapped
            table is read once from disk); ``false`` skips it.
        feature_dtype: the dtype of the feature table in host memory: ``"float32"``, ``"bfloat16"`` or ``"float16"``
            (half the host memory, and half the bytes every gather moves over PCIe); default: the dataset's own
            (float32 unless the dataset converts its features, e.g. ``SyntheticGraph(feature_dtype='float16')``).
            The cast happens once, when the host copy is built (a progress bar shows a long one): ``shared_memory``
            casts into the shared segment, ``mmap`` maps a converted copy of the feature file built once per machine
            next to the dataset's cache (its directory names the dtype). Every cache of rows on the GPU (``hot_rows``,
            the Strategy's shards) holds this dtype too. A finite value the dtype cannot hold (above 65504 in
            ``float16``) fails the setup, naming the node and column.
        x_dtype: the dtype of ``batch.x``: ``"float32"`` (default: the rows are cast where the batch is built, on the
            GPU for a GPU batch, so a float32 model runs unchanged whatever ``feature_dtype`` is), ``"bfloat16"``,
            ``"float16"``, or ``null`` to keep ``feature_dtype`` (no cast: for a model that runs in that dtype, e.g.
            ``precision: bf16-true``, which does not cast a PyG batch's ``x`` itself).
        allow_split_overlap: train on a dataset whose val or test split holds training nodes (their labels leak
            into the scores), with a warning; by default ``setup`` refuses it, naming how many and the first.
    """

    def __init__(
        self,
        dataset: NodeDataset,
        fanouts: Sequence[int] = (10, 10),
        batch_size: int = 512,
        eval_fanouts: Optional[Sequence[int]] = None,
        eval_batch_size: Optional[int] = None,
        replace: bool = False,
        shuffle: bool = True,
        drop_last: bool = False,
        num_threads: Optional[int] = None,
        seed: int = 0,
        predict_split: Literal["train", "val", "test", "all"] = "test",
        feature_storage: FeatureStorage = "shared_memory",
        sampler_placement: SamplerPlacement = "cpu",
        gather: GatherChoice = "auto",
        gather_mode: GatherMode = "auto",
        hot_rows: int = 0,
        node_order: NodeOrderKind = "none",
        check_features: bool = True,
        feature_dtype: Optional[FeatureDtype] = None,
        x_dtype: Optional[FeatureDtype] = "float32",
        allow_split_overlap: bool = False,
    ) -> None:
        super().__init__()
        # a bad recipe fails here, before any data is built
        check_loader_options(batch_size, eval_batch_size, num_threads, fanouts, eval_fanouts, _KEY)
        check_choice(feature_storage, FeatureStorage, _KEY + "feature_storage")
        check_choice(node_order, NodeOrderKind, _KEY + "node_order")
        for key, value in (("feature_dtype", feature_dtype), ("x_dtype", x_dtype)):
            if value is not None:
                check_choice(value, FeatureDtype, _KEY + key)
        check_gpu_options(sampler_placement, gather, gather_mode, hot_rows)
        self.dataset = dataset
        self.fanouts = list(fanouts)
        self.batch_size = int(batch_size)
        self.eval_fanouts = list(eval_fanouts) if eval_fanouts is not None else list(fanouts)
        self.eval_batch_size = int(eval_batch_size) if eval_batch_size is not None else self.batch_size
        self._eval_node_keyed = any(f >= 0 for f in self.eval_fanouts)  # all -1: a batch's own sample is exact
        self.replace = replace
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.num_threads = num_threads
        self.seed = seed
        self.predict_split = predict_split
        self.feature_storage: FeatureStorage = feature_storage
        self.sampler_placement: SamplerPlacement = sampler_placement
        self.gather: GatherChoice = gather
        self.gather_mode: GatherMode = gather_mode
        self.hot_rows = int(hot_rows)
        self.node_order: NodeOrderKind = node_order
        self.feature_dtype: Optional[FeatureDtype] = feature_dtype
        self.x_dtype: Optional[FeatureDtype] = x_dtype
        self._gpu: Optional[ResolvedGpuOptions] = None  # decided in setup, from the trainer
        self._feature_cache: Optional[FeatureCacheSpec] = HotRowsCache(self.hot_rows) if self.hot_rows > 0 else None

        self._handles: Optional[HostGraphHandles] = None
        self._resources: Optional[DeviceResources] = None  # this process's placement, from setup to teardown
        self._builders = SplitBuilders()
        self._attaching = False  # inside setup, while HostMemoryConsumers attach (set_feature_cache allowed)
        self._splits: dict[str, torch.Tensor] = {}
        # keeps the split check and an in-memory node order across setups (fit, then test, in one process)
        opt_out = _KEY + "check_features: false"
        self.allow_split_overlap = bool(allow_split_overlap)
        self._host_copy = HostCopyBuilder(dataset, feature_storage, node_order, _KEY + "dataset", check_features, opt_out,
                                          feature_dtype=feature_dtype, dtype_key=_KEY + "feature_dtype",
                                          allow_split_overlap=self.allow_split_overlap,
                                          overlap_opt_out=_KEY + "allow_split_overlap: true",
                                          x_dtype=x_dtype, x_dtype_key=_KEY + "x_dtype")  # fmt: skip
        self._loader_factory: Optional[LoaderFactory] = None

    # ---- shapes the model needs (LightningCLI links them into the model's init args) -------------------------

    @property
    def num_features(self) -> int:
        """Node feature width of the dataset."""
        return self.dataset.num_features

    @property
    def num_classes(self) -> int:
        """Number of classes of the dataset."""
        return self.dataset.num_classes

    # ---- Lightning hooks -----------------------------------------------------------------------------------

    @override
    def prepare_data(self) -> None:
        self.dataset.prepare()
        # the node-order cache and the converted feature file, once per machine like the dataset (host/prepare.py)
        dtype_key = _KEY + "feature_dtype"
        prepare_disk_caches(self.dataset, self.node_order, self.feature_storage, self.feature_dtype, dtype_key)

    @override
    def setup(self, stage: Optional[str] = None) -> None:
        if self._handles is not None:
            return
        self._gpu_options(fresh=True)  # a GPU option on a CPU trainer fails before any data is built
        if self._trainer_or_none() is not None:  # so does an x dtype the model cannot take
            check_x_dtype_fits_precision(self.x_dtype, self.feature_dtype, self.trainer.precision, _KEY)
        rank, local_rank, world_size = self._ranks()
        destroy_process_group_at_exit()  # a gloo group left to the interpreter's teardown could abort the exit
        created = self._host_copy.share() if local_rank == 0 else None
        try:
            handles = exchange_handles(created, rank, local_rank, world_size)
            self._open(handles)
            trainer = self._trainer_or_none()
            if trainer is not None:
                self._attaching = True  # set_feature_cache is allowed meanwhile
                try:
                    attach_consumers(trainer, self)
                finally:
                    self._attaching = False
                trainer.strategy.barrier("zerocopy_host_memory_mapped")
        finally:
            self._host_copy.unlink_names()  # every local process has mapped the memory (or setup failed)

    @override
    def teardown(self, stage: Optional[str] = None) -> None:
        self._release()

    @override
    def on_exception(self, exception: BaseException) -> None:
        run_failed(exception)  # (data/process_group_exit.py)
        self._release()

    @override
    def train_dataloader(self) -> Iterable[Data]:
        return self._loader("train")

    @override
    def val_dataloader(self) -> Iterable[Data]:
        return self._loader("val")

    @override
    def test_dataloader(self) -> Iterable[Data]:
        return self._loader("test")

    @override
    def predict_dataloader(self) -> Iterable[Data]:
        return self._loader("predict")

    def use_loader_factory(self, factory: Optional[LoaderFactory]) -> None:
        """Have the ``*_dataloader`` hooks return ``factory(split, loader)`` instead of the plain loader.

        The hook a component uses to take over where batches are built without changing them (e.g.
        :class:`~lightning_zerocopy.callbacks.PipelineCallback` wraps each loader so a producer builds its batches
        ahead of the step). ``loader`` is the :class:`PlanLoader` the hook would return; the factory returns any
        iterable with the same length and batches. ``None`` restores the plain loaders.
        """
        if factory is not None and not callable(factory):
            raise TypeError(f"`factory` must be callable as factory(split, loader) or None, got {type(factory).__name__}")
        self._loader_factory = factory

    @property
    def loader_factory(self) -> Optional[LoaderFactory]:
        """The factory set by :meth:`use_loader_factory`, or ``None``."""
        return self._loader_factory

    def _loader(self, split: Split) -> Iterable[Data]:
        plan = self.plan(split)  # checks that setup ran
        if split == "train":  # with no batch Lightning only warns "No training batches" and exits 0
            check_trainable(len(plan), plan.input_nodes.numel(), self.dataset.split_source("train"), _KEY, plan.world_size)
        trainer = self._trainer_or_none()  # a resume on another world size moves its batch count (resume.py)
        on_resume = (lambda step: align_fit_progress(trainer, step)) if split == "train" and trainer is not None else None
        loader = PlanLoader(plan, self._builders[split], on_resume)
        return loader if self._loader_factory is None else self._loader_factory(split, loader)

    @override
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        if isinstance(batch, Data):
            return move_batch(batch, device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    # ---- the data contract for other execution paths -------------------------------------------------------

    def plan(self, split: Split, rank: Optional[int] = None, world_size: Optional[int] = None) -> BatchPlan:
        """The batch plan of ``split`` for ``rank`` of ``world_size`` (default: this process's rank).

        ``predict`` over ``predict_split`` ``"val"`` or ``"test"`` samples with that split's seed, so a node gets the
        same sample, and the same output, from ``predict`` as from ``validate``/``test``.

        Raises:
            RuntimeError: before :meth:`setup`.
        """
        if rank is None or world_size is None:
            rank, _, world_size = self._ranks()
        is_train = split == "train"
        return BatchPlan(
            self._input_nodes(split),
            self.batch_size if is_train else self.eval_batch_size,
            shuffle=self.shuffle if is_train else False,
            drop_last=self.drop_last if is_train else False,
            seed=self.seed,
            rank=rank,
            world_size=world_size,
            stream=self._stream(split),
            sampler_seed=self._sampler_seed(split),
        )

    def _stream(self, split: Split) -> int:
        """The random stream of ``split``'s plan: ``predict`` takes the stream of the split it predicts (``all`` has
        one of its own), so an evaluated item's sample depends on the item and its split's seed only, not on the
        command that asks for it."""
        if split == "predict" and self.predict_split in SPLIT_STREAMS:
            return SPLIT_STREAMS[self.predict_split]
        return SPLIT_STREAMS[split]

    def _sampler_seed(self, split: Split) -> Literal["batch", "split"]:
        """``"split"`` (one sampler seed per split, node-keyed sampling) for val/test/predict, else ``"batch"``."""
        return "split" if split != "train" and self._eval_node_keyed else "batch"

    def builder(self, split: Split) -> BatchBuilder:
        """A new, unopened (picklable) builder for ``split``; call ``.open()`` in the process that uses it.

        Raises:
            RuntimeError: before :meth:`setup`.
        """
        handles = self._require_setup()
        fanouts = self.fanouts if split == "train" else self.eval_fanouts
        gpu = self._gpu_options()
        return BatchBuilder(
            handles,
            fanouts,
            replace=self.replace,
            num_threads=self.num_threads,
            sampler_placement=gpu.placement,  # type: ignore[arg-type]
            gather=gpu.gather,  # type: ignore[arg-type]
            gather_mode=self.gather_mode,
            cache=self._feature_cache,
            device=gpu.device_index,
            node_keyed=split != "train" and self._eval_node_keyed,
            x_dtype=self.x_dtype,
        )

    @property
    def feature_cache(self) -> Optional[FeatureCacheSpec]:
        """The GPU feature cache every builder of this DataModule serves rows from (``hot_rows`` by default)."""
        return self._feature_cache

    def set_feature_cache(self, spec: Union[FeatureCacheSpec, TypedFeatureCache, None]) -> None:
        """Serve feature rows from the GPU cache ``spec`` describes, in every process that builds batches.

        The extension point for cache providers (e.g. a Strategy's replicated or sharded hot rows): ``spec`` is a
        picklable, hashable :class:`~lightning_zerocopy.cache.provider.FeatureCacheSpec` (or a Strategy's
        :class:`~lightning_zerocopy.cache.typed_provider.TypedFeatureCache`, by node type); each process's
        :class:`~lightning_zerocopy.data.resources.DeviceResources` opens it once. Call it before ``setup``, or
        during it from a :class:`HostMemoryConsumer`'s ``attach_host_memory`` (the strategy's runs first, before any
        callback hands builders to a worker; a cache built from the host memory, like ZeroCopyDDPStrategy's, can
        only be made then). It replaces the ``hot_rows`` cache.

        Raises:
            TypeError: ``spec`` has no ``open(context)``.
            RuntimeError: after ``setup`` (builders already carry the previous spec).
        """
        if spec is not None and not isinstance(spec, (FeatureCacheSpec, TypedFeatureCache)):
            raise TypeError(f"`spec` must be a FeatureCacheSpec (with open(context)), got {type(spec).__name__}")
        if self._handles is not None and not self._attaching:
            raise RuntimeError(
                "set_feature_cache() must be called before ZeroCopyDataModule.setup() or from attach_host_memory"
            )
        self._feature_cache = spec
        if self._handles is not None:  # during setup: nothing is placed yet, the builders take the new spec
            self._bind_builders()

    @property
    def resources(self) -> Optional[DeviceResources]:
        """This process's :class:`DeviceResources` (from ``setup`` to ``teardown``; ``None`` outside)."""
        return self._resources

    @property
    def uses_zerocopy_gather(self) -> bool:
        """Whether the GPU gathers feature rows from host memory (``gather`` resolved to ``"zerocopy"``), which is
        what a GPU feature cache serves.

        Raises:
            RuntimeError: before :meth:`setup`.
        """
        self._require_setup()
        return self._gpu_options().gather == "zerocopy"

    @property
    def batch_device_type(self) -> str:
        """``"cuda"`` when batches are built on the GPU (a GPU sampler or the zero-copy gather), else ``"cpu"``.

        Raises:
            RuntimeError: before :meth:`setup` (``gather="auto"`` is decided there).
        """
        self._require_setup()
        return self._gpu_options().batch_device_type

    def sampling_stats(self, split: Split) -> Optional[Any]:
        """Where the in-process loader's hybrid builder sampled the batches of ``split`` so far (batches and
        predicted/measured seconds per device; see ``HybridStats``), or ``None`` (not hybrid, or no batch yet).
        With a pipeline the producer places the batches, and its client reports them instead."""
        return self._builders.sampling_stats(split)

    @property
    def handles(self) -> HostGraphHandles:
        """Names of the shared host memory (valid for opening only until ``setup`` returns)."""
        return self._require_setup()

    # ---- internals -----------------------------------------------------------------------------------------

    def _trainer_or_none(self) -> Optional["pl.Trainer"]:
        return getattr(self, "trainer", None)

    def _gpu_options(self, fresh: bool = False) -> ResolvedGpuOptions:
        """Placement, ``gather='auto'`` and the CUDA device as they run under the trainer (decided in setup)."""
        if fresh or self._gpu is None:
            trainer = self._trainer_or_none()
            root = trainer.strategy.root_device if trainer is not None else None
            self._gpu = resolve_gpu_options(self.sampler_placement, self.gather, self.hot_rows, root)
        return self._gpu

    def _ranks(self) -> tuple[int, int, int]:
        trainer = self._trainer_or_none()
        if trainer is None:
            return 0, 0, 1
        return trainer.global_rank, trainer.local_rank, trainer.world_size

    def _open(self, handles: HostGraphHandles) -> None:
        self._handles = handles
        self._splits = {name: handle.open() for name, handle in handles.splits.items()}
        # map the host memory now (the names go away after setup); the GPU side (registrations, caches) is placed
        # by the first batch built here (a pipeline worker builds with resources of its own)
        self._resources = DeviceResources(handles, self._gpu_options().device_index)
        self._bind_builders()

    def _bind_builders(self) -> None:
        assert self._resources is not None
        like_train = self.eval_fanouts == self.fanouts and not self._eval_node_keyed
        self._builders.open(self.builder, self._resources, eval_like_train=like_train)

    def _release(self) -> None:
        self._host_copy.unlink_names()
        self._builders.close()  # unbinds (the resources below are this DataModule's)
        resources, self._resources = self._resources, None
        if resources is not None:
            try:
                resources.close()  # GPU copies and caches, host registrations (idempotent)
            except Exception as exc:  # noqa: BLE001 - releasing must not mask the run's own outcome
                rank_zero_warn(f"releasing the data path's GPU resources failed: {exc!r}")
        self._handles = None
        self._splits = {}

    def _require_setup(self) -> HostGraphHandles:
        if self._handles is None:
            raise RuntimeError("ZeroCopyDataModule is not set up: call setup() (the Trainer does) first")
        return self._handles

    def _input_nodes(self, split: Split) -> torch.Tensor:
        self._require_setup()
        if split == "predict":
            if self.predict_split == "all":
                return torch.arange(self._handles.graph.num_nodes)  # type: ignore[union-attr]
            return self._splits[self.predict_split]
        return self._splits[split]

