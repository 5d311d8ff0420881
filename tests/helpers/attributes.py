"""Graphs with the attributes PyG users keep on them (``edge_weight``, masks, integer and multi-dimensional node and edge
tensors, a graph-level value), the four DataModules over them, and PyG's own ``filter_data`` /
``filter_hetero_data`` as the reference of what each batch must hold."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader.utils import filter_data, filter_hetero_data
from torch_geometric.nn import GCNConv

from lightning_zerocopy import (
    ZeroCopyDataModule,
    ZeroCopyHeteroDataModule,
    ZeroCopyHeteroLinkDataModule,
    ZeroCopyLinkDataModule,
)
from lightning_zerocopy.datasets import PyGLinkDataset, PyGNodeDataset
from lightning_zerocopy.datasets.attributes import pyg_attributes
from lightning_zerocopy.datasets.pyg_hetero import PyGHeteroDataset
from lightning_zerocopy.datasets.hetero import EdgeType
from lightning_zerocopy.datasets.hetero_links import HeteroLinkData, HeteroLinkDataset
from lightning_zerocopy.datasets.links import LinkSplit

#: what the batch fields of each kind are (PyG's loaders set them; not attributes)
BATCH_FIELDS = {"edge_index", "n_id", "e_id", "input_id", "batch_size", "num_sampled_nodes",
                "num_sampled_edges", "edge_label_index", "edge_label", "edge_label_query", "src_index",
                "dst_pos_index", "dst_neg_index", "num_nodes"}  # fmt: skip
WRITES: EdgeType = ("author", "writes", "paper")


def _masks(count: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    perm = torch.randperm(count, generator=g)
    cuts = {"train": perm[: count // 2], "val": perm[count // 2 : 3 * count // 4], "test": perm[3 * count // 4 :]}
    masks = {}
    for name, ids in cuts.items():
        masks[f"{name}_mask"] = torch.zeros(count, dtype=torch.bool).index_fill_(0, ids, True)
    return masks


def attributed_data(num_nodes: int = 60, num_edges: int = 400, seed: int = 0) -> Data:
    """A ``Data`` as a PyG user keeps one: features, labels, masks, ``edge_weight``, ``edge_attr``, an integer node
    attribute, a 3-D node attribute, a multi-dimensional edge attribute, an edge attribute stored ``[2, E]`` (PyG's
    cat dim -1 for a name with ``index``) and a graph-level string."""
    g = torch.Generator().manual_seed(seed)
    data = Data(x=torch.randn(num_nodes, 6, generator=g), y=torch.randint(0, 3, (num_nodes,), generator=g),
                edge_index=torch.randint(0, num_nodes, (2, num_edges), generator=g), **_masks(num_nodes, g))  # fmt: skip
    data.edge_weight = torch.rand(num_edges, generator=g)
    data.edge_attr = torch.randn(num_edges, 3, generator=g)
    data.year = torch.randint(1990, 2024, (num_nodes,), generator=g)
    data.patch = torch.randn(num_nodes, 2, 3, generator=g).to(torch.float16)
    data.edge_kind = torch.randint(0, 5, (num_edges, 2, 2), generator=g, dtype=torch.int8)
    data.pair_index = torch.randint(0, 9, (2, num_edges), generator=g)
    data.name = "a graph"
    return data


def attributed_hetero(seed: int = 0) -> HeteroData:
    """Papers (labelled, masks, a year), authors (a 2-column score, no features), institutions; a weighted
    ``writes`` and its reverse, ``cites`` with ``edge_attr``."""
    g = torch.Generator().manual_seed(seed)
    counts = {"paper": 50, "author": 70, "institution": 6}
    data = HeteroData()
    data["paper"].x = torch.randn(counts["paper"], 8, generator=g)
    data["paper"].y = torch.randint(0, 3, (counts["paper"],), generator=g)
    for name, mask in _masks(counts["paper"], g).items():
        data["paper"][name] = mask
    data["paper"].year = torch.randint(1990, 2024, (counts["paper"],), generator=g)
    data["author"].num_nodes = counts["author"]
    data["author"].score = torch.randn(counts["author"], 2, generator=g)
    data["institution"].x = torch.randn(counts["institution"], 4, generator=g)

    def edges(src: str, dst: str, count: int) -> torch.Tensor:
        return torch.stack([torch.randint(0, counts[src], (count,), generator=g),
                            torch.randint(0, counts[dst], (count,), generator=g)])  # fmt: skip

    data["paper", "cites", "paper"].edge_index = edges("paper", "paper", 200)
    data["paper", "cites", "paper"].edge_attr = torch.randn(200, 2, generator=g)
    writes = edges("author", "paper", 160)
    data[WRITES].edge_index = writes
    data[WRITES].weight = torch.rand(160, generator=g)
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    data["paper", "rev_writes", "author"].weight = data[WRITES].weight.clone()
    employs = edges("institution", "author", 70)
    data["institution", "employs", "author"].edge_index = employs
    return data


class AttributedHeteroLinks(HeteroLinkDataset):
    """Link prediction on ``author__writes__paper`` of :func:`attributed_hetero`: its last 30 edges are the val
    positives (left out of the graph with their rows of every ``writes`` edge attribute), the rest train."""

    def __init__(self, seed: int = 0) -> None:
        data = attributed_hetero(seed)
        keep = data[WRITES].edge_index.shape[1] - 30
        self.val = data[WRITES].edge_index[:, keep:].clone()
        data[WRITES].edge_index = data[WRITES].edge_index[:, :keep]
        data[WRITES].weight = data[WRITES].weight[:keep]
        self.graph = data

    node_types = property(lambda self: list(self.graph.node_types))
    edge_types = property(lambda self: [tuple(t) for t in self.graph.edge_types])
    num_nodes = property(lambda self: {t: int(self.graph[t].num_nodes) for t in self.graph.node_types})
    num_features = property(lambda self: {t: int(self.graph[t].x.shape[1]) for t in self.graph.node_types
                                          if "x" in self.graph[t]})  # fmt: skip
    edge_type = property(lambda self: WRITES)

    def load(self) -> HeteroLinkData:
        graph = self.graph
        return HeteroLinkData(
            num_nodes=self.num_nodes, edge_index={tuple(t): graph[t].edge_index for t in graph.edge_types},
            x={t: graph[t].x for t in graph.node_types if "x" in graph[t]}, edge_type=WRITES,
            splits={"train": LinkSplit(graph[WRITES].edge_index.clone()), "val": LinkSplit(self.val)},
            attributes=pyg_attributes(graph, ("x",)),
        )  # fmt: skip


def attributed_datamodule(kind: str, **kwargs: Any) -> tuple[Any, Any]:
    """The DataModule of ``kind`` (``node``, ``link``, ``hetero``, ``hetero_link``) over an attributed graph (8 seeds or
    positive edges per batch, 2 hops), and the graph PyG's loaders would filter for it."""
    options = {"batch_size": 8, "num_threads": 1, **kwargs}
    if kind == "node":
        data = attributed_data()
        return ZeroCopyDataModule(PyGNodeDataset(data), fanouts=[3, 2], **options), data
    if kind == "link":
        data = attributed_data()
        del data.pair_index  # RandomLinkSplit indexes edge attributes along dim 0 only
        dataset = PyGLinkDataset(data, random_link_split={"num_val": 0.1, "num_test": 0.1})
        return ZeroCopyLinkDataModule(dataset, num_neighbors=[3, 2], **options), dataset.splits["val"]
    if kind == "hetero":
        data = attributed_hetero()
        return ZeroCopyHeteroDataModule(PyGHeteroDataset(data), num_neighbors=[3, 2], **options), data
    dataset = AttributedHeteroLinks()
    return ZeroCopyHeteroLinkDataModule(dataset, num_neighbors=[3, 2], **options), dataset.graph


