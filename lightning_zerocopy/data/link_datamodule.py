"""``ZeroCopyLinkDataModule``: link-prediction mini-batches like PyG's ``LinkNeighborLoader``, on the node data path.

It *is* a :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` (same host copy, resources, builders,
loaders, pipeline hook, feature cache, GPU options) whose plans are
:class:`~lightning_zerocopy.data.link_plan.LinkBatchPlan`: a plan item's seeds are the endpoints of its supervision
edges and negatives, so the sampler, the gather, the pipeline worker, the DDP strategy and the telemetry build and
move link batches without knowing the task. Only the plan and the host copy's split tensors differ
(:mod:`~lightning_zerocopy.data.host.links`).
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Sequence, Union

import torch

from lightning_zerocopy.data.datamodule import Split, ZeroCopyDataModule
from lightning_zerocopy.data.gpu_options import KEY_PREFIX
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.data.host.links import LinkHostCopyBuilder, link_splits
from lightning_zerocopy.data.link_plan import LinkBatchPlan
from lightning_zerocopy.data.plan import SPLIT_STREAMS
from lightning_zerocopy.data.negatives import NegativeDraws, NegativeSampling, parse_neg_sampling
from lightning_zerocopy.datasets.base import InputDataError
from lightning_zerocopy.datasets.link_checks import check_batch_labels
from lightning_zerocopy.datasets.links import LINK_SPLITS, LinkDataset, LinkSplit
from lightning_zerocopy.datasets.splits import SplitError
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

__all__ = ["ZeroCopyLinkDataModule", "split_link_plan"]

_KEY = KEY_PREFIX  # how errors name this class's arguments: the recipe's YAML keys


class ZeroCopyLinkDataModule(ZeroCopyDataModule):
    """Link-prediction mini-batches (PyG ``LinkNeighborLoader``'s fields), sampled from host memory shared by all ranks.

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
            x_dtype: the data path, the NaN/inf feature scan and the feature dtypes, exactly as
            :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` takes them.

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
    ) -> None:
        if not isinstance(dataset, LinkDataset):
            raise TypeError(
                f"{_KEY}dataset must be a LinkDataset (e.g. a link split of a graph), got {type(dataset).__name__}; "
                "node datasets go to ZeroCopyDataModule"
            )
        check_fanouts(list(num_neighbors), _KEY + "num_neighbors")
        check_subgraph_options(subgraph_type, disjoint, _KEY)
        if eval_num_neighbors is not None:
            check_fanouts(list(eval_num_neighbors), _KEY + "eval_num_neighbors")
        if predict_split not in LINK_SPLITS:
            raise ValueError(f"{_KEY}predict_split must be one of {LINK_SPLITS}, got {predict_split!r}")
        self.negative_sampling: Optional[NegativeSampling] = parse_neg_sampling(neg_sampling, neg_sampling_ratio, _KEY)
        super().__init__(
            dataset, fanouts=num_neighbors, batch_size=batch_size, eval_fanouts=eval_num_neighbors,
            eval_batch_size=eval_batch_size, replace=replace, shuffle=shuffle, drop_last=drop_last,
            num_threads=num_threads, seed=seed, predict_split=predict_split, feature_storage=feature_storage,
            sampler_placement=sampler_placement, gather=gather, gather_mode=gather_mode, hot_rows=hot_rows,
            node_order=node_order, check_features=check_features, feature_dtype=feature_dtype, x_dtype=x_dtype,
        )  # fmt: skip
        self.num_neighbors = list(num_neighbors)
        self.eval_num_neighbors = list(eval_num_neighbors) if eval_num_neighbors is not None else self.num_neighbors
        self.neg_sampling = neg_sampling
        self.neg_sampling_ratio = float(neg_sampling_ratio)
        self.subgraph_type, self.disjoint = subgraph_type, disjoint
        self._host_copy = LinkHostCopyBuilder(
            dataset, feature_storage, node_order, _KEY + "dataset", check_features, _KEY + "check_features: false",
            feature_dtype=feature_dtype, dtype_key=_KEY + "feature_dtype", x_dtype=x_dtype,
            x_dtype_key=_KEY + "x_dtype",
        )  # fmt: skip
        self._link_splits: dict[str, LinkSplit] = {}
        self._negatives: Optional[NegativeDraws] = None

    @property
    def num_classes(self) -> int:
        """Link prediction has no node classes."""
        raise AttributeError(
            "ZeroCopyLinkDataModule has no num_classes: link batches carry edge labels, not node classes"
        )

    @property
    def link_splits(self) -> Mapping[str, LinkSplit]:
        """The supervision edges of each split (after ``setup``; fixed negatives included)."""
        self._require_setup()
        return self._link_splits

    def plan(  # type: ignore[override]
        self, split: Split, rank: Optional[int] = None, world_size: Optional[int] = None
    ) -> LinkBatchPlan:
        """The link batch plan of ``split`` for ``rank`` of ``world_size`` (default: this process's rank).

        ``train`` draws its negatives per batch; ``val``/``test`` score the split's fixed negatives (random ones from
        the batch seed when the split stores none); ``predict`` scores ``predict_split``'s positives and fixed
        negatives only.

        Raises:
            RuntimeError: before :meth:`setup`.
            ValueError: the dataset has no such split, or the split cannot make batches (the message names why).
        """
        handles = self._require_setup()
        return split_link_plan(self, split, rank, world_size, self._link_splits, self._negatives,
                               num_nodes=handles.graph.num_nodes)  # fmt: skip

    # ---- internals ---------------------------------------------------------------------------------------

    def _open(self, handles: HostGraphHandles) -> None:
        super()._open(handles)
        try:
            self._link_splits = link_splits(self._splits)
            config = self.negative_sampling
            num_nodes = handles.graph.num_nodes
            self._negatives = None if config is None else NegativeDraws(config, num_nodes, self._degree, _KEY)
            for split in self._link_splits:  # a split no batch can be made of fails here, in setup
                self.plan(split)  # type: ignore[arg-type]
        except Exception:
            self._release()  # nothing stays mapped or placed; the caller unlinks the names
            raise

    def _release(self) -> None:
        super()._release()
        self._link_splits = {}
        self._negatives = None

    def _degree(self, endpoint: int) -> torch.Tensor:
        """Out-degree (``endpoint=0``) or in-degree (``1``) of every node in the message-passing graph, original ids."""
        assert self._resources is not None
        host = self._resources.host
        graph = host.graph  # CSC by destination, internal ids
        if endpoint == 1:
            degree = graph.indptr[1:] - graph.indptr[:-1]
        else:
            degree = torch.bincount(graph.indices.to(torch.int64), minlength=graph.num_nodes)
        if host.order is None:
            return degree
        original = torch.empty_like(degree)
        original[host.order] = degree  # order[internal] = original id
        return original


def split_link_plan(
    dm: ZeroCopyDataModule,
    split: Split,
    rank: Optional[int],
    world_size: Optional[int],
    splits: Mapping[str, LinkSplit],
    negatives: Optional[NegativeDraws],
    **endpoints: Any,
) -> LinkBatchPlan:
    """The :class:`LinkBatchPlan` of ``split`` for a link DataModule ``dm`` (homogeneous or heterogeneous: the
    ``endpoints`` say the id ranges, ``num_nodes`` and, for a typed edge type, ``edge_type`` / ``num_dst_nodes``).

    ``train`` draws its negatives per batch; ``val``/``test`` score the split's fixed negatives (random ones from
    the batch seed when the split stores none); ``predict`` scores ``dm.predict_split``'s positives and fixed
    negatives only, with that split's seed.

    Raises:
        ValueError: the dataset has no such split, or the split cannot make batches (the message names why).
    """
    if rank is None or world_size is None:
        rank, _, world_size = dm._ranks()
    name = dm.predict_split if split == "predict" else split
    if name not in splits:
        raise ValueError(
            f"{_KEY}dataset ({type(dm.dataset).__name__}) has no {name!r} link split; it has "
            f"{sorted(splits)}" + (" (set data.init_args.predict_split)" if split == "predict" else "")
        )
    link = splits[name]
    is_train = split == "train"
    fixed = None if is_train else link.neg_edge_index
    plan = LinkBatchPlan(
        link.pos_edge_index,
        dm.batch_size if is_train else dm.eval_batch_size,
        negatives=None if split == "predict" else negatives,
        edge_label=link.edge_label,
        neg_edge_index=fixed,
        neg_per_positive=None if fixed is None else link.neg_per_positive,
        shuffle=dm.shuffle if is_train else False,
        drop_last=dm.drop_last if is_train else False,
        seed=dm.seed,
        rank=rank,
        world_size=world_size,
        stream=dm._stream(split),  # predict samples its split as test/validate do
        sampler_seed=dm._sampler_seed(split),
        split=name,
        **endpoints,
    )
    try:  # the labels that reach the batches, whatever form the split came in (a PyG RandomLinkSplit's: shifted)
        check_batch_labels(name, dm.dataset.split_source(name), plan.edge_label, plan.pos_edge_index,
                           shifted=plan.edge_label is not link.edge_label)  # fmt: skip
    except SplitError as exc:
        raise InputDataError(f"{_KEY}dataset ({type(dm.dataset).__name__}): {exc}") from exc
    return plan
