"""What the node classifiers share (``models/seed_classifier.py``), each test run on the untyped ones (``GraphSAGE``,
``GAT`` on a ``NeighborLoader``-shaped ``Data`` batch) and the typed one (``HeteroNodeClassifier``, SAGE and R-GAT, on
a hand-built ``HeteroData`` batch in PyG's hetero ``NeighborLoader`` layout): the seeds' cross-entropy, unlabeled seeds,
the optimizer and scheduler factories, ``predict_step``'s seed ids and logits."""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Any

import pytest
import torch
from helpers.hetero_batches import mag_like_graph, metadata, sample_batch
from torch_geometric.data import Data

from lightning_zerocopy.models import GAT, GraphSAGE, HeteroNodeClassifier
from lightning_zerocopy.models.seed_classifier import SeedClassifier

KINDS = ["graphsage", "gat", "hetero_sage", "hetero_gat"]
SEEDS = 8


@lru_cache(maxsize=1)
def _graph() -> Any:
    return mag_like_graph(features=6, classes=3)


@lru_cache(maxsize=1)
def _hetero_batch() -> Any:
    return sample_batch(_graph(), torch.arange(SEEDS), [4, 3])


def _model(kind: str, **kwargs: Any) -> SeedClassifier:
    """The classifier of ``kind``: 6 features, 3 classes (the typed one on ``_graph()``'s shape)."""
    if kind in ("graphsage", "gat"):
        return (GraphSAGE if kind == "graphsage" else GAT)(6, 3, **kwargs)
    g = _graph()
    node_types, edge_types = metadata(g)
    return HeteroNodeClassifier(g.num_features, g.num_classes, conv=kind.split("_")[1], node_types=node_types,
                                edge_types=edge_types, num_nodes=g.num_nodes, input_type=g.input_type, **kwargs)  # fmt: skip


def _batch(kind: str) -> Any:
    """A batch of ``SEEDS`` seeds: 40 nodes and random edges (untyped), or a 2-hop sample of ``_graph()``."""
    if kind.startswith("hetero"):
        return _hetero_batch().clone()  # a copy: tests change its labels
    gen = torch.Generator().manual_seed(0)
    return Data(x=torch.randn(40, 6, generator=gen), edge_index=torch.randint(0, 40, (2, 120), generator=gen),
                y=torch.randint(0, 3, (40,), generator=gen), batch_size=SEEDS)  # fmt: skip


def _seeds(kind: str, batch: Any) -> Any:
    """Where the batch keeps the seeds' ``y`` and ``n_id``."""
    return batch["paper"] if kind.startswith("hetero") else batch


@pytest.mark.parametrize("kind", KINDS)
def test_training_step_learns_the_seed_labels(kind: str) -> None:
    torch.manual_seed(0)
    model = _model(kind, hidden_channels=16, dropout=0.0, optimizer=partial(torch.optim.Adam, lr=0.02))
    if kind in ("graphsage", "gat"):  # the net's own call: every node's logits
        assert model(_batch(kind).x, _batch(kind).edge_index).shape == (40, 3)
    optimizer = model.configure_optimizers()
    batch = _batch(kind)
    logits, y, size = model._seed_outputs(batch)
    assert logits.shape == (SEEDS, 3) and torch.equal(y, _seeds(kind, batch).y[:SEEDS]) and size == SEEDS
    first = float(model.training_step(batch, 0))
    for _ in range(30):
        optimizer.zero_grad()
        model.training_step(batch, 0).backward()
        optimizer.step()
    assert float(model.training_step(batch, 0)) < 0.5 * first


@pytest.mark.parametrize("kind", KINDS)
def test_unlabeled_seeds_are_ignored(kind: str) -> None:
    torch.manual_seed(0)
    batch = _batch(kind)
    y = _seeds(kind, batch).y
    y[:4] = -1
    model = _model(kind, hidden_channels=8).eval()  # no dropout: the same logits below
    loss = model.training_step(batch, 0)
    assert torch.isfinite(loss)
    logits = model._seed_outputs(batch)[0]
    labeled = torch.nn.functional.cross_entropy(logits[4:SEEDS], y[4:SEEDS])
    torch.testing.assert_close(loss, labeled)  # the mean over the labeled seeds only


@pytest.mark.parametrize("kind", KINDS)
def test_optimizer_and_scheduler_factories(kind: str) -> None:
    model = _model(kind, optimizer=partial(torch.optim.SGD, lr=0.5),
                   lr_scheduler=partial(torch.optim.lr_scheduler.StepLR, step_size=2))  # fmt: skip
    config = model.configure_optimizers()
    assert isinstance(config["optimizer"], torch.optim.SGD)
    assert config["optimizer"].param_groups[0]["lr"] == 0.5
    assert isinstance(config["lr_scheduler"]["scheduler"], torch.optim.lr_scheduler.StepLR)
    assert config["lr_scheduler"]["monitor"] == "val_acc"
    assert isinstance(_model(kind, optimizer=partial(torch.optim.SGD, lr=0.5)).configure_optimizers(), torch.optim.SGD)


@pytest.mark.parametrize("kind", KINDS)
def test_predict_step_returns_seed_predictions(kind: str) -> None:
    torch.manual_seed(0)
    batch = _batch(kind)
    seeds = _seeds(kind, batch)
    if kind in ("graphsage", "gat"):
        batch.n_id = torch.arange(100, 140)
    model = _model(kind, hidden_channels=8, **({"heads": 2} if kind.endswith("gat") else {})).eval()
    out = model.predict_step(batch, 0)
    assert torch.equal(out["n_id"], seeds.n_id[:SEEDS])
    if kind in ("graphsage", "gat"):
        assert torch.equal(out["n_id"], torch.arange(100, 108))
        assert torch.allclose(out["logits"], model(batch.x, batch.edge_index)[:SEEDS])
    else:  # the trimmed logits of the seeds are the untrimmed ones
        model.trim = False
        torch.testing.assert_close(out["logits"], model(batch)[:SEEDS])