def attributes_of_batch(batch: Any) -> dict[tuple, torch.Tensor]:
    """Every tensor of a batch but the loader's fields (``x``, ``y`` and the attributes), by ``(store key, name)``
    (``None`` for an untyped batch's one store)."""
    stores = [(None, batch._store)] if isinstance(batch, Data) else [(s._key, s) for s in (*batch.node_stores,
                                                                                        *batch.edge_stores)]  # fmt: skip
    return {(key, name): value for key, store in stores for name, value in store.items()
            if name not in BATCH_FIELDS and isinstance(value, torch.Tensor)}  # fmt: skip


def pyg_reference(source: Any, batch: Any) -> dict[tuple, torch.Tensor]:
    """What PyG's ``filter_data`` / ``filter_hetero_data`` make of ``source`` for the batch's ``n_id`` / ``e_id``, by
    ``(store key, name)``: every node- and edge-level tensor (``x`` and ``y`` too; the loader's fields and graph-level
    values left out)."""
    batch = batch.cpu() if hasattr(batch, "cpu") else batch
    if isinstance(source, Data):
        out = filter_data(source, batch.n_id, batch.edge_index[0], batch.edge_index[1], batch.e_id)
        return {(None, k): v for k, v in out.items()
                if k not in BATCH_FIELDS and (source.is_node_attr(k) or source.is_edge_attr(k))}  # fmt: skip
    nodes = {t: batch[t].n_id for t in batch.node_types}
    rows = {t: batch[t].edge_index[0] for t in batch.edge_types}
    cols = {t: batch[t].edge_index[1] for t in batch.edge_types}
    out = filter_hetero_data(source, nodes, rows, cols, {t: batch[t].e_id for t in batch.edge_types})
    ref = {}
    for store in (*out.node_stores, *out.edge_stores):
        original = source[store._key]
        for name, value in store.items():
            if name not in BATCH_FIELDS and (original.is_node_attr(name) or original.is_edge_attr(name)):
                ref[(store._key, name)] = value
    return ref


class WeightedGCN(pl.LightningModule):
    """A weighted GCN written as PyG's examples write it: ``GCNConv(...)(x, edge_index, edge_weight)``, reading the
    node masks too (it trains on the batch's seeds that ``train_mask`` marks)."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_weight: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index, edge_weight).relu(), edge_index, edge_weight)

    def training_step(self, batch, batch_idx):  # noqa: ANN001
        # PyG's ``Data.edge_weight`` is ``None`` when the batch has none: GCNConv would then train unweighted, silently
        assert batch.edge_weight is not None, "the batch has no edge_weight"
        out = self(batch.x, batch.edge_index, batch.edge_weight)[: batch.batch_size]
        seeds = batch.train_mask[: batch.batch_size]
        loss = F.cross_entropy(out[seeds], batch.y[: batch.batch_size][seeds])
        self.log("train_loss", loss, batch_size=batch.batch_size)
        return loss

    def validation_step(self, batch, batch_idx):  # noqa: ANN001
        out = self(batch.x, batch.edge_index, batch.edge_weight)[: batch.batch_size]
        acc = (out.argmax(-1) == batch.y[: batch.batch_size]).float().mean()
        self.log("val_acc", acc, batch_size=batch.batch_size)

    def predict_step(self, batch, batch_idx):  # noqa: ANN001
        return self(batch.x, batch.edge_index, batch.edge_weight)[: batch.batch_size]

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.Adam(self.parameters(), lr=0.01)
