"""The plan loaders under Lightning's prediction loop: a ``BasePredictionWriter`` gets each batch's indices (the
seeds' positions in the split, PyG's ``input_id``) with or without the pipeline, and no "Couldn't infer the batch
indices" warning (issue 22)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
from pytorch_lightning.callbacks import BasePredictionWriter

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks import PipelineCallback
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GraphSAGE


class _Indices(BasePredictionWriter):
    def __init__(self) -> None:
        super().__init__(write_interval="batch_and_epoch")
        self.per_batch: list[tuple[list[int], list[int]]] = []
        self.per_epoch: list = []

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.per_batch.append((list(batch_indices), batch.input_id.tolist()))

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        self.per_epoch = [list(b) for b in batch_indices[0]]


@pytest.mark.parametrize("pipeline", [None, "in_process", "worker"])
def test_a_prediction_writer_gets_each_batchs_seed_positions_without_a_warning(tmp_path: Path, pipeline) -> None:
    dataset = SyntheticGraph(num_nodes=900, avg_degree=6, num_features=8, num_classes=3, cache_dir=str(tmp_path))
    dm = ZeroCopyDataModule(dataset, fanouts=[4, 4], batch_size=64, seed=2)
    writer = _Indices()
    callbacks = [writer] + ([PipelineCallback(mode=pipeline)] if pipeline else [])
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_predict_batches=3, callbacks=callbacks)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.predict(GraphSAGE(dm.num_features, dm.num_classes, hidden_channels=8), datamodule=dm)
    inferred = [str(w.message) for w in caught if "batch indices" in str(w.message)]
    assert not inferred, inferred
    assert len(writer.per_batch) == 3
    for indices, input_id in writer.per_batch:
        assert indices == input_id and len(indices) > 0
    assert writer.per_epoch == [indices for indices, _ in writer.per_batch]
    positions = [i for indices, _ in writer.per_batch for i in indices]
    assert len(set(positions)) == len(positions)
