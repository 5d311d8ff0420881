"""Drop-in, heterogeneous: a node-classification LightningModule written as PyG's ogbn-mag / ``to_hetero`` examples
write one trains unchanged on batches in the layout of PyG's hetero ``NeighborLoader``, which our
``ZeroCopyHeteroDataModule`` yields.

The module below knows nothing about lightning-zerocopy: a homogeneous GraphSAGE-like ``nn.Module`` turned into a
heterogeneous one by ``torch_geometric.nn.to_hetero(..., aggr="sum")``, ``forward(x_dict, edge_index_dict)``,
``nn.Embedding`` tables for the node types without features (looked up with ``batch[type].n_id``), cross-entropy on
``batch["paper"].y[:batch_size]``. It runs on hand-built batches in PyG's layout (``helpers.hetero_batches``) and on
``ZeroCopyHeteroDataModule`` over ``SyntheticHeteroGraph``; the comparison with PyG's own hetero ``NeighborLoader``
needs pyg-lib or torch-sparse (as in ``tests/test_link_dropin.py``).
"""

from __future__ import annotations

import importlib.util
from functools import partial
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from helpers.dropin import fit_and_validate
from helpers.hetero_batches import batches, mag_like_graph, metadata
from torch import nn
from torch_geometric.nn import SAGEConv, to_hetero
from torchmetrics.classification import MulticlassAccuracy

from lightning_zerocopy import ZeroCopyHeteroDataModule
from lightning_zerocopy.datasets import SyntheticHeteroGraph

PYG_CANNOT_SAMPLE = not any(importlib.util.find_spec(m) for m in ("pyg_lib", "torch_sparse"))
FANOUTS, BATCH, STEPS, VAL_BATCHES = [5, 3], 32, 60, 4
#: SyntheticHeteroGraph's size for these tests (small: CPU seconds)
SMALL_GRAPH = {"num_papers": 3_000, "num_features": 16, "num_classes": 4, "seed": 0}


