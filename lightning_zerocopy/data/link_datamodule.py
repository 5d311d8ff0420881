"""The link-prediction DataModules: ``ZeroCopyLinkDataModule`` (an untyped graph, batches like PyG's
``LinkNeighborLoader``) and ``ZeroCopyHeteroLinkDataModule`` (one edge type of a typed graph, like PyG's hetero
``LinkNeighborLoader(data, num_neighbors, edge_label_index=(edge_type, pairs), ...)``), on the node data path.

Both are constructors of the one DataModule core (:class:`~lightning_zerocopy.data.graph_datamodule.GraphDataModule`)
with a :class:`~lightning_zerocopy.data.tasks.LinkTask`, whose plans are
:class:`~lightning_zerocopy.data.link_plan.LinkBatchPlan` s: a plan item's seeds are the endpoints of its supervision
edges and negatives, so the sampler, the gather, the pipeline worker, the DDP strategy and the telemetry build and
move link batches without knowing the task. Only the plan and the host copy's split tensors differ
(:mod:`~lightning_zerocopy.data.host.links`). On a typed graph the plan's endpoints are typed (``edge_type=``):
negatives are drawn by :class:`~lightning_zerocopy.data.negatives.NegativeDraws` from the source type's ids (binary
sources) and the destination type's ids, and each item's seeds are split per endpoint type, which the builder hands
to the sampler as a ``seed_dict``; ``sampler_placement`` ``hybrid``/``auto`` works as for the node DataModules, the
cost model sizing a batch by both endpoint types' seeds.

Under several ranks (Lightning's ``ddp``, or ``ZeroCopyDDPStrategy``; on a typed graph with ``cache_budget: 0``)
each machine's local rank 0 builds the link host copy and the others map it, each rank's plan deals it a disjoint,
equal share of the split's positive edges, node-keyed evaluation makes predictions of any rank count bitwise one
rank's, and a resume on another world size deals the positive edges the epoch had left
(:mod:`~lightning_zerocopy.data.resume`).

Typed batch fields (PyG's hetero ``LinkNeighborLoader``): per node type ``n_id``, ``x`` (featured types) or
``num_nodes``, ``num_sampled_nodes``; per edge type ``edge_index``, ``e_id``, ``num_sampled_edges``; on the supervised
edge type ``edge_label_index`` (row 0 indexes ``n_id`` of its source type, row 1 of its destination type),
``edge_label``, ``edge_label_query`` (fixed negatives grouped per positive), ``input_id`` and ``batch_size`` (the
positives; PyG's batch has no ``batch_size``); triplet mode puts ``src_index`` on the source type and
``dst_pos_index`` / ``dst_neg_index`` on the destination type instead. There is no ``y``.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Sequence, Union

from lightning_zerocopy.data.datamodule import (
    NumNeighbors,
    TypedShapes,
    check_edge_types,
    check_typed_node_order,
    resolve_num_neighbors,
)
from lightning_zerocopy.data.gpu_options import KEY_PREFIX
from lightning_zerocopy.data.graph_datamodule import GraphDataModule, passed_on
from lightning_zerocopy.data.layerwise_options import LayerwiseOptions, PredictMode, check_layerwise_fanouts
from lightning_zerocopy.data.negatives import parse_neg_sampling
from lightning_zerocopy.data.tasks import LinkTask
from lightning_zerocopy.datasets.attributes import AttributeChoice
from lightning_zerocopy.datasets.hetero import EdgeType
from lightning_zerocopy.datasets.hetero_links import HeteroLinkDataset, unknown_edge_type
from lightning_zerocopy.datasets.links import LINK_SPLITS, LinkDataset, LinkSplit
from lightning_zerocopy.graph.schema import GraphSchema
from lightning_zerocopy.options import (
    FeatureDtype,
    FeatureStorage,
    GatherChoice,
    GatherMode,
    NodeOrderKind,
    SamplerPlacement,
    check_fanouts,
    check_subgraph_options,
)

__all__ = ["ZeroCopyHeteroLinkDataModule", "ZeroCopyLinkDataModule", "check_link_metadata"]

_KEY = KEY_PREFIX  # how errors name this class's arguments: the recipe's YAML keys


class _LinkArguments(GraphDataModule):
    """What both link DataModules do with their link arguments, and their splits."""

    def _link_task(self, edge_type: Optional[EdgeType], neg_sampling: Union[None, str, dict[str, Any]],
                   neg_sampling_ratio: float, subgraph_type: str, disjoint: bool,
                   predict_split: str) -> LinkTask:  # fmt: skip
        """The task of the supervised ``edge_type`` (``None``: an untyped graph's) and the link arguments, checked (one
        line naming the YAML key) and kept as given (``negative_sampling``: the parsed negatives)."""
        check_subgraph_options(subgraph_type, disjoint, _KEY)
        if predict_split not in LINK_SPLITS:
            raise ValueError(f"{_KEY}predict_split must be one of {LINK_SPLITS}, got {predict_split!r}")
        self.negative_sampling = parse_neg_sampling(neg_sampling, neg_sampling_ratio, _KEY)
        self.neg_sampling, self.neg_sampling_ratio = neg_sampling, float(neg_sampling_ratio)
        self.subgraph_type, self.disjoint = subgraph_type, disjoint
        return LinkTask(edge_type, self.negative_sampling)

    @property
    def link_splits(self) -> Mapping[str, LinkSplit]:
        """The supervision edges of each split (after ``setup``; fixed negatives included)."""
        self._require_setup()
        return self.task.splits  # type: ignore[union-attr]


class ZeroCopyLinkDataModule(_LinkArguments):
    """Link-prediction mini-batches (PyG ``LinkNeighborLoader``'s fields), sampled from host memory shared by all ranks:
    a :class:`~lightning_zerocopy.data.graph_datamodule.GraphDataModule` of an untyped graph and a
    :class:`~lightning_zerocopy.data.tasks.LinkTask`.

    Every batch has ``x``, ``edge_index`` (local ids, neighbor -> target), ``n_id``, ``e_id``, ``input_id`` (positions
    of the batch's positive edges in their split), ``num_sampled_nodes``, ``num_sampled_edges`` and ``batch_size``
    (the number of positive edges), plus the supervision edges: ``edge_label_index``/``edge_label`` (binary, and
    every val/test batch with fixed negatives, then also ``edge_label_query`` when they are grouped per positive) or
    ``src_index``/``dst_pos_index``/``dst_neg_index`` (triplet). See :mod:`~lightning_zerocopy.data.link_plan`.

    Args:
        dataset: the link dataset (``class_path``/``init_args`` in a recipe).
        num_neighbors: neighbors sampled per hop for training, e.g. ``[15, 10]``; ``-1`` takes all.
        batch_size: positive supervision edges per training batch (per rank).
        neg_sampling: negatives of the training batches (and of val/test splits that store none): ``"binary"``
            (random node pairs, labelled 0), ``"triplet"`` (random destinations per positive), a dict ``{mode,
            amount, src_weight, dst_weight}`` (weights: ``"degree"`` or a ``[num_nodes]`` tensor; uniform when
            unset), or ``None`` (positives only).
        neg_sampling_ratio: binary negatives per positive when ``neg_sampling`` gives no ``amount`` (``>= 0``).
        eval_num_neighbors: fanouts for validation/test/predict; default: ``num_neighbors``.
        eval_batch_size: positive edges per evaluation batch; default: ``batch_size``.
        replace: sample neighbors with replacement.
        subgraph_type, disjoint: PyG's loader arguments, accepted at the only values these batches have (PyG's
            defaults ``"directional"`` and ``False``), so that a PyG recipe's data block carries over; other values
            are refused with what the batches are.
        shuffle: reshuffle the training edges every epoch.
        drop_last: drop the training edges that do not fill a whole batch (and equal rank shares).
        num_threads: threads of the sampling kernel; default: ``torch.get_num_threads()``.
        seed: base seed of the shuffles, of every batch's sampler seed and of its negatives.
        predict_split: the split whose edges ``predict`` scores (its positives, then its fixed negatives), sampled
            with that split's seed: an edge's scores from ``predict`` and ``test`` are the same.
        feature_storage, sampler_placement, gather, gather_mode, hot_rows, node_order, check_features, feature_dtype,
            x_dtype, attributes: the data path, the NaN/inf feature scan, the feature dtypes and the node/edge
            attributes that reach the batches, exactly as :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule`
            takes them.
        predict_mode, layerwise: exact layer-wise ``predict`` (``layerwise``) instead of sampled, and its options, as
            :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` takes them (a link module's layer-wise
            output: the node embeddings of its last layer, ``embeddings.npy``).

    Raises:
        ValueError / TypeError: a bad argument (naming its recipe key), before any data is built.
    """

    def __init__(
        self,
        dataset: LinkDataset,
        num_neighbors: Sequence[int] = (10, 10),
        batch_size: int = 512,
        neg_sampling: Union[None, str, dict[str, Any]] = "binary",
        neg_sampling_ratio: float = 1.0,
        eval_num_neighbors: Optional[Sequence[int]] = None,
        eval_batch_size: Optional[int] = None,
        replace: bool = False,
        subgraph_type: str = "directional",
        disjoint: bool = False,
        shuffle: bool = True,
        drop_last: bool = False,
        num_threads: Optional[int] = None,
        seed: int = 0,
        predict_split: Literal["train", "val", "test"] = "test",
        feature_storage: FeatureStorage = "shared_memory",
        sampler_placement: SamplerPlacement = "cpu",
        gather: GatherChoice = "auto",
        gather_mode: GatherMode = "auto",
        hot_rows: int = 0,
        node_order: NodeOrderKind = "none",
        check_features: bool = True,
        feature_dtype: Optional[FeatureDtype] = None,
        x_dtype: Optional[FeatureDtype] = "float32",
        attributes: AttributeChoice = "all",
        predict_mode: PredictMode = "sampled",
        layerwise: Optional[LayerwiseOptions] = None,
    ) -> None:
        check_layerwise_fanouts(predict_mode, eval_num_neighbors, _KEY + "eval_num_neighbors")
        if not isinstance(dataset, LinkDataset):
            raise TypeError(
                f"{_KEY}dataset must be a LinkDataset (e.g. a link split of a graph), got {type(dataset).__name__}; "
                "node datasets go to ZeroCopyDataModule"
            )
        check_fanouts(list(num_neighbors), _KEY + "num_neighbors")
        if eval_num_neighbors is not None:
            check_fanouts(list(eval_num_neighbors), _KEY + "eval_num_neighbors")
        task = self._link_task(None, neg_sampling, neg_sampling_ratio, subgraph_type, disjoint, predict_split)
        self.num_neighbors = list(num_neighbors)
        self.eval_num_neighbors = list(eval_num_neighbors) if eval_num_neighbors is not None else self.num_neighbors
        super().__init__(dataset, task, schema=GraphSchema.untyped(), fanouts=self.num_neighbors,
                         eval_fanouts=self.eval_num_neighbors, **passed_on(locals()))  # fmt: skip


def check_link_metadata(dataset: HeteroLinkDataset, key: str) -> EdgeType:
    """The dataset's types fit together and its supervised edge type is one of its edge types (cheap: its shape
    properties, nothing loaded); returns the supervised edge type.

    Raises:
        ValueError: an edge type naming an unknown node type, or an unknown supervised edge type (one line naming
            ``key``, the dataset's class and the valid edge types).
    """
    edge_types = check_edge_types(dataset, key)
    supervised = dataset.edge_type
    supervised = tuple(supervised) if isinstance(supervised, list) else supervised  # a list from YAML
    if supervised not in edge_types:
        raise ValueError(f"{key} ({type(dataset).__name__}): {unknown_edge_type(supervised, edge_types)}")
    return supervised[0], supervised[1], supervised[2]


class ZeroCopyHeteroLinkDataModule(TypedShapes, _LinkArguments):
    """Link-prediction mini-batches on one edge type of a heterogeneous graph (``HeteroData``, PyG's hetero
    ``LinkNeighborLoader`` fields; see the module docstring), sampled from host memory shared by all ranks.

    Args:
        dataset: the :class:`~lightning_zerocopy.datasets.hetero_links.HeteroLinkDataset` (its ``edge_type`` is the
            supervised edge type).
        num_neighbors: neighbors per hop for training: one list for every edge type or a dict keyed by PyG's
            edge-type string (as :class:`~lightning_zerocopy.data.datamodule.ZeroCopyHeteroDataModule`).
        batch_size: positive supervision edges per training batch (per rank).
        neg_sampling, neg_sampling_ratio: negatives of the training batches (and of val/test splits that store
            none), as :class:`ZeroCopyLinkDataModule` takes them; random
            sources are ids of the edge type's source type, destinations of its destination type; ``"degree"``
            weights are the out-degree (sources) and in-degree (destinations) in the supervised edge type.
        eval_num_neighbors, eval_batch_size: the same for validation/test/predict (default: the training ones);
            evaluation samples node-keyed unless every fanout is ``-1``.
        replace, shuffle, drop_last, num_threads, seed: as the node DataModules take them.
        subgraph_type, disjoint: PyG's loader arguments, accepted only at the values these batches have.
        predict_split: the split whose edges ``predict`` scores (its positives, then its fixed negatives).
        feature_storage, sampler_placement, gather, gather_mode, check_features, feature_dtype, x_dtype, node_order,
        attributes: as :class:`~lightning_zerocopy.data.datamodule.ZeroCopyHeteroDataModule` takes them
            (every ``sampler_placement``, ``hybrid``/``auto`` included; ``node_order`` ``none``).
        predict_mode, layerwise: exact layer-wise ``predict`` (``layerwise``) instead of sampled, and its options, as
            :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` takes them (a link module's layer-wise
            output: the last layer's embeddings of every node type).

    Raises:
        ValueError / TypeError: a bad argument (naming its recipe key), an unknown supervised edge type, before any
            data is built.
    """

    def __init__(
        self,
        dataset: HeteroLinkDataset,
        num_neighbors: NumNeighbors = (10, 10),
        batch_size: int = 512,
        neg_sampling: Union[None, str, dict[str, Any]] = "binary",
        neg_sampling_ratio: float = 1.0,
        eval_num_neighbors: Optional[NumNeighbors] = None,
        eval_batch_size: Optional[int] = None,
        replace: bool = False,
        subgraph_type: str = "directional",
        disjoint: bool = False,
        shuffle: bool = True,
        drop_last: bool = False,
        num_threads: Optional[int] = None,
        seed: int = 0,
        predict_split: Literal["train", "val", "test"] = "test",
        feature_storage: FeatureStorage = "shared_memory",
        sampler_placement: SamplerPlacement = "cpu",
        gather: GatherChoice = "auto",
        gather_mode: GatherMode = "auto",
        check_features: bool = True,
        feature_dtype: Optional[FeatureDtype] = None,
        x_dtype: Optional[FeatureDtype] = "float32",
        node_order: NodeOrderKind = "none",
        attributes: AttributeChoice = "all",
        predict_mode: PredictMode = "sampled",
        layerwise: Optional[LayerwiseOptions] = None,
    ) -> None:
        check_layerwise_fanouts(predict_mode, eval_num_neighbors, _KEY + "eval_num_neighbors")
        if not isinstance(dataset, HeteroLinkDataset):
            raise TypeError(f"{_KEY}dataset must be a HeteroLinkDataset (a typed graph with a supervised edge type), "
                            f"got {type(dataset).__name__}; homogeneous link datasets go to "
                            "ZeroCopyLinkDataModule")  # fmt: skip
        check_typed_node_order(node_order)
        self.edge_type: EdgeType = check_link_metadata(dataset, _KEY + "dataset")
        edge_types = [(et[0], et[1], et[2]) for et in dataset.edge_types]
        train = resolve_num_neighbors(num_neighbors, edge_types, _KEY + "num_neighbors")
        evaluation = train if eval_num_neighbors is None else resolve_num_neighbors(
            eval_num_neighbors, edge_types, _KEY + "eval_num_neighbors")  # fmt: skip
        task = self._link_task(self.edge_type, neg_sampling, neg_sampling_ratio, subgraph_type, disjoint, predict_split)
        self.num_neighbors, self.eval_num_neighbors = num_neighbors, eval_num_neighbors
        super().__init__(dataset, task, schema=GraphSchema.typed(dataset.node_types, edge_types), fanouts=train,
                         eval_fanouts=evaluation, **passed_on(locals()))  # fmt: skip
