"""PipelineCallback with ZeroCopyHeteroLinkDataModule on the CPU: the producer builds the DataModule's own link batches
(supervision fields on the typed stores, through flattened slots)."""

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
