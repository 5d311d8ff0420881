"""CPU fit (gloo DDP when more than one device) that records the seeds every rank trains; used by
test_resume_ddp.py. ``python resume_ddp_script.py OUT_DIR CACHE_DIR DEVICES MAX_EPOCHS [CKPT]``.

Saves a checkpoint every 3 steps in OUT_DIR/ckpt (``step=N.ckpt``); each rank writes ``rank<R>.json``: its
``[epoch, batch_idx, global_step, seeds]`` per training batch and the run's steps per epoch.
"""

from __future__ import annotations

import json
import os
import sys

import pytorch_lightning as pl
from tiny_sage import TinySAGE  # this script's folder
from pytorch_lightning.callbacks import ModelCheckpoint

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.datasets import SyntheticGraph


class RecordSeeds(pl.Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.batches: list = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        seeds = batch.n_id[: batch.batch_size].tolist()
        self.batches.append([trainer.current_epoch, batch_idx, trainer.global_step, seeds])

    def on_train_end(self, trainer, pl_module) -> None:
        report = {"batches": self.batches, "steps_per_epoch": trainer.num_training_batches,
                  "train_idx": trainer.datamodule.plan("train").input_nodes.tolist()}  # fmt: skip
        with open(os.path.join(self.out_dir, f"rank{trainer.global_rank}.json"), "w", encoding="utf-8") as f:
            json.dump(report, f)


def main(out_dir: str, cache_dir: str, devices: int, max_epochs: int, ckpt: str | None) -> None:
    pl.seed_everything(0)
    dataset = SyntheticGraph(num_nodes=1500, avg_degree=6, num_features=8, num_classes=3, cache_dir=cache_dir)
    dm = ZeroCopyDataModule(dataset, fanouts=[4, 4], batch_size=64, seed=1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=max_epochs,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RecordSeeds(out_dir),
                   ModelCheckpoint(dirpath=os.path.join(out_dir, "ckpt"), every_n_train_steps=3, save_top_k=-1,
                                   filename="{step}")],  # fmt: skip
    )
    trainer.fit(TinySAGE(dataset.num_features, dataset.num_classes), datamodule=dm, ckpt_path=ckpt)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else None)
