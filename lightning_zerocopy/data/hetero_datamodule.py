"""``ZeroCopyHeteroDataModule``: heterogeneous node-classification batches like PyG's hetero ``NeighborLoader``.

A constructor of the one DataModule core (:class:`~lightning_zerocopy.data.graph_datamodule.GraphDataModule`: the same
setup and handle exchange, plans, loaders, split builders, teardown): a typed schema (the dataset's node and edge
types, its input type) and a :class:`~lightning_zerocopy.data.tasks.NodeTask` over the input type's split; the host
copy holds one CSC per edge type and a table per featured type, the builder samples and gathers per type and yields
``HeteroData`` (:mod:`lightning_zerocopy.data.batch`). Under several ranks (Lightning's ``ddp``, or
``ZeroCopyDDPStrategy``, whose ``cache_budget`` covers the rows of every featured type) each machine's local rank 0
builds the typed host copy, the other ranks map it, and each rank's plan deals it a disjoint, equal share of the input
type's seeds.

A host-memory consumer (the strategy, then the callbacks) takes part only if it says so with
``takes_hetero_builders`` (:func:`~lightning_zerocopy.data.hooks.check_typed_consumers`, before the strategy's
launcher starts a rank and again in ``setup``). Not yet for typed graphs: a cache of one table (``hot_rows``) and a
``node_order`` other than ``none``, each refused in one line (a per-type order would renumber both endpoints of every
edge type and carry per-type maps through the sampler and the assembly). ``sampler_placement`` ``hybrid``/``auto`` is
resolved as for one type; batches are bitwise the CPU placement's.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Sequence, Union

from lightning_zerocopy.data.gpu_options import KEY_PREFIX
from lightning_zerocopy.data.graph_datamodule import GraphDataModule
from lightning_zerocopy.data.hooks import check_typed_consumers
from lightning_zerocopy.data.layerwise_options import LayerwiseOptions, PredictMode, check_layerwise_fanouts
from lightning_zerocopy.data.tasks import NodeTask
from lightning_zerocopy.datasets.attributes import AttributeChoice
from lightning_zerocopy.datasets.hetero import EdgeType, HeteroNodeDataset, Metadata, edge_type_str
from lightning_zerocopy.graph.schema import GraphSchema
from lightning_zerocopy.options import (
    FeatureDtype,
    FeatureStorage,
    GatherChoice,
    GatherMode,
    NodeOrderKind,
    SamplerPlacement,
    check_choice,
    check_fanouts,
)

__all__ = [
    "NumNeighbors",
    "TypedShapes",
    "ZeroCopyHeteroDataModule",
    "check_consumers",
    "check_metadata",
    "check_typed_node_order",
    "resolve_num_neighbors",
]

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


#: the name this check had here
check_consumers = check_typed_consumers


class TypedShapes:
    """The shape properties of a typed graph's DataModule that a model links (cheap: from the dataset)."""

    dataset: Any
    schema: GraphSchema

    @property
    def metadata(self) -> Metadata:
        """``(node types, edge types)`` as PyG's ``HeteroData.metadata()`` (what ``to_hetero``/``HeteroConv`` take):
        call it as PyG's (``dm.metadata()``) or read it as a tuple (``dm.metadata``), see :class:`Metadata`."""
        return Metadata(*self.schema.metadata())

    @property
    def num_nodes(self) -> dict[str, int]:
        """Nodes of every node type (a model sizes the embeddings of featureless types from it)."""
        return dict(self.dataset.num_nodes)


class ZeroCopyHeteroDataModule(TypedShapes, GraphDataModule):
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
        check_features, x_dtype, allow_split_overlap, attributes: as
            :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` takes them (``predict_split: all``
            predicts every input-type node; each attribute goes on its own type's store).
        sampler_placement: ``"cpu"``, ``"uva"``, ``"gpu"``, ``"hybrid"`` or ``"auto"``, as
            :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` takes them (``hybrid``/``auto``: per batch
            the C++ threads or the ``gpu`` samplers of every edge type; on a CPU trainer they say so in one line and
            sample on the CPU). Every placement gives the same batches.
        feature_dtype: the dtype of every featured type's table in host memory (``"float32"``, ``"bfloat16"``,
            ``"float16"``; default: each type's own), cast once when the host copy is built
            (:mod:`lightning_zerocopy.data.host.share`); ``x_dtype`` says what each ``x`` of a batch is.
        predict_mode, layerwise: exact layer-wise ``predict`` (``layerwise``) instead of sampled, and its options, as
            :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` takes them.
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
        attributes: AttributeChoice = "all",
        predict_mode: PredictMode = "sampled",
        layerwise: Optional[LayerwiseOptions] = None,
    ) -> None:
        check_layerwise_fanouts(predict_mode, eval_num_neighbors, _KEY + "eval_num_neighbors")
        check_typed_node_order(node_order)
        if not isinstance(dataset, HeteroNodeDataset):
            raise TypeError(f"{_KEY}dataset must be a HeteroNodeDataset, got {type(dataset).__name__}; homogeneous "
                            "node datasets go to ZeroCopyDataModule")  # fmt: skip
        check_metadata(dataset, _KEY + "dataset")
        edge_types = list(dataset.edge_types)
        train = resolve_num_neighbors(num_neighbors, edge_types, _KEY + "num_neighbors")
        evaluation = train if eval_num_neighbors is None else resolve_num_neighbors(
            eval_num_neighbors, edge_types, _KEY + "eval_num_neighbors")  # fmt: skip
        self.num_neighbors, self.eval_num_neighbors = num_neighbors, eval_num_neighbors
        super().__init__(
            dataset, NodeTask(), schema=GraphSchema.typed(dataset.node_types, edge_types, dataset.input_type),
            fanouts=train, eval_fanouts=evaluation, batch_size=batch_size, eval_batch_size=eval_batch_size,
            replace=replace, shuffle=shuffle, drop_last=drop_last, num_threads=num_threads, seed=seed,
            predict_split=predict_split, feature_storage=feature_storage, sampler_placement=sampler_placement,
            gather=gather, gather_mode=gather_mode, hot_rows=0, node_order=node_order, check_features=check_features,
            feature_dtype=feature_dtype, x_dtype=x_dtype, allow_split_overlap=allow_split_overlap, attributes=attributes,
            predict_mode=predict_mode, layerwise=layerwise,
        )  # fmt: skip

    @property
    def num_classes(self) -> int:
        """Number of classes of the input type's labels."""
        return self.dataset.num_classes

    @property
    def input_type(self) -> str:
        """The node type with labels and splits (the seeds' type)."""
        return self.dataset.input_type


def check_typed_node_order(node_order: Any) -> None:
    """Refuse a ``node_order`` other than ``none`` for a typed graph (one line naming the key)."""
    check_choice(node_order, NodeOrderKind, _KEY + "node_order")
    if node_order != "none":
        raise ValueError(f"{_KEY}node_order={node_order!r} is not yet supported for heterogeneous graphs (no "
                         "per-type node order is built); use 'none'")  # fmt: skip
