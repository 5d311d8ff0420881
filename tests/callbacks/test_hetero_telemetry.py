"""DataTelemetry over heterogeneous batches: edges and feature bytes summed over every type, sampled nodes per type."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback

from helpers.hetero import EDGE_TYPES, TinyHeteroDataset, TinyHeteroSAGE
from lightning_zerocopy import ZeroCopyHeteroDataModule
from lightning_zerocopy.callbacks import DataTelemetry


class _Sizes(Callback):
    """Each training batch's sizes, as the test computes them from the batch itself."""

    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        sizes = {f"rows_{t}": float(batch[t].n_id.numel()) for t in batch.node_types}
        sizes["edges"] = float(sum(batch[et].edge_index.size(1) for et in EDGE_TYPES))
        sizes["x_bytes"] = float(sum(batch[t].x.numel() * 4 for t in ("paper", "institution")))
        self.seen.append(sizes)


def test_a_short_fit_counts_every_type(tmp_path) -> None:
    dm = ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[3, 2], batch_size=4, num_threads=1)
    torch.manual_seed(0)
    model = TinyHeteroSAGE(dm.metadata, dm.num_features, dm.num_nodes, dm.num_classes)
    telemetry, sizes = DataTelemetry(prog_bar=True), _Sizes()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_val_batches=0, log_every_n_steps=2,
                         logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path), callbacks=[telemetry, sizes])  # fmt: skip
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 5  # 20 training papers, 4 a batch
    history = telemetry.history
    assert len(history) == 4  # the first step has no interval before it
    for figures, batch in zip(history, sizes.seen[1:]):  # a step's figures are those of the batch it starts
        for node_type in ("paper", "author", "institution"):
            assert figures[f"data/rows_{node_type}"] == batch[f"rows_{node_type}"]
        seconds = figures["data/step_ms"] / 1e3
        assert figures["data/seps"] * seconds == pytest.approx(batch["edges"], rel=1e-9) and batch["edges"] > 0
        assert figures["data/gather_GBps"] * seconds * 1e9 == pytest.approx(batch["x_bytes"], rel=1e-9)
    epoch_rows = trainer.callback_metrics["data/rows_author_epoch"]
    assert float(epoch_rows) == pytest.approx(sum(b["rows_author"] for b in sizes.seen[1:]) / 4)
