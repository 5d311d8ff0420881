"""The graph kinds a behaviour is tested on: an untyped graph (PyG ``Data`` batches) and a typed one (``HeteroData``
batches), each for node classification and link prediction, behind the same accessors, so that one parametrized test
(``@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)``) checks a behaviour on both.

* node kinds: :class:`TinyNodeDataset` (40 nodes, 8 features, 3 classes, 20 train / 10 val / 10 test) and
  ``helpers.hetero.TinyHeteroDataset`` (40 papers among authors and institutions, the same splits' sizes);
* link kinds: ``helpers.link.TinyLinkGraph`` and ``helpers.hetero_link.small_graph`` (users rating items).

:func:`nodes` and :func:`edges` give a batch's stores by type (the untyped batch is its one node and one edge
store), :func:`fields` every store's fields, :func:`assert_same_fields` compares two such views bitwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch_geometric.data import Data, HeteroData
from torch_geometric.nn import SAGEConv

from helpers import random_node_data
from lightning_zerocopy.datasets.base import NodeData, NodeDataset
from lightning_zerocopy.graph.schema import EDGE, NODE

__all__ = ["LINK_KINDS", "NODE_KINDS", "Kind", "TinyNodeDataset", "assert_same_fields", "edges", "fields", "nodes"]


class TinyNodeDataset(NodeDataset):
    """The untyped twin of ``TinyHeteroDataset``: 40 nodes, 160 random edges, 8 features, ``num_classes`` classes,
    20 train / 10 val / 10 test nodes, in memory (``load`` returns the same object each time)."""

    def __init__(self, seed: int = 0, num_classes: int = 3) -> None:
        self.seed, self._num_classes = seed, num_classes
        self._data: Optional[NodeData] = None

    num_features = property(lambda self: 8)
    num_classes = property(lambda self: self._num_classes)

    def load(self) -> NodeData:
        if self._data is None:
            self._data = random_node_data(40, 160, 8, self.seed, train=20, val=10, num_classes=self._num_classes)
        return self._data


class SAGE(pl.LightningModule):
    """A two-layer GraphSAGE on ``Data`` batches (as written for PyG's NeighborLoader)."""

    def __init__(self, in_channels: int, out_channels: int, hidden: int = 16) -> None:
        super().__init__()
        self.conv1, self.conv2 = SAGEConv(in_channels, hidden), SAGEConv(hidden, out_channels)
        self.tested: dict[int, torch.Tensor] = {}

    def forward(self, batch: Data) -> torch.Tensor:
        return self.conv2(self.conv1(batch.x, batch.edge_index).relu(), batch.edge_index)

    def training_step(self, batch: Data, batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self(batch)[: batch.batch_size], batch.y[: batch.batch_size])
        self.log("train_loss", loss, batch_size=batch.batch_size)
        return loss

    def validation_step(self, batch: Data, batch_idx: int) -> None:
        size = batch.batch_size
        self.log("val_loss", F.cross_entropy(self(batch)[:size], batch.y[:size]), batch_size=size)

    def test_step(self, batch: Data, batch_idx: int) -> None:
        size = batch.batch_size
        for node, row in zip(batch.n_id[:size].tolist(), self(batch)[:size]):
            self.tested[node] = row.detach().clone()

    def predict_step(self, batch: Data, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


@dataclass(frozen=True)
class Kind:
    """One graph kind: ``typed`` or not, for ``task`` ``"node"`` or ``"link"``. Its ``str`` is the test id."""

    typed: bool
    task: str = "node"

    def __str__(self) -> str:
        return ("typed" if self.typed else "untyped") + ("" if self.task == "node" else "-link")

    @property
    def input_type(self) -> str:
        """The seeds' node type of a node task (the untyped graph's one type)."""
        return "paper" if self.typed else NODE

    def dataset(self, tmp_path: Any = None, **kwargs: Any) -> Any:
        """The kind's dataset (a link kind's typed graph is cached under ``tmp_path``)."""
        if self.task == "node":
            from helpers.hetero import TinyHeteroDataset

            return TinyHeteroDataset(**kwargs) if self.typed else TinyNodeDataset(**kwargs)
        if self.typed:
            from helpers.hetero_link import small_graph

            return small_graph(str(tmp_path / "graph"), **kwargs)
        from helpers.link import TinyLinkGraph

        return TinyLinkGraph(**kwargs)

    def datamodule(self, dataset: Any = None, tmp_path: Any = None, **kwargs: Any) -> Any:
        """The kind's DataModule over ``dataset`` (default: :meth:`dataset`), with two hops of ``[3, 2]`` neighbors,
        one sampling thread and the task's batch size unless ``kwargs`` say otherwise (``fanouts`` or
        ``num_neighbors``, whichever the DataModule takes)."""
        from lightning_zerocopy import (
            ZeroCopyDataModule,
            ZeroCopyHeteroDataModule,
            ZeroCopyHeteroLinkDataModule,
            ZeroCopyLinkDataModule,
        )

        dataset = self.dataset(tmp_path) if dataset is None else dataset
        options: dict[str, Any] = dict(batch_size=8 if self.task == "node" else 48, num_threads=1)
        if self.task == "link":
            options["eval_batch_size"] = 16
        options.update(kwargs)
        fanouts = options.pop("fanouts", options.pop("num_neighbors", [3, 2]))
        if not self.typed and self.task == "node":
            return ZeroCopyDataModule(dataset, fanouts=fanouts, **options)
        cls = {(True, "node"): ZeroCopyHeteroDataModule, (True, "link"): ZeroCopyHeteroLinkDataModule,
               (False, "link"): ZeroCopyLinkDataModule}[(self.typed, self.task)]  # fmt: skip
        return cls(dataset, num_neighbors=fanouts, **options)

    def model(self, dm: Any) -> pl.LightningModule:
        """A small model of the kind's task: a node classifier (``tested``: each test seed's logits by node id), or the
        package's link predictor."""
        if self.task == "link":
            from lightning_zerocopy.models import HeteroLinkPredictor, LinkPredictor

            if self.typed:
                return HeteroLinkPredictor(dm.metadata, dm.num_features, dm.num_nodes, dm.edge_type, hidden_channels=8)
            return LinkPredictor(dm.num_features, hidden_channels=8)
        if self.typed:
            from helpers.hetero import TinyHeteroSAGE

            return TinyHeteroSAGE(dm.metadata, dm.num_features, dm.num_nodes, dm.num_classes)
        return SAGE(dm.num_features, dm.num_classes)

    def seeds(self, batch: Any) -> Any:
        """The store of a node batch's seeds (``n_id``, ``batch_size``, ``y``, ``x``)."""
        return batch[self.input_type] if self.typed else batch

    def supervised(self, dm: Any) -> Any:
        """The supervised edge type of a link DataModule (the untyped graph's one edge type)."""
        return dm.edge_type if self.typed else EDGE

    def label_store(self, batch: Any, edge_type: Any) -> Any:
        """The store of a link batch's label fields (``edge_label_index``, ``edge_label``, ``input_id``, ...)."""
        return batch[edge_type] if self.typed else batch

    def pairs(self, batch: Any, edge_type: Any) -> torch.Tensor:
        """A link batch's ``edge_label_index`` as global ``(src, dst)`` ids, each row through its endpoint type's
        ``n_id``."""
        index, by_type = self.label_store(batch, edge_type).edge_label_index, nodes(batch)
        return torch.stack([by_type[edge_type[0]].n_id[index[0]], by_type[edge_type[2]].n_id[index[1]]])


NODE_KINDS = [Kind(False), Kind(True)]
LINK_KINDS = [Kind(False, "link"), Kind(True, "link")]


def nodes(batch: Any) -> dict[str, Any]:
    """The batch's node stores by node type (an untyped batch: itself, as :data:`NODE`)."""
    if isinstance(batch, HeteroData):
        return {t: batch[t] for t in batch.node_types}
    return {NODE: batch}


def edges(batch: Any) -> dict[Any, Any]:
    """The batch's edge stores by edge type (an untyped batch: itself, as :data:`EDGE`)."""
    if isinstance(batch, HeteroData):
        return {et: batch[et] for et in batch.edge_types}
    return {EDGE: batch}


def fields(batch: Any) -> dict:
    """Every store's fields by ``(store key, field)``, tensors cloned onto the CPU (slot views are reused)."""
    stores = [*batch.node_stores, *batch.edge_stores] if isinstance(batch, HeteroData) else [batch.stores[0]]
    out = {}
    for store in stores:
        for field, value in store.items():
            out[(store._key, field)] = value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
    return out


def assert_same_fields(got: dict, want: dict, where: object = "") -> None:
    """Two :func:`fields` views hold the same fields, tensors of the same dtype and values."""
    assert got.keys() == want.keys() and len(want) > 0, where
    for key, value in want.items():
        other = got[key]
        if isinstance(value, torch.Tensor):
            assert other.dtype == value.dtype and torch.equal(other, value), (where, key)
        else:
            assert other == value, (where, key)
