"""A two-rank CPU DDP fit (gloo) of GraphSAGE with DataTelemetry, used by test_telemetry.py.

``python telemetry_ddp_script.py OUT_DIR CACHE_DIR``; Lightning's launcher re-runs it for rank 1. Every rank writes
``rank<N>.json``: its own step figures of the epoch (DataTelemetry's history), its seed counts, the epoch figures
Lightning holds after the fit, and the warnings the fit raised.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from functools import partial

import pytorch_lightning as pl
import torch

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks import DataTelemetry
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GraphSAGE
from lightning_zerocopy.strategies import ZeroCopyDDPStrategy


class Seeds(pl.Callback):
    """Each step's correct and labeled seeds (lr 0: the weights never change, so this is what the model sees)."""

    def __init__(self) -> None:
        self.correct = self.labeled = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        with torch.no_grad():
            out, y = pl_module._seed_logits(batch)
        self.correct += int(((out.argmax(-1) == y) & (y != -1)).sum())
        self.labeled += int((y != -1).sum())


def main(out_dir: str, cache_dir: str) -> None:
    torch.manual_seed(0)
    dataset = SyntheticGraph(num_nodes=2000, num_features=16, num_classes=4, cache_dir=cache_dir)
    dm = ZeroCopyDataModule(dataset, fanouts=[5, 5], batch_size=64, seed=1)
    model = GraphSAGE(16, 4, hidden_channels=16, dropout=0.0, optimizer=partial(torch.optim.SGD, lr=0.0))
    telemetry, seeds = DataTelemetry(prog_bar=False), Seeds()
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=ZeroCopyDDPStrategy(), max_epochs=1, log_every_n_steps=3,
        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[telemetry, seeds],
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, datamodule=dm)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.endswith("_epoch")}
    report = {
        "history": telemetry.history,
        "correct": seeds.correct,
        "labeled": seeds.labeled,
        "epoch": metrics,
        "warnings": [str(w.message) for w in caught],
    }
    with open(os.path.join(out_dir, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
