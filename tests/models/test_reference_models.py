"""Reference GraphSAGE/GAT modules beyond what every node classifier shares (``test_seed_classifier.py``): the hop
warning, GAT's heads, bf16-mixed training, ``compile``."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from lightning_zerocopy.models import GAT, GraphSAGE


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


@pytest.fixture(scope="module")
def datamodule(tmp_path_factory: pytest.TempPathFactory):
    from lightning_zerocopy import SyntheticGraph, ZeroCopyDataModule

    cache = tmp_path_factory.mktemp("models") / "cache"
    dataset = SyntheticGraph(num_nodes=2000, avg_degree=8, num_features=12, num_classes=4, cache_dir=str(cache))
    return ZeroCopyDataModule(dataset, fanouts=[5, 4], batch_size=64, seed=1)


@pytest.mark.parametrize("cls", [GraphSAGE, GAT])
def test_bf16_mixed_fit_with_telemetry(datamodule, tmp_path, cls) -> None:
    """What the GPU recipes run (``precision: bf16-mixed``, DataTelemetry), on the CPU: the layers compute in
    bf16, loss and metrics stay finite."""
    import pytorch_lightning as pl
    from torch_geometric.nn.dense.linear import Linear

    from lightning_zerocopy.callbacks import DataTelemetry

    pl.seed_everything(0)
    model = cls(12, 4, hidden_channels=16)
    dtypes: set[torch.dtype] = set()
    for layer in model.net.modules():  # the linear maps of every conv layer
        if isinstance(layer, Linear):
            layer.register_forward_hook(lambda _m, _a, out: dtypes.add(out.dtype))
    telemetry = DataTelemetry()
    trainer = pl.Trainer(accelerator="cpu", precision="bf16-mixed", max_steps=6, val_check_interval=3, log_every_n_steps=1,
                         limit_val_batches=2, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[telemetry],
                         default_root_dir=str(tmp_path))  # fmt: skip
    trainer.fit(model, datamodule=datamodule)
    assert dtypes == {torch.bfloat16}
    metrics = trainer.callback_metrics
    assert torch.isfinite(metrics["train_loss"]) and 0 <= float(metrics["val_acc"]) <= 1
    assert telemetry.history and all(v == v for row in telemetry.history for v in row.values())  # no NaN


def test_compiled_graphsage_matches_eager_on_batches_of_every_size(datamodule) -> None:
    """``compile=True``: same logits and gradients as eager on batches of varying size, one graph for all of
    them (``dynamic=True``), and the checkpoint keys of the uncompiled model."""
    from torch._dynamo.utils import counters

    datamodule.setup("fit")
    try:
        batches = [b for _, b in zip(range(4), datamodule.train_dataloader())]
    finally:
        datamodule.teardown("fit")
    assert len({b.num_nodes for b in batches}) > 1
    torch.manual_seed(0)
    compiled = GraphSAGE(12, 4, hidden_channels=16, dropout=0.0, compile=True)
    eager = GraphSAGE(12, 4, hidden_channels=16, dropout=0.0)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    eager.load_state_dict(compiled.state_dict())
    counters.clear()
    for batch in batches:
        for model in (compiled, eager):
            model.zero_grad()
            model.training_step(batch, 0).backward()
        out, ref = compiled._seed_logits(batch)[0], eager._seed_logits(batch)[0]
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        for p, q in zip(compiled.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
    assert counters["stats"]["unique_graphs"] <= 2  # forward (and nothing per batch size)
