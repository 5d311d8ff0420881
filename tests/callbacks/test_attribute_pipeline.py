"""The pipeline's slots carry the user's attributes: with a PipelineCallback (a worker process, or in process) every
training and validation batch of the node, link and heterogeneous DataModules holds the attributes the plain loader
gives, bitwise (CPU slots in shared memory), which are PyG's rows of the source graph."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from helpers.attributes import WeightedGCN, attributed_data, attributed_datamodule, attributes_of_batch, pyg_reference
from pytorch_lightning.callbacks import Callback

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks import PipelineCallback
from lightning_zerocopy.datasets import PyGNodeDataset


class _Record(Callback):
    """Every batch's attributes (``x``/``y`` too), cloned, by (stage, epoch, batch index)."""

    def __init__(self) -> None:
        self.batches: dict[tuple, Any] = {}

    def _keep(self, key: tuple, batch: Any) -> None:
        self.batches[key] = (batch.clone(), {k: v.clone() for k, v in attributes_of_batch(batch).items()})

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._keep(("train", trainer.current_epoch, batch_idx), batch)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self._keep(("val", trainer.current_epoch, batch_idx), batch)


class _Probe(pl.LightningModule):
    """Reads every attribute of a batch in its steps (a missing one fails the run); learns nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def training_step(self, batch, batch_idx):  # noqa: ANN001
        total = sum(value.float().sum() for value in attributes_of_batch(batch).values())
        return self.w * total * 0 + (self.w**2).sum()

    def validation_step(self, batch, batch_idx):  # noqa: ANN001
        assert attributes_of_batch(batch)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path: Path, kind: str, *callbacks: Callback) -> tuple[_Record, Any]:
    pl.seed_everything(0)
    if kind == "node":  # a PyG module that reads batch.edge_weight and batch.train_mask
        data = attributed_data(num_nodes=120, num_edges=900)
        dm: Any = ZeroCopyDataModule(PyGNodeDataset(data), fanouts=[4, 3], batch_size=16, num_threads=1)
        model: pl.LightningModule = WeightedGCN(6, 3, hidden_channels=8)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the graph-level `name`
            dm, data = attributed_datamodule(kind)
        model = _Probe()
    record = _Record()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=3, limit_val_batches=2,
                   logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                   num_sanity_val_steps=0, default_root_dir=str(tmp_path),
                   callbacks=[*callbacks, record]).fit(model, datamodule=dm)  # fmt: skip
    return record, data


@pytest.mark.parametrize("kind", ["node", "link", "hetero", "hetero_link"])
@pytest.mark.parametrize("mode", ["worker", "in_process"])
def test_the_pipeline_yields_the_attributes_of_the_loaders_batches(tmp_path: Path, kind: str, mode: str) -> None:
    want, data = _fit(tmp_path / "plain", kind)
    got, _ = _fit(tmp_path / "pipeline", kind, PipelineCallback(mode=mode))
    assert got.batches.keys() == want.batches.keys() and len(want.batches) == 5
    for key, (batch, theirs) in want.batches.items():
        mine = got.batches[key][1]
        assert mine.keys() == theirs.keys(), key
        for name, value in theirs.items():
            assert mine[name].dtype == value.dtype and torch.equal(mine[name], value), (key, name)
        reference = pyg_reference(data, batch)
        assert all(torch.equal(mine[name], value) for name, value in reference.items()), key
