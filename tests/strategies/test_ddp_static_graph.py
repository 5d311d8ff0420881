"""ZeroCopyDDPStrategy's DDP defaults (``static_graph="auto"``, ``gradient_as_bucket_view=True``): the rule that picks
``static_graph``, and the reference models trained through the Trainer under them against the same fit under torch's
defaults (one gloo rank: DDP's reducer runs as on many, the all-reduce is the identity), on batches with per-hop
trimming, fewer hops than layers, gradient accumulation (Lightning's ``no_sync``), heterogeneous batches with
featureless types and an unsampled relation, and link batches. A module whose used parameters change after the first step must fail with one line naming the setting."""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import GradientAccumulationScheduler
from helpers import BatchList
from helpers.hetero_batches import batches as hetero_batches
from helpers.hetero_batches import mag_like_graph, metadata
from helpers.hetero_link import small_graph
from helpers.link_batches import planted_graph, train_batches

from lightning_zerocopy import ZeroCopyDataModule, ZeroCopyHeteroLinkDataModule
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GAT, GraphSAGE, HeteroLinkPredictor, HeteroNodeClassifier, LinkPredictor
from lightning_zerocopy.strategies import ZeroCopyDDPStrategy
from lightning_zerocopy.strategies.ddp_options import accumulates_gradients, choose_static_graph

STEPS = 6


def test_auto_turns_static_graph_on_only_where_every_step_uses_every_parameter() -> None:
    assert choose_static_graph("auto", find_unused_parameters=False, automatic_optimization=True).on
    assert not choose_static_graph("auto", find_unused_parameters=True, automatic_optimization=True).on
    assert not choose_static_graph("auto", find_unused_parameters=False, automatic_optimization=False).on
    assert not choose_static_graph("auto", find_unused_parameters=False, automatic_optimization=True, accumulates=True).on
    assert accumulates_gradients(SimpleNamespace(accumulate_grad_batches=2, callbacks=[]))
    assert accumulates_gradients(SimpleNamespace(accumulate_grad_batches=1,
                                                 callbacks=[GradientAccumulationScheduler({0: 1, 2: 4})]))  # fmt: skip
    assert not accumulates_gradients(SimpleNamespace(accumulate_grad_batches=1, callbacks=[])) and not accumulates_gradients(None)
    assert choose_static_graph(True, find_unused_parameters=True, automatic_optimization=False).on  # as given
    assert not choose_static_graph(False, find_unused_parameters=False, automatic_optimization=True).on
    with pytest.raises(ValueError, match="static_graph must be true, false or 'auto'"):
        ZeroCopyDDPStrategy(static_graph="yes")  # type: ignore[arg-type]


# ---- the reference models' batches ---------------------------------------------------------------------------------
def _node_batches(tmp_path: Path) -> list[Any]:
    """Batches of our DataModule (per-hop counts, so the models trim), two of them sampled with one hop for the
    two-layer models (the counts are padded: an empty last hop)."""
    out: list[Any] = []
    for fanouts, count in (([4, 3], STEPS - 2), ([5], 2)):
        dm = ZeroCopyDataModule(SyntheticGraph(num_nodes=600, avg_degree=6, num_features=8, num_classes=3,
                                               cache_dir=str(tmp_path / "graph")),
                                fanouts=fanouts, batch_size=32, num_threads=1, seed=len(fanouts))  # fmt: skip
        dm.setup("fit")
        try:
            for batch, _ in zip(dm.train_dataloader(), range(count)):
                out.append(batch.clone())
        finally:
            dm.teardown("fit")
    return [out[0], out[-1], *out[1:-1]]  # a one-hop batch second: the used set must not change with it


def _hetero_node_case(tmp_path: Path) -> tuple[Callable[[], pl.LightningModule], list[Any]]:
    graph = mag_like_graph()
    node_types, edge_types = metadata(graph)
    unsampled = {e: ([3, 2] if e[1] != "rev_has_topic" else [0, 0]) for e in graph.edge_types}  # a relation left out
    data = list(hetero_batches(graph, torch.arange(60), 20, [4, 3])) + list(hetero_batches(graph, torch.arange(60, 120),
                                                                                         20, unsampled))  # fmt: skip

    def model() -> pl.LightningModule:
        return HeteroNodeClassifier(graph.num_features, graph.num_classes, node_types=node_types, edge_types=edge_types,
                                    num_nodes=graph.num_nodes, input_type=graph.input_type, hidden_channels=8)  # fmt: skip

    assert any(t not in graph.num_features for t in node_types)  # featureless types, embedded from n_id
    return model, data[:STEPS]


