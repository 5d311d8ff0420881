"""A small heterogeneous link dataset for the tests: the generated user–item graph, built once per test session into
a temporary cache, and an in-memory variant with one fault (for the one-line errors)."""

from __future__ import annotations

from typing import Optional

import torch

from lightning_zerocopy.datasets.hetero import EdgeType
from lightning_zerocopy.datasets.hetero_links import HeteroLinkData, HeteroLinkDataset
from lightning_zerocopy.datasets.synthetic_hetero_links import RATES, REV_RATES, SyntheticHeteroLinkGraph

USER, ITEM = "user", "item"
__all__ = ["ITEM", "RATES", "REV_RATES", "USER", "FaultyHeteroLinks", "small_graph"]


def small_graph(cache_dir: str, **kwargs) -> SyntheticHeteroLinkGraph:
    """300 users and 150 items (the id spaces differ in size), 8 features per type, 5 negatives per val/test
    positive."""
    kwargs.setdefault("num_users", 300)
    kwargs.setdefault("num_items", 150)
    kwargs.setdefault("num_features", 8)
    kwargs.setdefault("neg_per_positive", 5)
    return SyntheticHeteroLinkGraph(cache_dir=cache_dir, **kwargs)


class FaultyHeteroLinks(HeteroLinkDataset):
    """:func:`small_graph` with one fault:

    * ``"unknown_type"``: the supervised edge type ``user__likes__item`` is none of the graph's edge types;
    * ``"src_range"``: a train positive's source is user 300 (there are 300 users);
    * ``"dst_range"``: a test negative's destination is item 150 (there are 150 items; 150 is a valid user id).
    """

    def __init__(self, cache_dir: str, fault: str) -> None:
        self.graph, self.fault = small_graph(cache_dir), fault
        self._data: Optional[HeteroLinkData] = None

    node_types = property(lambda self: self.graph.node_types)
    edge_types = property(lambda self: self.graph.edge_types)
    num_nodes = property(lambda self: self.graph.num_nodes)
    num_features = property(lambda self: self.graph.num_features)

    @property
    def edge_type(self) -> EdgeType:
        return (USER, "likes", ITEM) if self.fault == "unknown_type" else RATES

    def load(self) -> HeteroLinkData:
        data = self.graph.load()
        splits = {name: s for name, s in data.splits.items()}
        if self.fault == "src_range":
            splits["train"].pos_edge_index = splits["train"].pos_edge_index.clone()
            splits["train"].pos_edge_index[0, 7] = 300
        elif self.fault == "dst_range":
            splits["test"].neg_edge_index = splits["test"].neg_edge_index.clone()
            splits["test"].neg_edge_index[1, 3] = 150
        return HeteroLinkData(num_nodes=data.num_nodes, edge_index=data.edge_index, x=data.x, edge_type=RATES,
                              splits=splits, x_files=data.x_files)  # fmt: skip


def global_pairs(batch, edge_type: EdgeType = RATES) -> torch.Tensor:
    """The batch's ``edge_label_index`` as global ``(src, dst)`` ids, through each endpoint type's ``n_id``."""
    index = batch[edge_type].edge_label_index
    return torch.stack([batch[edge_type[0]].n_id[index[0]], batch[edge_type[2]].n_id[index[1]]])


class CitesLinks(HeteroLinkDataset):
    """Link prediction on ``paper__cites__paper`` of the tiny heterogeneous graph (``helpers.hetero``): one node type on
    both ends. The last 30 citations are the val positives (out of the graph, no fixed negatives), the rest train."""

    def __init__(self) -> None:
        from helpers.hetero import CITES, EDGE_TYPES, make_hetero_data

        self._edge_type, self._edge_types, self._make = CITES, list(EDGE_TYPES), make_hetero_data

    node_types = property(lambda self: ["paper", "author", "institution"])
    edge_types = property(lambda self: list(self._edge_types))
    num_nodes = property(lambda self: {"paper": 40, "author": 60, "institution": 7})
    num_features = property(lambda self: {"paper": 8, "institution": 4})
    edge_type = property(lambda self: self._edge_type)

    def load(self) -> HeteroLinkData:
        from lightning_zerocopy.datasets.links import LinkSplit

        data = self._make()
        cites = data.edge_index[self._edge_type]
        keep = cites[0] != cites[1]
        cites = cites[:, keep]
        train, val = cites[:, :-30], cites[:, -30:]
        edges = dict(data.edge_index)
        edges[self._edge_type] = train.contiguous()
        return HeteroLinkData(num_nodes=data.num_nodes, edge_index=edges, x=data.x, edge_type=self._edge_type,
                              splits={"train": LinkSplit(train.contiguous()), "val": LinkSplit(val.contiguous())})
