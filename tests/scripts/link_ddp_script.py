"""CPU job (gloo DDP when more than one device) of a link DataModule on either graph kind, used by
``tests/data/test_link_ddp.py``. ``python link_ddp_script.py CONFIG_JSON``; Lightning's launcher re-runs it once per
extra rank.

The config: ``out`` (folder), ``kind`` (``"typed"``: ``ZeroCopyHeteroLinkDataModule`` over a 200-user, 100-item
synthetic graph cached in ``cache``, batches of 32, the package's typed link predictor; ``"untyped"``:
``ZeroCopyLinkDataModule`` over ``TinyLinkGraph``, batches of 64, the PyG-style link module), ``devices``,
``strategy`` (``"ddp"``, ``"zerocopy_ddp"``, or ``"auto"`` for one device), ``cache_budget`` and ``cache_ranking``
(``zerocopy_ddp``'s), ``stage`` (``"fit"``, ``"predict"`` or ``"fit_predict"``: predict after the fit),
``telemetry`` (add DataTelemetry), ``limit_val_batches``, ``max_epochs``, ``drop_last``, ``eval_batch_size``,
``ckpt`` (a checkpoint to resume from) and ``every_n_steps`` (save ``step=N.ckpt`` into ``out/ckpt``).

A fit: every rank writes ``rank<N>.json``: its pid, the paths of the shared segments it maps (read from
``/proc/self/maps`` at setup), ``[epoch, batch_idx, global_step, input_id, positive pairs]`` of every training batch
(``input_id``: positions in the train split; pairs: ``[src, dst]`` ids through each endpoint type's ``n_id``), the
steps per epoch, the train split's positive pairs, the rows of the strategy's cache decision (-1: none) and the
``data/`` figures logged. A predict: the PredictionWriter writes ``out/predictions.npz``.
"""

from __future__ import annotations

import json
import os
import sys

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers.kinds import Kind  # noqa: E402
from helpers.link import PyGLinkModule, TinyLinkGraph  # noqa: E402

from lightning_zerocopy import ZeroCopyHeteroLinkDataModule, ZeroCopyLinkDataModule  # noqa: E402
from lightning_zerocopy.callbacks import DataTelemetry  # noqa: E402
from lightning_zerocopy.callbacks.predictions import PredictionWriter  # noqa: E402
from lightning_zerocopy.datasets import SyntheticHeteroLinkGraph  # noqa: E402
from lightning_zerocopy.models import HeteroLinkPredictor  # noqa: E402
from lightning_zerocopy.strategies import ZeroCopyDDPStrategy  # noqa: E402


def segment_paths(handles) -> list[str]:
    """The shared segments of a link host copy: every edge type's CSC, every featured type's table and the link
    splits' tensors held in shared memory."""
    paths = []
    for _, graph in handles.graphs:
        paths += [graph.indptr.path, graph.indices.path]
    paths += [table.data.path for _, table in handles.tables]
    paths += sorted(h.path for h in handles.splits.values() if getattr(h, "path", None))
    return paths


class Report(pl.Callback):
    def __init__(self, out: str, kind: Kind) -> None:
        self.out, self.kind = out, kind
        self.batches: list = []
        self.mapped: list[str] = []
        self.paths: list[str] = []

    def setup(self, trainer, pl_module, stage) -> None:  # after the DataModule's setup: the handles still name them
        self.paths = segment_paths(trainer.datamodule.handles)
        with open("/proc/self/maps", encoding="utf-8") as f:
            maps = f.read()
        self.mapped = [p for p in self.paths if p in maps]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        edge_type = self.kind.supervised(trainer.datamodule)
        store = self.kind.label_store(batch, edge_type)
        pairs = self.kind.pairs(batch, edge_type)[:, : store.batch_size]
        self.batches.append([trainer.current_epoch, batch_idx, trainer.global_step, store.input_id.tolist(),
                             pairs.t().tolist()])  # fmt: skip

    def on_train_end(self, trainer, pl_module) -> None:
        train = trainer.datamodule.link_splits["train"].pos_edge_index
        decision = getattr(trainer.strategy, "cache_decision", None)
        report = {"rank": trainer.global_rank, "world_size": trainer.world_size, "pid": os.getpid(),
                  "paths": self.paths, "mapped": self.mapped, "batches": self.batches,
                  "steps_per_epoch": trainer.num_training_batches, "train_pairs": train.t().tolist(),
                  "cache_rows": sum(decision.rows_per_type.values()) if decision is not None else -1,
                  "logged": sorted(k for k in trainer.callback_metrics if k.startswith("data/"))}  # fmt: skip
        with open(os.path.join(self.out, f"rank{trainer.global_rank}.json"), "w", encoding="utf-8") as f:
            json.dump(report, f)


def _datamodule(config: dict, kind: Kind):
    options = dict(drop_last=config.get("drop_last", True), eval_batch_size=config.get("eval_batch_size", 16),
                   num_threads=1, seed=1)  # fmt: skip
    if not kind.typed:
        return ZeroCopyLinkDataModule(TinyLinkGraph(), num_neighbors=[4, 4], batch_size=64, **options)
    dataset = SyntheticHeteroLinkGraph(num_users=200, num_items=100, avg_ratings=5.0, num_features=8,
                                       neg_per_positive=4, cache_dir=config["cache"])  # fmt: skip
    return ZeroCopyHeteroLinkDataModule(dataset, num_neighbors=[4, 3], batch_size=32, **options)


def main(config: dict) -> None:
    pl.seed_everything(0)
    out, devices, kind = config["out"], config.get("devices", 2), Kind(config.get("kind", "typed") == "typed", "link")
    dm = _datamodule(config, kind)
    strategy = config.get("strategy", "ddp" if devices > 1 else "auto")
    if strategy == "zerocopy_ddp":
        ranking = {"cache_ranking": config["cache_ranking"]} if "cache_ranking" in config else {}
        strategy = ZeroCopyDDPStrategy(cache_budget=config.get("cache_budget", 0), process_group_backend="gloo",
                                       **ranking)  # fmt: skip
    stage = config.get("stage", "fit")
    callbacks: list = [] if stage == "predict" else [Report(out, kind)]
    callbacks += [PredictionWriter(output_dir=out)] if stage != "fit" else []
    callbacks += [DataTelemetry()] if config.get("telemetry") else []
    if config.get("every_n_steps"):
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(out, "ckpt"), every_n_train_steps=config["every_n_steps"],
                                         save_top_k=-1, filename="{step}"))  # fmt: skip
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=config.get("max_epochs", 1),
                         limit_val_batches=config.get("limit_val_batches", 0), logger=False, default_root_dir=out,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=bool(config.get("every_n_steps")), callbacks=callbacks)  # fmt: skip
    torch.manual_seed(0)
    if kind.typed:
        model = HeteroLinkPredictor(dm.metadata, dm.num_features, dm.num_nodes, dm.edge_type, hidden_channels=8)
    else:
        model = PyGLinkModule(dm.num_features, 16)
    if stage != "predict":
        trainer.fit(model, datamodule=dm, ckpt_path=config.get("ckpt"))
    if stage != "fit":
        trainer.predict(model.eval(), datamodule=dm, return_predictions=False)


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        main(json.load(f))
