"""Two-rank CPU DDP run (gloo) used by test_ddp_shared.py; run as ``python ddp_script.py OUT_DIR CACHE_DIR``.

Lightning's DDP launcher re-runs this script once per extra rank. Every rank writes ``rank<N>.json`` with
the training seeds it saw in epoch 0, the shared segments it mapped and its pid.
"""

from __future__ import annotations

import json
import os
import sys

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.datasets import SyntheticGraph


class TinySAGE(pl.LightningModule):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = SAGEConv(in_channels, out_channels)

    def training_step(self, data, batch_idx):
        out = self.conv(data.x, data.edge_index)[: data.batch_size]
        return F.cross_entropy(out, data.y[: data.batch_size])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Report(pl.Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.seeds: list[list[int]] = []
        self.mapped: list[str] = []

    def setup(self, trainer, pl_module, stage) -> None:
        handles = trainer.datamodule.handles
        paths = [handles.graph.indptr.path, handles.features.data.path, handles.labels.path]
        with open("/proc/self/maps", encoding="utf-8") as f:
            maps = f.read()
        self.mapped = [p for p in paths if p in maps]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == 0:
            self.seeds.append(batch.n_id[: batch.batch_size].tolist())

    def on_train_end(self, trainer, pl_module) -> None:
        report = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "pid": os.getpid(),
            "seeds": self.seeds,
            "mapped": self.mapped,
            "train_idx": trainer.datamodule.plan("train").input_nodes.tolist(),
        }
        with open(os.path.join(self.out_dir, f"rank{trainer.global_rank}.json"), "w", encoding="utf-8") as f:
            json.dump(report, f)


def main(out_dir: str, cache_dir: str) -> None:
    pl.seed_everything(0)
    dataset = SyntheticGraph(num_nodes=1000, avg_degree=6, num_features=8, num_classes=3, cache_dir=cache_dir)
    dm = ZeroCopyDataModule(dataset, fanouts=[4, 4], batch_size=64, drop_last=True, seed=1)
    model = TinySAGE(dm.num_features, dm.num_classes)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Report(out_dir)],
    )
    trainer.fit(model, datamodule=dm)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