def _hetero_link_case(tmp_path: Path) -> tuple[Callable[[], pl.LightningModule], list[Any]]:
    dm = ZeroCopyHeteroLinkDataModule(small_graph(str(tmp_path / "links")), num_neighbors=[3, 2], batch_size=32,
                                      neg_sampling="binary", num_threads=1)  # fmt: skip
    dm.setup("fit")
    try:
        data = [b.clone() for b, _ in zip(dm.train_dataloader(), range(STEPS))]
        shape = (dm.metadata, dm.num_features, dm.num_nodes, dm.edge_type)
    finally:
        dm.teardown("fit")
    return (lambda: HeteroLinkPredictor(*shape, hidden_channels=8)), data


def _case(name: str, tmp_path: Path) -> tuple[Callable[[], pl.LightningModule], list[Any]]:
    adam = partial(torch.optim.Adam, lr=0.01)
    if name in ("sage", "gat"):
        cls = GraphSAGE if name == "sage" else GAT
        return (lambda: cls(8, 3, hidden_channels=16, num_layers=2, optimizer=adam)), _node_batches(tmp_path)
    if name == "hetero":
        return _hetero_node_case(tmp_path)
    if name in ("link", "link_triplet"):
        mode = "binary" if name == "link" else "triplet"
        loss = "bce" if name == "link" else "bpr"
        data = train_batches(planted_graph(), STEPS, 32, mode)
        return (lambda: LinkPredictor(8, hidden_channels=16, num_layers=2, loss=loss, optimizer=adam)), data
    return _hetero_link_case(tmp_path)


class _WrapperSettings(pl.Callback):
    """The DDP wrapper's settings while it trains (Lightning unwraps the module at the end)."""

    def __init__(self) -> None:
        self.settings: dict[str, bool] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        wrapper = trainer.strategy.model
        self.settings = {"static_graph": wrapper.static_graph, "gradient_as_bucket_view": wrapper.gradient_as_bucket_view}


def _fit(model: pl.LightningModule, data: list[Any], tmp_path: Path, accumulate: int = 1,
         **strategy: Any) -> dict[str, bool]:  # fmt: skip
    chosen = ZeroCopyDDPStrategy(liveness_interval=0, **strategy)
    wrapper = _WrapperSettings()
    pl.seed_everything(0)
    steps = STEPS // accumulate  # optimizer steps (Lightning skips DDP's all-reduce in the others: no_sync)
    trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=chosen, max_steps=steps, logger=False,
                         accumulate_grad_batches=accumulate,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0, log_every_n_steps=2,
                         default_root_dir=str(tmp_path), callbacks=[wrapper])  # fmt: skip
    trainer.fit(model, BatchList(data))
    assert trainer.global_step == steps
    return wrapper.settings


@pytest.mark.parametrize("name", ["sage", "sage_accumulate", "gat", "hetero", "link", "link_triplet", "hetero_link"])
def test_reference_models_train_the_same_under_the_new_ddp_defaults(one_rank_group: None, tmp_path: Path,
                                                                    name: str) -> None:  # fmt: skip
    accumulate = 2 if name.endswith("_accumulate") else 1
    make, data = _case(name.replace("_accumulate", ""), tmp_path)
    torch.manual_seed(0)
    new = make()
    if hasattr(new, "configure_model"):  # a module that builds its layers there: built once, copied with them
        new.configure_model()
    old = copy.deepcopy(new)
    first = {k: v.clone() for k, v in new.state_dict().items()}
    static = accumulate == 1  # auto leaves it off when the trainer accumulates (torch's reducer asserts under no_sync)
    assert _fit(new, data, tmp_path / "new", accumulate) == {"static_graph": static, "gradient_as_bucket_view": True}
    torch_defaults = _fit(old, data, tmp_path / "old", accumulate, static_graph=False, gradient_as_bucket_view=False)
    assert torch_defaults == {"static_graph": False, "gradient_as_bucket_view": False}
    changed = [k for k, v in new.state_dict().items() if not torch.equal(v, first[k])]
    assert changed, "nothing trained"
    for key, value in old.state_dict().items():
        torch.testing.assert_close(new.state_dict()[key], value, msg=lambda m, k=key: f"{k}: {m}")


class _LateLayer(pl.LightningModule):
    """Its second layer joins the loss from the second step on: a used set that changes after the first step."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        out = self.a(batch)
        return (self.b(out) if self.global_step >= 1 else out).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_used_set_that_changes_fails_in_one_line_naming_the_setting(one_rank_group: None, tmp_path: Path) -> None:
    data = [torch.randn(8, 4) for _ in range(STEPS)]
    with pytest.raises(RuntimeError) as raised:
        _fit(_LateLayer(), data, tmp_path)
    message = str(raised.value)
    assert "\n" not in message and "trainer.strategy.init_args.static_graph=false" in message, message
    assert "find_unused_parameters=true" in message, message
    # the same module trains with the setting the message names
    _fit(_LateLayer(), data, tmp_path / "off", find_unused_parameters=True)
