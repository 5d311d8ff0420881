"""The one DataModule core, :class:`GraphDataModule`: the Lightning hooks of every graph and task. The graph's types are its
:class:`~lightning_zerocopy.graph.schema.GraphSchema` (an untyped graph is the one-type case) and what it predicts is
a composed task (:class:`~lightning_zerocopy.data.tasks.NodeTask` / :class:`~lightning_zerocopy.data.tasks.LinkTask`:
the seeds, the plan, the link fields). The four public DataModules are constructors only, as PyG's ``NeighborLoader``
is over ``NodeLoader``: ``ZeroCopyDataModule`` (node, untyped), ``ZeroCopyLinkDataModule`` (link, untyped),
``ZeroCopyHeteroDataModule`` (node, typed), ``ZeroCopyHeteroLinkDataModule`` (link, typed), each with the arguments
a recipe gives it.

Lifecycle (every hook is wiring; the work is in :mod:`~lightning_zerocopy.data.host`, ``tasks``, ``plan``, ``batch``):
``prepare_data`` (once per machine) builds the dataset's and the host copy's disk caches; ``setup``: local rank 0
builds the host copy (one CSC per edge type, a table per featured type, labels, splits) in job-unique shared
segments, every rank maps them through the exchanged handles, :class:`HostMemoryConsumer` s map them in their own
processes, and after a barrier the names are unlinked (the memory lives exactly as long as some process maps it, so a
crash leaks nothing); ``*_dataloader`` returns a :class:`~lightning_zerocopy.data.loader.PlanLoader` over this rank's
plan; ``transfer_batch_to_device`` hands a batch built on the GPU over as it is; ``teardown``/``on_exception`` close
the builders and release this process's :class:`~lightning_zerocopy.data.resources.DeviceResources`.

For other execution paths (a pipeline worker, a custom loop), :meth:`GraphDataModule.plan` and
:meth:`GraphDataModule.builder` give the same plan and a picklable, unopened builder; every builder carries the
DataModule's feature-cache spec (:meth:`GraphDataModule.set_feature_cache`), so every process that builds batches
serves the same rows from GPU memory. What other components read by type: :attr:`~GraphDataModule.schema`,
:attr:`~GraphDataModule.feature_widths` (feature width per featured node type, cheap) and, after ``setup``,
``resources.host.tables`` / ``resources.host.graphs`` (the host tables by node type, the CSCs by edge type).
"""

from __future__ import annotations

from typing import Any, Iterable, Literal, Optional, Union

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch_geometric.data import Data, HeteroData
from typing_extensions import override

from lightning_zerocopy.cache.provider import FeatureCacheSpec, HotRowsCache
from lightning_zerocopy.data.assemble import move_batch
from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.data.gpu_options import KEY_PREFIX, ResolvedGpuOptions, check_gpu_options, resolve_gpu_options
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.data.hooks import HostMemoryConsumer, LoaderFactory, attach_consumers, check_typed_consumers
from lightning_zerocopy.data.host.builder import HostCopyBuilder
from lightning_zerocopy.data.host.prepare import prepare_disk_caches
from lightning_zerocopy.data.host.share import exchange_handles
from lightning_zerocopy.data.layerwise_plan import layerwise_pass_loader
from lightning_zerocopy.data.layerwise_options import LayerwiseOptions, PredictMode, layerwise_placement
from lightning_zerocopy.data.loader import PlanLoader
from lightning_zerocopy.data.process_group_exit import destroy_process_group_at_exit, run_failed
from lightning_zerocopy.data.resources import DeviceResources
from lightning_zerocopy.data.resume import align_fit_progress
from lightning_zerocopy.data.split_builders import SplitBuilders
from lightning_zerocopy.data.tasks import LinkTask, NodeTask
from lightning_zerocopy.data.x_dtype_precision import check_x_dtype_fits_precision
from lightning_zerocopy.datasets.attributes import AttributeChoice, check_attribute_choice
from lightning_zerocopy.datasets.splits import check_trainable
from lightning_zerocopy.graph.schema import NODE, GraphSchema
from lightning_zerocopy.options import (FeatureDtype, FeatureStorage, GatherChoice, GatherMode, NodeOrderKind,
                                        SamplerPlacement, check_choice, check_count)  # fmt: skip

