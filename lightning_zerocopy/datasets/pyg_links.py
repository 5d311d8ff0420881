"""A PyG ``Data`` split by ``torch_geometric.transforms.RandomLinkSplit`` as a :class:`LinkDataset`.

``RandomLinkSplit`` returns three ``Data`` objects. Each has ``edge_label_index`` (positives, then negatives) and
``edge_label`` (``0`` for a negative; a positive is ``1``, or the edge's own label + 1 where the graph had an
``edge_label``), or, with ``split_labels=True``, ``pos_edge_label_index`` / ``neg_edge_label_index``. They map to
:class:`~lightning_zerocopy.datasets.LinkSplit` so:

* positives are the label edges whose label is not ``0``; ``edge_label`` keeps the graph's own labels (PyG's
  ``+ 1`` undone) and is ``None`` where every positive is ``1`` (no labels of its own);
* val/test negatives become the split's fixed negatives, one pool (``neg_per_positive = None``): PyG draws them
  for the split as a whole, not per positive; train negatives are dropped (the DataModule draws them per batch);
* the message-passing graph is ``val_data.edge_index``, the training edges (``RandomLinkSplit`` adds the val edges
  for test; one graph serves every split here, so test is scored without them, the stricter choice). With
  ``disjoint_train_ratio > 0`` the train supervision edges are in that graph as well.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch
from torch_geometric.data import Data, Dataset
from torch_geometric.transforms import RandomLinkSplit

from lightning_zerocopy.datasets.attributes import pyg_attributes
from lightning_zerocopy.datasets.links import LINK_SPLITS, LinkData, LinkDataset, LinkSplit
from lightning_zerocopy.datasets.pyg import as_features, graph_of
from lightning_zerocopy.datasets.saved_graph import GraphFile

__all__ = ["PyGLinkDataset"]

#: what the link contract carries itself: features, edge features and RandomLinkSplit's supervision edges
_CARRIED = ("x", "edge_attr", "edge_label", "edge_label_index", "pos_edge_label", "pos_edge_label_index",
            "neg_edge_label", "neg_edge_label_index")  # fmt: skip


def _edge_ids(tensor: torch.Tensor, what: str) -> torch.Tensor:
    if tensor.dim() != 2 or tensor.shape[0] != 2:
        raise ValueError(f"{what} must have shape [2, num_edges], got {tuple(tensor.shape)}")
    if tensor.is_floating_point():
        if not bool((tensor == tensor.round()).all()):
            raise ValueError(f"{what} holds {float(tensor[tensor != tensor.round()][0]):g}, which is not a node id")
    return tensor.to(torch.int64)


def _positive_labels(labels: Optional[torch.Tensor], incremented: bool) -> Optional[torch.Tensor]:
    """The graph's own labels of the positives (``None``: all ``1``, PyG's binary default)."""
    if labels is None or bool((labels == 1).all()):
        return None
    return labels - 1 if incremented else labels


def _link_split(data: Data, name: str, keep_negatives: bool) -> LinkSplit:
    where = f"{name}_data"
    if "pos_edge_label_index" in data:  # RandomLinkSplit(split_labels=True)
        pos = _edge_ids(data.pos_edge_label_index, f"{where}.pos_edge_label_index")
        neg = data.get("neg_edge_label_index")
        neg = _edge_ids(neg, f"{where}.neg_edge_label_index") if neg is not None else None
        label = _positive_labels(data.get("pos_edge_label"), incremented=neg is not None and neg.numel() > 0)
    elif "edge_label_index" in data:
        index = _edge_ids(data.edge_label_index, f"{where}.edge_label_index")
        labels = data.get("edge_label")
        if labels is None:
            pos, neg, label = index, None, None
        else:
            if labels.shape[0] != index.shape[1]:
                raise ValueError(f"{where}.edge_label has {labels.shape[0]} entries for {index.shape[1]} edge_label_index edges")
            positive = labels != 0
            pos, neg = index[:, positive], index[:, ~positive]
            label = _positive_labels(labels[positive], incremented=neg.numel() > 0)
    else:
        raise ValueError(
            f"{where} has neither edge_label_index nor pos_edge_label_index: split the graph with "
            "torch_geometric.transforms.RandomLinkSplit, or pass the unsplit Data with `random_link_split`"
        )
    if not keep_negatives or (neg is not None and neg.numel() == 0):
        neg = None
    return LinkSplit(pos_edge_index=pos, edge_label=label, neg_edge_index=neg)


class PyGLinkDataset(LinkDataset):
    """Link prediction on a PyG graph, split by ``RandomLinkSplit`` (see the module docstring).

    Args:
        data: the ``(train_data, val_data, test_data)`` that ``RandomLinkSplit`` returned; or one unsplit ``Data``,
            a PyG ``Dataset`` (its graph 0) or the path of a ``torch.save``d ``Data``, which is split here.
        random_link_split: for an unsplit graph, ``RandomLinkSplit``'s arguments (``num_val``, ``num_test``,
            ``is_undirected``, ``neg_sampling_ratio``, ...); default: its defaults.
        seed: seed of the split of an unsplit graph (the same seed gives the same split).
    """

    def __init__(
        self,
        data: Union[Data, Dataset, GraphFile, Sequence[Data]],
        random_link_split: Optional[dict[str, Any]] = None,
        seed: int = 0,
    ) -> None:
        self.split_here = not isinstance(data, (list, tuple))
        if self.split_here:
            data = graph_of(data, "a torch_geometric Data, Dataset, path or (train, val, test) Data")
            if data.get("edge_index") is None:
                raise ValueError("the PyG Data object has no `edge_index`")
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                data = RandomLinkSplit(**(random_link_split or {}))(data)
        elif random_link_split is not None:
            raise ValueError("random_link_split splits an unsplit graph; `data` is already split into (train, val, test)")
        if len(data) != 3 or not all(isinstance(d, Data) for d in data):
            raise ValueError(f"data must be the (train_data, val_data, test_data) of RandomLinkSplit, got {len(data)} objects")
        for name, split in zip(LINK_SPLITS, data):
            for key in ("x", "edge_index"):
                if split.get(key) is None:
                    raise ValueError(f"{name}_data has no `{key}`")
        self.splits = dict(zip(LINK_SPLITS, data))

    @property
    def num_features(self) -> int:
        return int(self.splits["train"].x.shape[1])

    def split_source(self, split: str) -> str:
        """The ``Data`` attribute that holds the split's edges, e.g. ``val_data.edge_label_index``."""
        data = self.splits[split]
        key = "pos_edge_label_index" if "pos_edge_label_index" in data else "edge_label_index"
        return f"{split}_data.{key}" + (" (RandomLinkSplit here)" if self.split_here else "")

    def load(self) -> LinkData:
        graph = self.splits["val"]
        return LinkData(
            edge_index=_edge_ids(graph.edge_index, "val_data.edge_index"),
            x=as_features(graph.x),
            splits={name: _link_split(d, name, keep_negatives=name != "train") for name, d in self.splits.items()},
            edge_attr=graph.get("edge_attr"),
            attributes=pyg_attributes(graph, _CARRIED, origin="val_data: "),
        )
