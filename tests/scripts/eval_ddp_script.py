"""CPU run (gloo DDP when more than one device) of the quickstart-size setup, used by test_eval_determinism.py.

``python eval_ddp_script.py OUT_DIR CACHE_DIR DEVICES EVAL_BATCH_SIZE``: ``predict`` with a fixed, seeded model
and the default ``eval_fanouts [10, 5]``; the PredictionWriter writes ``OUT_DIR/predictions.npz``.
"""

from __future__ import annotations

import sys

import pytorch_lightning as pl

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks.predictions import PredictionWriter
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GraphSAGE


def main(out_dir: str, cache_dir: str, devices: int, eval_batch_size: int) -> None:
    pl.seed_everything(0)
    dataset = SyntheticGraph(num_nodes=20000, avg_degree=10, num_features=32, num_classes=8, cache_dir=cache_dir)
    dm = ZeroCopyDataModule(dataset, fanouts=[10, 5], batch_size=256, eval_batch_size=eval_batch_size)
    model = GraphSAGE(dm.num_features, dm.num_classes, hidden_channels=64, num_layers=2)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        logger=False,
        default_root_dir=out_dir,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[PredictionWriter(output_dir=out_dir)],
    )
    trainer.predict(model, datamodule=dm, return_predictions=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