__all__ = ["GraphDataModule", "Split", "passed_on"]

Split = Literal["train", "val", "test", "predict"]
_KEY = KEY_PREFIX  # how errors name this class's arguments: the recipe's YAML keys
#: The arguments the public DataModules take under :class:`GraphDataModule`'s names and pass on as given.
_PASSED_ON = ("batch_size", "eval_batch_size", "replace", "shuffle", "drop_last", "num_threads", "seed",
              "predict_split", "feature_storage", "sampler_placement", "gather", "gather_mode", "hot_rows",
              "node_order", "check_features", "feature_dtype", "x_dtype", "allow_split_overlap", "attributes",
              "predict_mode", "layerwise")  # fmt: skip


def passed_on(arguments: dict[str, Any]) -> dict[str, Any]:
    """What a public DataModule's constructor passes on to :class:`GraphDataModule` as given: those of its
    ``arguments`` (its ``locals()``) that :class:`GraphDataModule` takes under the same name (the others it resolves:
    the dataset's types, the task, the fanouts)."""
    return {name: arguments[name] for name in _PASSED_ON if name in arguments}


class GraphDataModule(pl.LightningDataModule):
    """Mini-batches like PyG's loaders, sampled from host memory shared by all ranks: the one core of the four
    public DataModules (which pass it the schema, the task and the fanouts they resolved; see the module docstring).

    Args:
        dataset: the dataset (node or link, untyped or typed).
        task: what a batch predicts (:class:`~lightning_zerocopy.data.tasks.NodeTask` or ``LinkTask``).
        schema: the dataset's types (cheap: from its shape properties).
        fanouts, eval_fanouts: neighbors per hop for training / evaluation (a list, or for a typed graph a list per
            edge type); unless every evaluation fanout is ``-1``, evaluation samples node-keyed.
        The other arguments: as :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` documents them.
    """

    def __init__(
        self, dataset: Any, task: Union[NodeTask, LinkTask], *, schema: GraphSchema, fanouts: Any, eval_fanouts: Any,
        batch_size: int, eval_batch_size: Optional[int], replace: bool, shuffle: bool, drop_last: bool,
        num_threads: Optional[int], seed: int, predict_split: str, feature_storage: FeatureStorage,
        sampler_placement: SamplerPlacement, gather: GatherChoice, gather_mode: GatherMode, hot_rows: int = 0,
        node_order: NodeOrderKind, check_features: bool, feature_dtype: Optional[FeatureDtype],
        x_dtype: Optional[FeatureDtype], allow_split_overlap: bool = False, attributes: AttributeChoice = "all",
        predict_mode: PredictMode = "sampled", layerwise: Optional[LayerwiseOptions] = None,
    ) -> None:  # fmt: skip
        super().__init__()
        check_count(batch_size, _KEY + "batch_size", minimum=1)
        check_count(eval_batch_size, _KEY + "eval_batch_size", minimum=1, allow_none=True)
        check_count(num_threads, _KEY + "num_threads", minimum=1, allow_none=True)
        check_choice(feature_storage, FeatureStorage, _KEY + "feature_storage")
        check_choice(node_order, NodeOrderKind, _KEY + "node_order")
        for key, value in (("feature_dtype", feature_dtype), ("x_dtype", x_dtype)):
            if value is not None:
                check_choice(value, FeatureDtype, _KEY + key)
        check_gpu_options(sampler_placement, gather, gather_mode, hot_rows)
        check_attribute_choice(attributes, _KEY + "attributes")
        self.dataset, self.task, self.schema = dataset, task, schema
        self.fanouts, self.eval_fanouts = fanouts, eval_fanouts
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size) if eval_batch_size is not None else self.batch_size
        lists = eval_fanouts.values() if schema.is_typed else [eval_fanouts]
        self._eval_node_keyed = any(f >= 0 for fs in lists for f in fs)  # all -1: a batch's own sample is exact
        self.replace, self.shuffle, self.drop_last = replace, shuffle, drop_last
        self.num_threads, self.seed, self.predict_split = num_threads, seed, predict_split
        self.feature_storage: FeatureStorage = feature_storage
        self.sampler_placement: SamplerPlacement = sampler_placement
        self.gather: GatherChoice = gather
        self.gather_mode: GatherMode = gather_mode
        self.hot_rows = int(hot_rows)
        self.node_order: NodeOrderKind = node_order
        self.feature_dtype: Optional[FeatureDtype] = feature_dtype
        self.x_dtype: Optional[FeatureDtype] = x_dtype
        self.allow_split_overlap = bool(allow_split_overlap)
        self.attributes = attributes if isinstance(attributes, str) else list(attributes)
        self.predict_mode, self.layerwise = predict_mode, layerwise or LayerwiseOptions()  # layerwise: data/layerwise.py
        self._gpu: Optional[ResolvedGpuOptions] = None  # decided in setup, from the trainer
        self._feature_cache: Optional[Any] = HotRowsCache(self.hot_rows) if self.hot_rows > 0 else None
        self._handles: Optional[HostGraphHandles] = None
        self._resources: Optional[DeviceResources] = None  # this process's placement, from setup to teardown
        self._builders = SplitBuilders()
        self._attaching = False  # inside setup, while HostMemoryConsumers attach (set_feature_cache allowed)
        self.split_tensors: dict[str, torch.Tensor] = {}  # the shared split tensors, by name (after setup)
        # keeps the checks and an in-memory node order across setups (fit, then test, in one process)
        self._host_copy = HostCopyBuilder(
            dataset, feature_storage, node_order, _KEY + "dataset", check_features, _KEY + "check_features: false",
            feature_dtype=feature_dtype, dtype_key=_KEY + "feature_dtype", allow_split_overlap=self.allow_split_overlap,
            overlap_opt_out=_KEY + "allow_split_overlap: true", link=task.link, typed=schema.is_typed,
            x_dtype=x_dtype, x_dtype_key=_KEY + "x_dtype", attributes=self.attributes, attributes_key=_KEY + "attributes",
        )  # fmt: skip
        self._loader_factory: Optional[LoaderFactory] = None

    # ---- shapes the model needs (LightningCLI links them into the model's init args) -------------------------

    @property
    def num_features(self) -> Any:
        """Node feature width of the dataset (an int; for a typed graph a dict of each featured node type's)."""
        return self.dataset.num_features

    @property
    def feature_widths(self) -> dict[str, int]:
        """Feature width of each featured node type (an untyped graph's under its one type)."""
        widths = self.dataset.num_features
        return dict(widths) if self.schema.is_typed else {NODE: int(widths)}

    # ---- Lightning hooks -----------------------------------------------------------------------------------

    @override
    def prepare_data(self) -> None:
        self.dataset.prepare()
        # the node-order cache and converted feature files, once per machine like the dataset (host/prepare.py)
        dtype_key = _KEY + "feature_dtype"
        prepare_disk_caches(self.dataset, self.node_order, self.feature_storage, self.feature_dtype, dtype_key)

    @override
    def setup(self, stage: Optional[str] = None) -> None:
        if self._handles is not None:
            return
        trainer = self._trainer_or_none()
        if trainer is not None:
            self.check_consumers(trainer)
        self._gpu_options(fresh=True)  # a GPU option on a CPU trainer fails before any data is built
        if trainer is not None:  # so does an x dtype the model cannot take
            check_x_dtype_fits_precision(self.x_dtype, self.feature_dtype, trainer.precision, _KEY)
        rank, local_rank, world_size = self._ranks()
        destroy_process_group_at_exit()  # a gloo group left to the interpreter's teardown could abort the exit
        created = self._host_copy.share() if local_rank == 0 else None
        try:
            handles = exchange_handles(created, rank, local_rank, world_size)
            self._open(handles)
            if trainer is not None:
                self._attaching = True  # set_feature_cache is allowed meanwhile
                try:
                    attach_consumers(trainer, self)
                finally:
                    self._attaching = False
                trainer.strategy.barrier("zerocopy_host_memory_mapped")
        finally:
            self._host_copy.unlink_names()  # every local process has mapped the memory (or setup failed)

    def check_consumers(self, trainer: Any) -> None:
        """Refuse a host-memory consumer of ``trainer`` that does not take typed builders (a typed graph only; see
        :func:`~lightning_zerocopy.data.hooks.check_typed_consumers`); ``setup`` calls it, and
        ``ZeroCopyDDPStrategy``'s launcher before it starts a rank.

        Raises:
            RecipeError: one line naming the consumer and what to change.
        """
        if self.schema.is_typed:
            check_typed_consumers(trainer)

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
        if self.predict_mode == "layerwise":  # one step: the pass, run by LayerwisePredictionWriter
            self._require_setup()
            return layerwise_pass_loader(self._trainer_or_none())
        return self._loader("predict")

    def use_loader_factory(self, factory: Optional[LoaderFactory]) -> None:
        """Have the ``*_dataloader`` hooks return ``factory(split, loader)`` instead of the plain loader.

        The hook a component uses to take over where batches are built without changing them (e.g.
        :class:`~lightning_zerocopy.callbacks.PipelineCallback`: a producer builds them ahead of the step); the
        factory returns an iterable with the loader's length and batches. ``None`` restores the plain loaders.
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
        if isinstance(batch, (Data, HeteroData)):
            return move_batch(batch, device)  # type: ignore[arg-type]
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    # ---- the data contract for other execution paths -------------------------------------------------------

    def plan(self, split: Split, rank: Optional[int] = None, world_size: Optional[int] = None) -> Any:
        """The task's batch plan of ``split`` for ``rank`` of ``world_size`` (default: this process's rank): a
        :class:`~lightning_zerocopy.data.plan.BatchPlan` of seed nodes or a ``LinkBatchPlan`` of supervision edges;
        ``predict`` samples ``predict_split`` with that split's seed (the same outputs as ``validate``/``test``).

        Raises:
            RuntimeError: before :meth:`setup`.
            ValueError: a link dataset without the split, or a split that cannot make batches (naming why).
        """
        self._require_setup()
        if rank is None or world_size is None:
            rank, _, world_size = self._ranks()
        return self.task.plan(self, split, rank, world_size)

    def builder(self, split: Split, fanouts: Any = None, *, layerwise: bool = False) -> BatchBuilder:
        """A new, unopened (picklable) builder for ``split`` (given ``fanouts``, e.g. ``[-1]``: those, not node-keyed;
        ``layerwise``: a layer-wise pass's, every in-neighbor on ``layerwise.sampler_placement``'s placement); call
        ``.open()`` in the process that uses it.

        Raises:
            RuntimeError: before :meth:`setup`.
        """
        handles, gpu = self._require_setup(), self._gpu_options()
        placement = gpu.placement
        if layerwise:
            fanouts = {et: [-1] for et in self.schema.edge_types} if self.schema.is_typed else [-1]
            placement = layerwise_placement(self.layerwise.sampler_placement, gpu.placement, gpu.gather, gpu.device_index)
        return BatchBuilder(
            handles,
            fanouts if fanouts is not None else self.fanouts if split == "train" else self.eval_fanouts,
            replace=self.replace,
            num_threads=self.num_threads,
            sampler_placement=placement,  # type: ignore[arg-type]
            gather=gpu.gather,  # type: ignore[arg-type]
            gather_mode=self.gather_mode,
            cache=self._feature_cache,
            device=gpu.device_index,
            node_keyed=split != "train" and self._eval_node_keyed and fanouts is None,
            x_dtype=self.x_dtype,
        )

    @property
    def feature_cache(self) -> Optional[Any]:
        """The GPU feature cache every builder of this DataModule serves rows from (``hot_rows`` by default)."""
        return self._feature_cache

    def set_feature_cache(self, spec: Optional[Any]) -> None:
        """Serve feature rows from the GPU cache ``spec`` describes, in every process that builds batches.

        ``spec``: a picklable, hashable :class:`~lightning_zerocopy.cache.provider.FeatureCacheSpec` (e.g. a Strategy's
        replicated or sharded hot rows), or for a typed graph one spec per node type (``provider(node_type)``, the
        Strategy's ``TypedFeatureCache``); each process's ``DeviceResources`` opens it once per table. Call it before
        ``setup``, or from a :class:`HostMemoryConsumer`'s ``attach_host_memory`` (the strategy's runs first). It
        replaces the ``hot_rows`` cache.

        Raises:
            TypeError: ``spec`` has no ``open(context)``.
            ValueError: a cache of one table for a typed graph (one per node type is needed).
            RuntimeError: after ``setup`` (builders already carry the previous spec).
        """
        per_type = callable(getattr(spec, "provider", None))
        if spec is not None and self.schema.is_typed and not per_type:
            raise ValueError("a heterogeneous DataModule takes a GPU feature cache per node type (a "
                             f"TypedFeatureCache, ZeroCopyDDPStrategy's cache_budget), not {type(spec).__name__}")  # fmt: skip
        if spec is not None and not per_type and not isinstance(spec, FeatureCacheSpec):
            raise TypeError(f"`spec` must be a FeatureCacheSpec (with open(context)), got {type(spec).__name__}")
        if self._handles is not None and not self._attaching:
            raise RuntimeError(
                f"set_feature_cache() must be called before {type(self).__name__}.setup() or from attach_host_memory"
            )
        self._feature_cache = spec
        if self._handles is not None:  # during setup: nothing is placed yet, the builders take the new spec
            self._bind_builders()

    @property
    def resources(self) -> Optional[DeviceResources]:
        """This process's :class:`DeviceResources` (from ``setup`` to ``teardown``; ``None`` outside)."""
        return self._resources

    @property
    def feature_row_bytes(self) -> Optional[dict[str, int]]:
        """Bytes of one row of each featured type's host table of a typed graph (its dtype after ``feature_dtype``):
        what a batch reads from host memory per sampled node of that type where no GPU cache serves it
        (``DataTelemetry``'s ``data/host_bytes_<type>``); ``None`` for an untyped graph (no per-type figures).

        Raises:
            RuntimeError: before :meth:`setup` (the host tables are mapped there).
        """
        self._require_setup()
        assert self._resources is not None
        tables = self._resources.host.tables
        return {t: int(table.row_bytes) for t, table in tables.items()} if self.schema.is_typed else None

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
        self.split_tensors = {name: handle.open() for name, handle in handles.splits.items()}
        # map the host memory now (the names go away after setup); the GPU side (registrations, caches) is placed
        # by the first batch built here (a pipeline worker builds with resources of its own)
        self._resources = DeviceResources(handles, self._gpu_options().device_index)
        self._bind_builders()
        try:
            self.task.open(self)  # a link task's splits and negatives; a split no batch can be made of fails here
        except Exception:
            self._release()  # nothing stays mapped or placed; the caller unlinks the names
            raise

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
        self.split_tensors = {}
        self.task.close()

    def _require_setup(self) -> HostGraphHandles:
        if self._handles is None:
            raise RuntimeError(f"{type(self).__name__} is not set up: call setup() (the Trainer does) first")
        return self._handles
