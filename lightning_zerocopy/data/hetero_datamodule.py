"""``ZeroCopyHeteroDataModule``: heterogeneous node-classification batches like PyG's hetero ``NeighborLoader``.

It *is* a :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` (same setup and handle exchange, plans,
loaders, split builders, teardown) whose host copy is typed (:mod:`lightning_zerocopy.data.host.hetero`: one CSC per
edge type, features per featured type), whose resources are
:class:`~lightning_zerocopy.data.hetero_resources.HeteroDeviceResources` and whose builders are
:class:`~lightning_zerocopy.data.hetero_batch.HeteroBatchBuilder`. The plan is the homogeneous one over the input
type's split.

Under several ranks (Lightning's ``ddp``, or ``ZeroCopyDDPStrategy``) it is the homogeneous DataModule's setup
unchanged: each machine's local rank 0 builds the typed host copy, the other ranks map it through the exchanged
handles, and each rank's plan deals it a disjoint, equal share of the input type's seeds.

A host-memory consumer (the strategy, then the callbacks) takes part only if it says so with
``takes_hetero_builders``: a :class:`~lightning_zerocopy.callbacks.PipelineCallback` (``worker`` or ``in_process``)
builds the batches with these builders (they cross its slots flattened,
:mod:`lightning_zerocopy.pipeline.hetero_slots`); ``ZeroCopyDDPStrategy`` takes them with or without a cache: its
``cache_budget`` covers the rows of every featured type (:mod:`lightning_zerocopy.cache.typed`), handed over as a
:class:`~lightning_zerocopy.cache.typed_provider.TypedFeatureCache` through :meth:`set_feature_cache` and opened per
type by :meth:`~lightning_zerocopy.data.hetero_resources.HeteroDeviceResources.feature_table`. Not yet for
heterogeneous graphs: other host-memory consumers (refused by
:meth:`ZeroCopyHeteroDataModule.check_consumers` before the strategy's launcher starts a rank, and again in
``setup``), caches of one table (``hot_rows`` is not an argument) and ``node_order`` other than ``none``, each
refused in one line.

``node_order`` is refused rather than applied per type: the homogeneous order renumbers one id space (graph,
features, labels in internal ids; the sampler and assembly map seeds in and ``n_id`` back through one
:class:`~lightning_zerocopy.data.handles.NodeOrderHandles`). Per type it needs an order of every node type computed
over the typed graph (a BFS crosses edge types), every edge type's CSC relabeled on both of its endpoints' orders, and
the per-type maps carried through the typed sampler and assembly: new typed code in the host copy, the handles, the
sampler and the assembly, not the homogeneous path's data.

``sampler_placement`` ``hybrid``/``auto`` is resolved as the homogeneous DataModule resolves it (on a CPU trainer, or
without the CUDA kernels, one line and the CPU sampler); on a GPU trainer each batch is sampled by the C++ threads or
the ``gpu`` samplers of every edge type, whichever the cost model over the typed expected sample size expects to
finish first, and ``auto`` keeps both only where together they measure faster
(:class:`~lightning_zerocopy.data.hetero_batch.HeteroBatchBuilder`). Batches are bitwise the CPU placement's.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Sequence, Union

import torch
from torch_geometric.data import HeteroData
from typing_extensions import override

from lightning_zerocopy.data.assemble import move_batch
from lightning_zerocopy.data.datamodule import Split, ZeroCopyDataModule
from lightning_zerocopy.data.gpu_options import KEY_PREFIX
from lightning_zerocopy.data.handles import HeteroHostGraphHandles
from lightning_zerocopy.data.hetero_batch import HeteroBatchBuilder
from lightning_zerocopy.data.hetero_resources import HeteroDeviceResources
from lightning_zerocopy.data.hooks import HostMemoryConsumer
from lightning_zerocopy.data.host.hetero import HeteroHostCopyBuilder
from lightning_zerocopy.datasets.hetero import EdgeType, HeteroNodeDataset, Metadata, edge_type_str
from lightning_zerocopy.options import (
    FeatureDtype,
    FeatureStorage,
    GatherChoice,
    GatherMode,
    NodeOrderKind,
    RecipeError,
    SamplerPlacement,
    check_choice,
    check_fanouts,
)

__all__ = ["NumNeighbors", "ZeroCopyHeteroDataModule", "check_consumers", "check_metadata", "resolve_num_neighbors"]

_KEY = KEY_PREFIX

#: ``num_neighbors`` as a recipe gives it: one list for every edge type, or a list per edge type keyed by PyG's
#: edge-type string (``paper__cites__paper``).
NumNeighbors = Union[Sequence[int], Mapping[str, Sequence[int]]]


def resolve_num_neighbors(value: NumNeighbors, edge_types: Sequence[EdgeType], key: str) -> dict[EdgeType, list[int]]:
    """``num_neighbors`` per edge type: a list for all, or a dict by edge-type string covering every edge type.

    Raises:
        ValueError: an unknown edge type (naming it and the valid ones), a missing one, lists of different
            lengths, or a bad fanout (naming ``key``).
    """
    names = {edge_type_str(et): tuple(et) for et in edge_types}
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ValueError(f"{key} names the unknown edge type {unknown[0]!r}; the edge types are: "
                             f"{', '.join(names)}")  # fmt: skip
        missing = [k for k in names if k not in value]
        if missing:
            raise ValueError(f"{key} gives no fanouts for the edge type {missing[0]!r}: give every edge type "
                             f"({', '.join(names)}) or one list for all")  # fmt: skip
        resolved = {names[k]: check_fanouts(list(value[k]), f"{key}.{k}") for k in names}
    else:
        fanouts = check_fanouts(list(value), key)
        resolved = {et: list(fanouts) for et in names.values()}
    lengths = {name: len(resolved[et]) for name, et in names.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{key}: every edge type needs the same number of hops, got "
                         f"{', '.join(f'{n}: {c}' for n, c in lengths.items())}")  # fmt: skip
    return resolved


def check_metadata(dataset: HeteroNodeDataset, key: str) -> None:
    """The dataset's node and edge types fit together (cheap: its shape properties, nothing loaded).

    Raises:
        ValueError: an edge type naming a node type the dataset does not have, or an input type that is no node type
            (naming ``key``, the dataset's class and the type).
    """
    node_types = list(dataset.node_types)
    where = f"{key} ({type(dataset).__name__})"
    if dataset.input_type not in node_types:
        raise ValueError(f"{where}: the input type {dataset.input_type!r} is not one of its node types "
                         f"({', '.join(node_types)})")  # fmt: skip
    for edge_type in dataset.edge_types:
        for node_type in (edge_type[0], edge_type[2]):
            if node_type not in node_types:
                raise ValueError(f"{where}: the edge type {edge_type_str(edge_type)} names the node type "
                                 f"{node_type!r}, which is not one of its node types "
                                 f"({', '.join(node_types)})")  # fmt: skip


def check_consumers(trainer: Any) -> None:
    """Every host-memory consumer of ``trainer`` (its strategy, then its callbacks) takes heterogeneous builders.

    A consumer says so with ``takes_hetero_builders`` (an attribute or property, false if absent); one that does not
    may say what to change in ``hetero_fix``. Runs before any data is built.

    Raises:
        RecipeError: one line naming the first consumer that does not, and what to change (the command prints it
            as one line).
    """
    for consumer in (trainer.strategy, *trainer.callbacks):
        if isinstance(consumer, HostMemoryConsumer) and not getattr(consumer, "takes_hetero_builders", False):
            fix = getattr(consumer, "hetero_fix", None)
            if fix is None:
                fix = ("it reads the host memory of one homogeneous graph and feature table, e.g. to cache rows on "
                       "the GPU; " + ("set trainer.strategy to ddp" if consumer is trainer.strategy
                                      else "remove it from trainer.callbacks"))  # fmt: skip
            raise RecipeError(f"{type(consumer).__name__} is not yet supported with ZeroCopyHeteroDataModule ({fix})")


class ZeroCopyHeteroDataModule(ZeroCopyDataModule):
    """Heterogeneous mini-batches (PyG ``HeteroData``, as the hetero ``NeighborLoader`` yields them) from host
    memory shared by all ranks.

    Args:
        dataset: the :class:`~lightning_zerocopy.datasets.hetero.HeteroNodeDataset` (``class_path``/``init_args``).
        num_neighbors: neighbors sampled per hop for training: one list for every edge type (``[10, 5]``) or a
            dict keyed by PyG's edge-type string (``{paper__cites__paper: [10, 5], author__writes__paper: [5, 5],
            ...}``, every edge type, lists of one length); ``-1`` takes all.
        batch_size: input-type seed nodes per training batch (per rank).
        eval_num_neighbors: the same for validation/test/predict (default: ``num_neighbors``); unless every fanout
            is ``-1``, evaluation samples node-keyed (:mod:`lightning_zerocopy.sampling.hetero`).
        eval_batch_size: seeds per evaluation batch (default: ``batch_size``).
        replace, shuffle, drop_last, num_threads, seed, predict_split, feature_storage, gather, gather_mode,
        check_features, x_dtype, allow_split_overlap: as :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule`
            takes them (``predict_split: all`` predicts every input-type node).
        sampler_placement: ``"cpu"``, ``"uva"``, ``"gpu"``, ``"hybrid"`` or ``"auto"``, as
            :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` takes them (``hybrid``/``auto``: per batch
            the C++ threads or the ``gpu`` samplers of every edge type; on a CPU trainer they say so in one line and
            sample on the CPU). Every placement gives the same batches.
        feature_dtype: the dtype of every featured type's table in host memory (``"float32"``, ``"bfloat16"``,
            ``"float16"``; default: each type's own), cast once when the host copy is built
            (:mod:`lightning_zerocopy.data.host.hetero`); ``x_dtype`` says what each ``x`` of a batch is.
        node_order: only ``"none"`` (the dataset's ids) for heterogeneous graphs (see the module docstring).

    Raises:
        ValueError / TypeError: a bad argument (naming its recipe key), before any data is built.
    """

    def __init__(
        self,
        dataset: HeteroNodeDataset,
        num_neighbors: NumNeighbors = (10, 10),
        batch_size: int = 512,
        eval_num_neighbors: Optional[NumNeighbors] = None,
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
        check_features: bool = True,
        x_dtype: Optional[FeatureDtype] = "float32",
        allow_split_overlap: bool = False,
        feature_dtype: Optional[FeatureDtype] = None,
        node_order: NodeOrderKind = "none",
    ) -> None:
        check_choice(node_order, NodeOrderKind, _KEY + "node_order")
        if node_order != "none":
            raise ValueError(f"{_KEY}node_order={node_order!r} is not yet supported for heterogeneous graphs (no "
                             "per-type node order is built); use 'none'")  # fmt: skip
        if not isinstance(dataset, HeteroNodeDataset):
            raise TypeError(f"{_KEY}dataset must be a HeteroNodeDataset, got {type(dataset).__name__}; homogeneous "
                            "node datasets go to ZeroCopyDataModule")  # fmt: skip
        check_metadata(dataset, _KEY + "dataset")
        edge_types = list(dataset.edge_types)
        train = resolve_num_neighbors(num_neighbors, edge_types, _KEY + "num_neighbors")
        evaluation = train if eval_num_neighbors is None else resolve_num_neighbors(
            eval_num_neighbors, edge_types, _KEY + "eval_num_neighbors")  # fmt: skip
        first = next(iter(train.values()), [])
        super().__init__(
            dataset, fanouts=first, batch_size=batch_size, eval_fanouts=next(iter(evaluation.values()), first),  # type: ignore[arg-type]
            eval_batch_size=eval_batch_size, replace=replace, shuffle=shuffle, drop_last=drop_last,
            num_threads=num_threads, seed=seed, predict_split=predict_split, feature_storage=feature_storage,
            sampler_placement=sampler_placement, gather=gather, gather_mode=gather_mode, check_features=check_features,
            x_dtype=x_dtype, allow_split_overlap=allow_split_overlap, feature_dtype=feature_dtype,
        )  # fmt: skip
        self.num_neighbors = num_neighbors
        self.eval_num_neighbors = eval_num_neighbors
        self.fanouts = train  # type: ignore[assignment]  # per edge type here
        self.eval_fanouts = evaluation  # type: ignore[assignment]
        self._eval_node_keyed = any(f >= 0 for fanouts in evaluation.values() for f in fanouts)
        self._host_copy = HeteroHostCopyBuilder(  # type: ignore[assignment]
            dataset, feature_storage, _KEY + "dataset", check_features, _KEY + "check_features: false",
            allow_split_overlap=self.allow_split_overlap, overlap_opt_out=_KEY + "allow_split_overlap: true",
            feature_dtype=feature_dtype, dtype_key=_KEY + "feature_dtype", x_dtype=x_dtype,
            x_dtype_key=_KEY + "x_dtype",
        )  # fmt: skip

    # ---- shapes the model needs (cheap: from the dataset, nothing loaded) ----------------------------------

    @property
    def metadata(self) -> Metadata:
        """``(node types, edge types)`` as PyG's ``HeteroData.metadata()`` (what ``to_hetero``/``HeteroConv`` take):
        call it as PyG's (``dm.metadata()``) or read it as a tuple (``dm.metadata``), see :class:`Metadata`."""
        return Metadata(*self.dataset.metadata())

    @property
    def num_features(self) -> dict[str, int]:  # type: ignore[override]
        """Feature width of each node type that has features (featureless types are absent)."""
        return dict(self.dataset.num_features)

    @property
    def num_nodes(self) -> dict[str, int]:
        """Nodes of every node type (a model sizes the embeddings of featureless types from it)."""
        return dict(self.dataset.num_nodes)

    @property
    def num_classes(self) -> int:
        """Number of classes of the input type's labels."""
        return self.dataset.num_classes

    @property
    def input_type(self) -> str:
        """The node type with labels and splits (the seeds' type)."""
        return self.dataset.input_type

    # ---- Lightning hooks -----------------------------------------------------------------------------------

    @override
    def prepare_data(self) -> None:
        self.dataset.prepare()

    @override
    def setup(self, stage: Optional[str] = None) -> None:
        trainer = self._trainer_or_none()
        if trainer is not None and self._handles is None:
            self.check_consumers(trainer)
        super().setup(stage)

    def check_consumers(self, trainer: Any) -> None:
        """Refuse a host-memory consumer of ``trainer`` that does not take heterogeneous builders (see
        :func:`check_consumers`); ``setup`` calls it, and ``ZeroCopyDDPStrategy``'s launcher before it starts a rank.

        Raises:
            RecipeError: one line naming the consumer and what to change.
        """
        check_consumers(trainer)

    @override
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        if isinstance(batch, HeteroData):
            return move_batch(batch, device)  # type: ignore[arg-type]
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    # ---- the data contract -------------------------------------------------------------------------------

    def builder(self, split: Split) -> HeteroBatchBuilder:  # type: ignore[override]
        """A new, unopened (picklable) heterogeneous builder for ``split``.

        Raises:
            RuntimeError: before :meth:`setup`.
        """
        handles = self._require_setup()
        gpu = self._gpu_options()
        return HeteroBatchBuilder(
            handles,  # type: ignore[arg-type]
            self.fanouts if split == "train" else self.eval_fanouts,  # type: ignore[arg-type]
            replace=self.replace,
            num_threads=self.num_threads,
            sampler_placement=gpu.placement,  # type: ignore[arg-type]
            gather=gpu.gather,  # type: ignore[arg-type]
            gather_mode=self.gather_mode,
            device=gpu.device_index,
            node_keyed=split != "train" and self._eval_node_keyed,
            x_dtype=self.x_dtype,
            cache=self._feature_cache,
        )

    def set_feature_cache(self, spec: Optional[Any]) -> None:  # type: ignore[override]
        """Serve each featured type's rows from the GPU cache over typed rows ``spec`` describes (a
        :class:`~lightning_zerocopy.cache.typed_provider.TypedFeatureCache`, ``ZeroCopyDDPStrategy``'s), in every
        process that builds batches, or from host memory only (``None``). When it may be called: as
        :meth:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule.set_feature_cache`.

        Raises:
            ValueError: a cache spec of one table (``hot_rows``, a homogeneous provider): one per node type is needed.
            RuntimeError: after ``setup`` (builders already carry the previous spec).
        """
        from lightning_zerocopy.cache.typed_provider import TypedFeatureCache

        if spec is not None and not isinstance(spec, TypedFeatureCache):
            raise ValueError("a heterogeneous DataModule takes a GPU feature cache per node type (a "
                             f"TypedFeatureCache, ZeroCopyDDPStrategy's cache_budget), not {type(spec).__name__}")  # fmt: skip
        if self._handles is not None and not self._attaching:
            raise RuntimeError(
                "set_feature_cache() must be called before ZeroCopyHeteroDataModule.setup() or from attach_host_memory"
            )
        self._feature_cache = spec
        if self._handles is not None:  # during setup: nothing is placed yet, the builders take the new spec
            self._bind_builders()

    @property
    def resources(self) -> Optional[HeteroDeviceResources]:  # type: ignore[override]
        return self._resources  # type: ignore[return-value]

    @property
    def feature_row_bytes(self) -> dict[str, int]:
        """Bytes of one row of each featured type's host table (its dtype after ``feature_dtype``): what a batch reads
        from host memory per sampled node of that type where no GPU cache serves it (``DataTelemetry``'s
        ``data/host_bytes_<type>``).

        Raises:
            RuntimeError: before :meth:`setup` (the host tables are mapped there).
        """
        self._require_setup()
        resources = self._resources
        if resources is None:
            raise RuntimeError("ZeroCopyHeteroDataModule is not set up: call setup() (the Trainer does) first")
        return {t: int(table.row_bytes) for t, table in resources.host.features.items()}  # type: ignore[attr-defined]

    # ---- internals -----------------------------------------------------------------------------------------

    def _open(self, handles: HeteroHostGraphHandles) -> None:  # type: ignore[override]
        self._handles = handles  # type: ignore[assignment]
        self._splits = {name: handle.open() for name, handle in handles.splits.items()}
        self._resources = HeteroDeviceResources(handles, self._gpu_options().device_index)  # type: ignore[assignment]
        self._bind_builders()

    def _input_nodes(self, split: Split) -> torch.Tensor:
        handles = self._require_setup()
        if split == "predict" and self.predict_split == "all":
            return torch.arange(dict(handles.num_nodes)[handles.input_type])  # type: ignore[attr-defined]
        return super()._input_nodes(split)