class GNN(nn.Module):
    """Two SAGE layers, homogeneous: ``to_hetero`` makes one copy per edge type."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, out_channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x, edge_index).relu()
        return self.conv2(x, edge_index)


class PyGExampleHeteroNet(pl.LightningModule):
    """ogbn-mag node classification as a PyG user writes it: ``to_hetero`` + embeddings for featureless types."""

    def __init__(self, metadata: tuple[list[str], list[tuple[str, str, str]]], num_nodes: dict[str, int],
                 in_channels: int, num_classes: int, hidden_channels: int = 32) -> None:  # fmt: skip
        super().__init__()
        node_types, _ = metadata
        self.embeds = nn.ModuleDict({t: nn.Embedding(num_nodes[t], in_channels) for t in node_types if t != "paper"})
        self.gnn = to_hetero(GNN(in_channels, hidden_channels, num_classes), metadata, aggr="sum")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.losses: list[float] = []

    def forward(self, x_dict: dict[str, torch.Tensor], edge_index_dict: dict[Any, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.gnn(x_dict, edge_index_dict)

    def _logits(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x_dict = {"paper": batch["paper"].x}
        for node_type, embed in self.embeds.items():
            x_dict[node_type] = embed(batch[node_type].n_id)
        size = batch["paper"].batch_size
        out = self(x_dict, batch.edge_index_dict)["paper"][:size]
        return out, batch["paper"].y[:size]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        out, y = self._logits(batch)
        loss = F.cross_entropy(out, y)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        out, y = self._logits(batch)
        self.val_acc(out, y)
        self.log("val_acc", self.val_acc, batch_size=y.numel())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


#: Validation accuracy before and after ``STEPS`` training steps.
_fit_and_validate = partial(fit_and_validate, metric="val_acc", steps=STEPS, val_batches=VAL_BATCHES)


def test_pyg_example_module_trains_unchanged_on_pyg_layout_batches() -> None:
    graph = mag_like_graph(papers=600, authors=300)
    perm = torch.randperm(600, generator=torch.Generator().manual_seed(0))
    train = batches(graph, perm[:480], BATCH, FANOUTS)
    val = batches(graph, perm[480:], BATCH, FANOUTS, seed=1000)
    torch.manual_seed(0)
    model = PyGExampleHeteroNet(metadata(graph), graph.num_nodes, graph.num_features["paper"], graph.num_classes)
    before, after = _fit_and_validate(model, train, val)
    first, last = sum(model.losses[:10]) / 10, sum(model.losses[-10:]) / 10
    assert last < 0.8 * first, (first, last)
    assert after > 0.6 and after > before + 0.2, (before, after)  # 4 classes: chance is 0.25


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return SyntheticHeteroGraph(**SMALL_GRAPH, cache_dir=str(tmp_path_factory.mktemp("hetero")))


def _ours(dataset: Any) -> Any:
    return ZeroCopyHeteroDataModule(dataset, num_neighbors=FANOUTS, batch_size=BATCH, seed=0)


def _example_for(dataset: Any) -> PyGExampleHeteroNet:
    (width,) = dataset.num_features.values()
    return PyGExampleHeteroNet(dataset.metadata(), dataset.num_nodes, width, dataset.num_classes)


def test_pyg_example_module_trains_unchanged_on_zero_copy_hetero_datamodule(dataset: Any) -> None:
    torch.manual_seed(0)
    model = _example_for(dataset)
    before, after = _fit_and_validate(model, datamodule=_ours(dataset))
    first, last = sum(model.losses[:10]) / 10, sum(model.losses[-10:]) / 10
    assert last < 0.9 * first, (first, last)
    assert after > before + 0.1, (before, after)


def test_hetero_node_classifier_takes_its_shape_from_zero_copy_hetero_datamodule(dataset: Any) -> None:
    from lightning_zerocopy.models import HeteroNodeClassifier

    torch.manual_seed(0)
    model = HeteroNodeClassifier(dataset.num_features, dataset.num_classes, hidden_channels=32,
                                 optimizer=lambda p: torch.optim.Adam(p, lr=0.01))  # fmt: skip
    before, after = _fit_and_validate(model, datamodule=_ours(dataset))
    assert model.input_type == dataset.input_type
    assert after > before + 0.1, (before, after)


@pytest.mark.skipif(PYG_CANNOT_SAMPLE, reason="PyG's hetero NeighborLoader cannot sample without pyg-lib or torch-sparse "
                    "(not installed here; the GPU box has them in .pyg/*.tgz)")  # fmt: skip
def test_same_module_same_accuracy_as_on_pyg_hetero_neighbor_loader(dataset: Any) -> None:
    from torch_geometric.data import HeteroData
    from torch_geometric.loader import NeighborLoader

    data = dataset.load()
    graph = HeteroData()
    for node_type, count in data.num_nodes.items():
        graph[node_type].num_nodes = count
        if node_type in data.x:
            graph[node_type].x = torch.as_tensor(data.x[node_type])
    for edge_type, index in data.edge_index.items():
        graph[edge_type].edge_index = index
    graph[data.input_type].y = data.y
    val_ids = data.split("val")[: VAL_BATCHES * BATCH]  # the seeds ours validates on (in order, no shuffle)
    pyg_train = NeighborLoader(graph, FANOUTS, input_nodes=(data.input_type, data.split("train")), batch_size=BATCH, shuffle=True)
    pyg_val = NeighborLoader(graph, FANOUTS, input_nodes=(data.input_type, val_ids), batch_size=BATCH)

    torch.manual_seed(0)
    _, theirs = _fit_and_validate(_example_for(dataset), pyg_train, pyg_val)
    torch.manual_seed(0)
    _, ours = _fit_and_validate(_example_for(dataset), datamodule=_ours(dataset))
    assert abs(ours - theirs) < 0.05, (ours, theirs)
