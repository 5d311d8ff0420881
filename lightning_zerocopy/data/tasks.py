"""What a DataModule predicts, composed into the one core (:class:`~lightning_zerocopy.data.datamodule.GraphDataModule`):
which seeds a batch starts from, the plan over them, the link fields and the degree the negatives may be weighted by.

* :class:`NodeTask` — node prediction: the seeds are the input type's split nodes
  (:class:`~lightning_zerocopy.data.plan.BatchPlan`; ``predict_split: all`` predicts every input-type node);
* :class:`LinkTask` — link prediction on one edge type: the seeds are the endpoints of a batch's supervision edges
  and negatives (:class:`~lightning_zerocopy.data.link_plan.LinkBatchPlan`, fields as PyG's ``LinkNeighborLoader``).

A task reads the DataModule it serves (``dm``, a :class:`~lightning_zerocopy.data.graph_datamodule.GraphDataModule`:
its batch sizes, seed, splits, handles and resources) and is opened in its ``setup``. The graph's types are the
DataModule's schema, not the task's: the same task serves an untyped graph (one type) and a
typed one (``edge_type`` names the supervised edge type; untyped: ``None``, the one edge type).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from lightning_zerocopy.data.gpu_options import KEY_PREFIX
from lightning_zerocopy.data.host.links import link_splits
from lightning_zerocopy.data.link_plan import LinkBatchPlan
from lightning_zerocopy.data.negatives import NegativeDraws, NegativeSampling
from lightning_zerocopy.data.plan import SPLIT_STREAMS, BatchPlan
from lightning_zerocopy.data.resources import HostData
from lightning_zerocopy.datasets.base import InputDataError
from lightning_zerocopy.datasets.link_checks import check_batch_labels
from lightning_zerocopy.datasets.links import LinkSplit
from lightning_zerocopy.datasets.splits import SplitError
from lightning_zerocopy.graph.schema import EDGE, EdgeType

Split = str  # "train" | "val" | "test" | "predict"

__all__ = ["LinkTask", "NodeTask", "degree", "plan_options"]

_KEY = KEY_PREFIX


def plan_options(dm: Any, split: Split, rank: int, world_size: int) -> dict[str, Any]:
    """What every task's plan of ``split`` takes from the DataModule: the training batch size, shuffle and
    ``drop_last`` (evaluation: its batch size, in order, every item), the seed, the rank, and the random stream and
    sampler seed. ``predict`` takes the stream of the split it predicts (``all`` has one of its own), so an evaluated
    item's sample depends on the item and its split's seed only, not on the command that asks for it; val/test/predict
    give every batch the split's one sampler seed (node-keyed sampling) unless every evaluation fanout is ``-1``."""
    is_train = split == "train"
    stream = SPLIT_STREAMS[dm.predict_split if split == "predict" and dm.predict_split in SPLIT_STREAMS else split]
    return dict(batch_size=dm.batch_size if is_train else dm.eval_batch_size, shuffle=dm.shuffle if is_train else False,
                drop_last=dm.drop_last if is_train else False, seed=dm.seed, rank=rank, world_size=world_size,
                stream=stream, sampler_seed="split" if not is_train and dm._eval_node_keyed else "batch")  # fmt: skip


class NodeTask:
    """Node prediction: a batch's seeds are input-type nodes of the split (the host copy shares the node splits and
    the input type's labels)."""

    link = False

    def open(self, dm: Any) -> None:
        """Nothing to open: the node splits are the DataModule's split tensors."""

    def close(self) -> None:
        """Nothing to release."""

    def plan(self, dm: Any, split: Split, rank: int, world_size: int) -> BatchPlan:
        """The batch plan of ``split`` for ``rank`` of ``world_size`` (``predict`` over ``predict_split``, sampled as
        that split is evaluated)."""
        return BatchPlan(self.input_nodes(dm, split), **plan_options(dm, split, rank, world_size),
                         input_id_kind=self.input_id_kind(dm, split))  # fmt: skip

    @staticmethod
    def input_id_kind(dm: Any, split: Split) -> str:
        """What the batches' ``input_id`` holds, as PyG's loaders: ``"node"`` ids where the dataset gives the split as
        a boolean mask (``split_is_mask``, the PyG wrappers), else ``"position"`` s in the split."""
        name = dm.predict_split if split == "predict" else split
        is_mask = getattr(dm.dataset, "split_is_mask", None)
        return "node" if name != "all" and callable(is_mask) and is_mask(name) else "position"

    def input_nodes(self, dm: Any, split: Split) -> torch.Tensor:
        """The seed nodes of ``split`` (input-type ids)."""
        name = dm.predict_split if split == "predict" else split
        if name == "all":
            handles = dm.handles
            return torch.arange(dict(handles.num_nodes)[handles.schema.input_type])
        return dm.split_tensors[name]


