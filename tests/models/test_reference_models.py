"""Reference GraphSAGE/GAT modules: PyG-style steps on NeighborLoader-shaped batches, optimizer config."""

from __future__ import annotations

import warnings
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from torch_geometric.data import Data

from lightning_zerocopy.models import GAT, GraphSAGE


def _batch(num_nodes: int = 40, batch_size: int = 8, num_features: int = 6, num_classes: int = 3) -> Data:
    gen = torch.Generator().manual_seed(0)
    return Data(
        x=torch.randn(num_nodes, num_features, generator=gen),
        edge_index=torch.randint(0, num_nodes, (2, 120), generator=gen),
        y=torch.randint(0, num_classes, (num_nodes,), generator=gen),
        batch_size=batch_size,
    )


@pytest.mark.parametrize("cls", [GraphSAGE, GAT])
def test_training_step_learns_the_seed_labels(cls) -> None:
    torch.manual_seed(0)
    model = cls(in_channels=6, out_channels=3, hidden_channels=16, dropout=0.0, optimizer=partial(torch.optim.Adam, lr=0.02))
    assert model(_batch().x, _batch().edge_index).shape == (40, 3)
    optimizer = model.configure_optimizers()
    batch = _batch()
    first = float(model.training_step(batch, 0))
    for _ in range(30):
        optimizer.zero_grad()
        model.training_step(batch, 0).backward()
        optimizer.step()
    assert float(model.training_step(batch, 0)) < 0.5 * first


def test_unlabeled_seeds_are_ignored() -> None:
    batch = _batch()
    batch.y[:4] = -1
    loss = GraphSAGE(6, 3, hidden_channels=8).training_step(batch, 0)
    assert torch.isfinite(loss)


def test_optimizer_and_scheduler_factories() -> None:
    model = GraphSAGE(
        6,
        3,
        optimizer=partial(torch.optim.SGD, lr=0.5),
        lr_scheduler=partial(torch.optim.lr_scheduler.StepLR, step_size=2),
    )
    config = model.configure_optimizers()
    assert isinstance(config["optimizer"], torch.optim.SGD)
    assert config["optimizer"].param_groups[0]["lr"] == 0.5
    assert isinstance(config["lr_scheduler"]["scheduler"], torch.optim.lr_scheduler.StepLR)


def test_predict_step_returns_seed_predictions() -> None:
    batch = _batch()
    batch.n_id = torch.arange(100, 140)
    model = GAT(6, 3, hidden_channels=8, heads=2).eval()
    out = model.predict_step(batch, 0)
    assert torch.equal(out["n_id"], torch.arange(100, 108))
    assert torch.allclose(out["logits"], model(batch.x, batch.edge_index)[:8])


def _attach(model, fanouts, eval_fanouts=None) -> None:
    datamodule = SimpleNamespace(fanouts=fanouts, eval_fanouts=eval_fanouts if eval_fanouts is not None else fanouts)
    model._trainer = SimpleNamespace(datamodule=datamodule)


@pytest.mark.parametrize("cls", [GraphSAGE, GAT])
def test_more_layers_than_sampled_hops_warns_once(cls) -> None:
    model = cls(6, 3, hidden_channels=8, num_layers=3)
    _attach(model, [10, 5])
    with pytest.warns(UserWarning, match=r"num_layers=3 .*fanouts=\[10, 5\] samples 2 hops") as record:
        model.setup("fit")
        model.setup("validate")
    assert len([w for w in record if "num_layers" in str(w.message)]) == 1


def test_more_layers_than_evaluation_hops_warns() -> None:
    model = GraphSAGE(6, 3, hidden_channels=8, num_layers=2)
    _attach(model, [10, 5], eval_fanouts=[-1])
    with pytest.warns(UserWarning, match=r"eval_fanouts=\[-1\] samples 1 hops"):
        model.setup("test")


def test_as_many_layers_as_hops_does_not_warn() -> None:
    model = GraphSAGE(6, 3, hidden_channels=8, num_layers=2)
    _attach(model, [10, 5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.setup("fit")


def test_gat_heads_must_divide_hidden() -> None:
    with pytest.raises(ValueError, match="hidden_channels"):
        GAT(6, 3, hidden_channels=10, heads=4)
