"""PipelineCallback with ZeroCopyHeteroLinkDataModule on the CPU: the producer builds the DataModule's own link batches
(supervision fields on the typed stores, through flattened slots), an epoch resumed on another world size included."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from helpers.hetero_link import small_graph
from pytorch_lightning.callbacks import Callback
from torch_geometric.data import HeteroData

from lightning_zerocopy import ZeroCopyHeteroLinkDataModule
from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
from lightning_zerocopy.models import HeteroLinkPredictor


def _fields(batch: HeteroData) -> dict:
    out = {}
    for store in (*batch.node_stores, *batch.edge_stores):
        for field, value in store.items():
            out[(store._key, field)] = value.clone() if isinstance(value, torch.Tensor) else value
    return out


class _Record(Callback):
    def __init__(self) -> None:
        self.train: dict[tuple[int, int], dict] = {}
        self.val: dict[int, dict] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.train[(trainer.current_epoch, batch_idx)] = _fields(batch)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self.val[batch_idx] = _fields(batch)


def _fit(tmp_path: Path, neg_sampling, *callbacks: Callback) -> _Record:
    pl.seed_everything(0)
    dm = ZeroCopyHeteroLinkDataModule(small_graph(str(tmp_path.parent / "graph")), num_neighbors=[3, 2], batch_size=64,
                                      eval_batch_size=24, neg_sampling=neg_sampling, num_threads=1)  # fmt: skip
    model = HeteroLinkPredictor(dm.metadata, dm.num_features, dm.num_nodes, dm.edge_type, hidden_channels=8)
    record = _Record()
    pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=4, logger=False,
               enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
               num_sanity_val_steps=0, default_root_dir=str(tmp_path),
               callbacks=[*callbacks, record]).fit(model, datamodule=dm)  # fmt: skip
    return record


@pytest.mark.parametrize("neg_sampling", ["binary", {"mode": "triplet", "amount": 2}])
def test_the_pipeline_yields_the_loaders_link_batches(tmp_path: Path, neg_sampling) -> None:
    """Every val batch (the last one smaller: edge_label_index varies along its second dimension in the slot)."""
    want = _fit(tmp_path / "plain", neg_sampling)
    telemetry = DataTelemetry(prog_bar=False)
    got = _fit(tmp_path / "pipeline", neg_sampling, PipelineCallback(mode="in_process"), telemetry)
    steps = telemetry.history  # per step: the producer's build time, the rows of each endpoint type
    assert steps and all(s["data/build_ms"] > 0 and s["data/rows_user"] > 0 and s["data/rows_item"] > 0 for s in steps)
    for mine, theirs in ((got.train, want.train), (got.val, want.val)):
        assert mine.keys() == theirs.keys() and len(theirs) > 0
        for key, fields in theirs.items():
            assert mine[key].keys() == fields.keys(), key
            for name, value in fields.items():
                other = mine[key][name]
                same = torch.equal(other, value) if isinstance(value, torch.Tensor) else other == value
                assert same, (key, name)


def test_the_pipeline_loader_deals_an_epoch_resumed_on_another_world_size_like_the_plan_loader(tmp_path: Path,
                                                                                              monkeypatch) -> None:  # fmt: skip
    """A 2-rank checkpoint resumed on 1 rank: the producer builds the remainder link batches the PlanLoader would
    (the resumed link plan is registered with it), and they train the edges the 2 ranks had left."""
    from lightning_zerocopy.data.handles import HeteroHostGraphHandles
    from lightning_zerocopy.pipeline import start_pipeline
    from lightning_zerocopy.pipeline.loader import PipelineLoader
    from lightning_zerocopy.pipeline.source import PlanSource

    dm = ZeroCopyHeteroLinkDataModule(small_graph(str(tmp_path / "graph")), num_neighbors=[3, 2], batch_size=64,
                                      num_threads=1)  # fmt: skip
    unlink = HeteroHostGraphHandles.unlink
    monkeypatch.setattr(HeteroHostGraphHandles, "unlink", lambda self: None)  # the producer opens them by name
    dm.setup("fit")
    handles = dm.handles
    client = start_pipeline("in_process", depth=2, timeout=30)
    try:
        client.register("train", PlanSource(dm.plan("train"), dm.builder("train")))
        state = dm.train_dataloader().state_dict()
        state.update(epoch=1, step=2, segments=[[2, 64, 2]])
        state["plan"] = dict(state["plan"], world_size=2)
        piped = PipelineLoader(client, "train", dm.train_dataloader())
        piped.load_state_dict(state)
        fresh = dm.train_dataloader()
        fresh.load_state_dict(state)
        start = fresh.start_step
        assert piped.start_step == start > 0
        later = []
        for a, b in zip(piped, fresh):
            assert torch.equal(a["user", "rates", "item"].edge_label_index, b["user", "rates", "item"].edge_label_index)
            assert torch.equal(a["user"].n_id, b["user"].n_id) and torch.equal(a["item"].x, b["item"].x)
            later += b["user", "rates", "item"].input_id.tolist()
        assert len(later) > 0
        two_ranks = [dm.plan("train", rank=r, world_size=2) for r in range(2)]
        done = {int(i) for p in two_ranks for step in range(2) for i in p.item(1, step).input_id}
        assert not done & set(later) and len(done) + len(later) == dm.link_splits["train"].num_positives
    finally:
        client.close()
        unlink(handles)
        dm.teardown("fit")