class LinkTask:
    """Link prediction on one edge type: a batch's seeds are the endpoints of its supervision edges and negatives.

    Args:
        edge_type: the supervised edge type of a typed graph (source ids of ``edge_type[0]``, destinations of
            ``edge_type[2]``), or ``None`` for an untyped graph's one edge type.
        negatives: the negatives of the training batches (and of val/test splits that store none), or ``None``.
    """

    link = True

    def __init__(self, edge_type: Optional[EdgeType], negatives: Optional[NegativeSampling]) -> None:
        self.edge_type = edge_type
        self.negative_sampling = negatives
        self.splits: dict[str, LinkSplit] = {}
        self.negatives: Optional[NegativeDraws] = None

    def open(self, dm: Any) -> None:
        """The supervision edges of every split (from the shared split tensors) and the negatives' draws (weights by
        degree from the host graph); then every split's plan, so a split no batch can be made of fails in setup."""
        self.splits = link_splits(dm.split_tensors)
        config, endpoints = self.negative_sampling, self._endpoints(dm)
        host = dm.resources.host  # type: ignore[union-attr]
        edge_type = self.edge_type or EDGE
        self.negatives = None if config is None else NegativeDraws(
            config, endpoints["num_nodes"], lambda end: degree(host, edge_type, end), _KEY,
            num_dst_nodes=endpoints.get("num_dst_nodes"))  # fmt: skip
        for split in self.splits:
            self.plan(dm, split, *dm._ranks()[::2])  # type: ignore[arg-type]

    def close(self) -> None:
        self.splits, self.negatives = {}, None

    def _endpoints(self, dm: Any) -> dict[str, Any]:
        """The id ranges of the plan: one range (untyped), or the source and destination types' (typed)."""
        counts = dict(dm.handles.num_nodes)
        if self.edge_type is None:
            return {"num_nodes": next(iter(counts.values()))}
        src, _, dst = self.edge_type
        return {"num_nodes": counts[src], "num_dst_nodes": counts[dst], "edge_type": self.edge_type}

    def plan(self, dm: Any, split: Split, rank: int, world_size: int) -> LinkBatchPlan:
        """The link batch plan of ``split``: ``train`` draws its negatives per batch; ``val``/``test`` score the
        split's fixed negatives (random ones from the batch seed when the split stores none); ``predict`` scores
        ``predict_split``'s positives and fixed negatives only, with that split's seed.

        Raises:
            ValueError: the dataset has no such split, or the split cannot make batches (the message names why).
        """
        name = dm.predict_split if split == "predict" else split
        if name not in self.splits:
            raise ValueError(
                f"{_KEY}dataset ({type(dm.dataset).__name__}) has no {name!r} link split; it has "
                f"{sorted(self.splits)}" + (" (set data.init_args.predict_split)" if split == "predict" else "")
            )
        link = self.splits[name]
        fixed = None if split == "train" else link.neg_edge_index
        plan = LinkBatchPlan(
            link.pos_edge_index,
            negatives=None if split == "predict" else self.negatives,
            edge_label=link.edge_label,
            neg_edge_index=fixed,
            neg_per_positive=None if fixed is None else link.neg_per_positive,
            split=name,
            **plan_options(dm, split, rank, world_size),
            **self._endpoints(dm),
        )
        try:  # the labels that reach the batches, whatever form the split came in (a PyG RandomLinkSplit's: shifted)
            check_batch_labels(name, dm.dataset.split_source(name), plan.edge_label, plan.pos_edge_index,
                               shifted=plan.edge_label is not link.edge_label)  # fmt: skip
        except SplitError as exc:
            raise InputDataError(f"{_KEY}dataset ({type(dm.dataset).__name__}): {exc}") from exc
        return plan


def degree(host: HostData, edge_type: EdgeType, endpoint: int) -> torch.Tensor:
    """Out-degree of every source-type node (``endpoint=0``) or in-degree of every destination-type node (``1``) in
    ``edge_type``'s message-passing graph, in the dataset's ids (a node-ordered graph's degrees mapped back)."""
    graph = host.graphs[edge_type]  # CSC by destination, over max(counts) ids (internal ids with a node order)
    src, _, dst = edge_type
    if endpoint == 1:
        counts = (graph.indptr[1:] - graph.indptr[:-1])[: host.num_nodes[dst]]
    else:
        counts = torch.bincount(graph.indices.to(torch.int64), minlength=host.num_nodes[src])
    if host.order is None:
        return counts
    original = torch.empty_like(counts)
    original[host.order] = counts  # order[internal] = original id
    return original
