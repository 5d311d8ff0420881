"""A trainer process for the Ctrl-C test: fits with PipelineCallback(mode='worker') and, at the first training
batch, prints ``READY <worker pid>`` and slows down so the test can interrupt it mid-epoch."""

from __future__ import annotations

import sys
import time

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks import PipelineCallback
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GraphSAGE


class AnnounceAndDawdle(Callback):
    def __init__(self, pipeline: PipelineCallback) -> None:
        self.pipeline = pipeline

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == 0 and trainer.current_epoch == 0:
            print("READY", self.pipeline.client.transport.pid, flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    cache = sys.argv[1]
    dm = ZeroCopyDataModule(
        SyntheticGraph(num_nodes=1500, avg_degree=8, num_features=16, num_classes=4, cache_dir=cache),
        fanouts=[5, 5],
        batch_size=32,
    )
    pipeline = PipelineCallback(mode="worker")
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1000,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        callbacks=[pipeline, AnnounceAndDawdle(pipeline)],
    )
    trainer.fit(GraphSAGE(dm.num_features, dm.num_classes, hidden_channels=16), datamodule=dm)
