"""A two-rank CPU DDP job (gloo) of the link data path with ZeroCopyDDPStrategy, used by test_link_ddp.py.

``python link_ddp_script.py OUT_DIR``; Lightning's launcher re-runs it for rank 1. Every rank writes ``rank<N>.json``:
the positive edge ids (``input_id``) of its epoch-0 training batches, the shared segments it maps, its cache decision;
then ``predict`` writes the scored test edges with PredictionWriter (the ranks' shares merged by rank 0).
"""

from __future__ import annotations

import json
import os
import sys

import pytorch_lightning as pl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers.link import PyGLinkModule, TinyLinkGraph  # noqa: E402

from lightning_zerocopy import ZeroCopyLinkDataModule  # noqa: E402
from lightning_zerocopy.callbacks import DataTelemetry  # noqa: E402
from lightning_zerocopy.callbacks.predictions import PredictionWriter  # noqa: E402
from lightning_zerocopy.strategies import ZeroCopyDDPStrategy  # noqa: E402


class Report(pl.Callback):
    def __init__(self, out: str) -> None:
        self.out = out
        self.input_ids: list[list[int]] = []
        self.paths: list[str] = []

    def setup(self, trainer, pl_module, stage) -> None:
        handles = trainer.datamodule.handles
        self.paths = [handles.graph.indptr.path, handles.features.data.path]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == 0:
            self.input_ids.append(batch.input_id.tolist())

    def on_train_end(self, trainer, pl_module) -> None:
        decision = trainer.strategy.cache_decision
        report = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "pid": os.getpid(),
            "input_ids": self.input_ids,
            "paths": self.paths,
            "num_train_edges": trainer.datamodule.link_splits["train"].num_positives,
            "cache_rows": sum(decision.rows_per_type.values()) if decision is not None else -1,
            "logged": sorted(k for k in trainer.callback_metrics if k.startswith("data/")),
        }
        with open(os.path.join(self.out, f"rank{trainer.global_rank}.json"), "w", encoding="utf-8") as f:
            json.dump(report, f)


def main(out: str) -> None:
    pl.seed_everything(0)
    dm = ZeroCopyLinkDataModule(TinyLinkGraph(), num_neighbors=[4, 4], batch_size=64, drop_last=True, seed=1)
    strategy = ZeroCopyDDPStrategy(cache_budget="2KiB", cache_ranking="degree", process_group_backend="gloo")
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, limit_val_batches=2, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Report(out), DataTelemetry(), PredictionWriter(output_dir=out)], default_root_dir=out,
    )  # fmt: skip
    model = PyGLinkModule(dm.num_features, 16)
    trainer.fit(model, datamodule=dm)
    trainer.predict(model, datamodule=dm, return_predictions=False)


if __name__ == "__main__":
    main(sys.argv[1])
