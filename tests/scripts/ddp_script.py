"""DDP job of a node DataModule: CPU ranks on gloo for ``tests/data/test_ddp.py``, or (``"accelerator": "gpu"``, typed
only) GPU ranks on NCCL with the GPU sampler and the zero-copy gather. ``python ddp_script.py CONFIG_JSON``; Lightning's
launcher re-runs it once per extra rank.

The config: ``out`` (folder), ``kind`` (``"typed"``: ``ZeroCopyHeteroDataModule`` over a synthetic MAG-shaped graph,
batches of 16, ``HeteroNodeClassifier``; ``"untyped"``: ``ZeroCopyDataModule`` over a 1,000-node ``SyntheticGraph``,
batches of 64, ``GraphSAGE``), ``cache`` (the dataset's cache), ``devices``, ``strategy`` (``"ddp"``,
``"zerocopy_ddp"``, or ``"auto"`` for one device), ``cache_budget`` and ``cache_ranking`` (``zerocopy_ddp``'s),
``stage`` (``"fit"`` or ``"predict"``), ``max_epochs``, ``eval_batch_size``, ``ckpt`` (a checkpoint to resume from) and
``every_n_steps`` (save ``step=N.ckpt`` into ``out/ckpt``).

``fit``: every rank writes ``rank<N>.json``: its pid, the paths of the shared segments it maps (read from
``/proc/self/maps`` at setup), ``[epoch, batch_idx, global_step, seeds]`` of every training batch, the steps per
epoch, the input type's training split and, under a ``cache_budget``, the decided cache (its plans' digest and rows
per type; CPU ranks decide it and place nothing). ``predict``: the PredictionWriter writes ``out/predictions.npz``.

GPU ranks (``accelerator: gpu``; also ``num_papers``, ``cache_policy``, ``pipeline``: batches built by a
PipelineCallback worker process, no MPS): every training batch is compared with the batch an uncached CPU builder
(CPU sampler, CPU gather, no cache) makes from the same plan item, every node and edge store bitwise (a difference
fails the rank, and the job); the report adds the batches compared, the cache's group and shard, per featured type
and shard the GPU the shard's memory is on (``shard_gpus``) and whether it is this rank's GPU (``shard_local``), and
the rows served from the local shard, the peer's and host memory (per type in the trainer's own caches; in total
through ``DataTelemetry``, which counts a pipeline worker's too).
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

from lightning_zerocopy import ZeroCopyDataModule, ZeroCopyHeteroDataModule  # noqa: E402
from lightning_zerocopy.callbacks.predictions import PredictionWriter  # noqa: E402
from lightning_zerocopy.datasets import SyntheticGraph, SyntheticHeteroGraph  # noqa: E402
from lightning_zerocopy.models import GraphSAGE, HeteroNodeClassifier  # noqa: E402
from lightning_zerocopy.strategies import ZeroCopyDDPStrategy  # noqa: E402


def segment_paths(handles) -> list[str]:
    """The shared segments of a host copy: every edge type's CSC, every featured type's table, the
    labels and the splits."""
    paths = []
    for _, graph in handles.graphs:
        paths += [graph.indptr.path, graph.indices.path]
    paths += [table.data.path for _, table in handles.tables]
    paths += [handles.labels.path, *(split.path for split in handles.splits.values())]
    return paths


class Report(pl.Callback):
    def __init__(self, out: str, kind: Kind) -> None:
        self.out, self.kind = out, kind
        self.batches: list = []
        self.mapped: list[str] = []
        self.paths: list[str] = []
        self.compared = 0

    def setup(self, trainer, pl_module, stage) -> None:  # after the DataModule's setup: the handles still name them
        self.paths = segment_paths(trainer.datamodule.handles)
        with open("/proc/self/maps", encoding="utf-8") as f:
            maps = f.read()
        self.mapped = [p for p in self.paths if p in maps]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        store = self.kind.seeds(batch)
        seeds = store.n_id[: store.batch_size].tolist()
        self.batches.append([trainer.current_epoch, batch_idx, trainer.global_step, seeds])
        if trainer.strategy.root_device.type == "cuda":
            assert_same_as_uncached_cpu_batch(trainer.datamodule, batch, trainer.current_epoch, batch_idx)
            self.compared += 1

    def on_train_end(self, trainer, pl_module) -> None:
        report = {"rank": trainer.global_rank, "world_size": trainer.world_size, "pid": os.getpid(),
                  "paths": self.paths, "mapped": self.mapped, "batches": self.batches,
                  "steps_per_epoch": trainer.num_training_batches,
                  "train_idx": trainer.datamodule.plan("train").input_nodes.tolist()}  # fmt: skip
        decision = getattr(trainer.strategy, "cache_decision", None)
        if decision is not None:
            report["cache"] = {"digest": decision.digest, "rows": decision.rows_per_type,
                               "bytes_per_gpu": decision.bytes_per_gpu}  # fmt: skip
        if trainer.strategy.root_device.type == "cuda":
            report.update(gpu_report(trainer, decision), compared=self.compared)
        with open(os.path.join(self.out, f"rank{trainer.global_rank}.json"), "w", encoding="utf-8") as f:
            json.dump(report, f)


def assert_same_as_uncached_cpu_batch(dm, batch, epoch: int, step: int) -> None:
    """``batch`` (built on the GPU through the cache) against the batch of the same plan item from an uncached CPU
    builder: every tensor of every node and edge store bitwise, on the GPU."""
    builder = dm.builder("train")
    builder.sampler_placement = builder.gpu_sampler_placement = "cpu"
    builder.gather, builder.cache = "cpu", None
    try:
        cpu = builder.open(dm.resources).build_batch(dm.plan("train").item(epoch, step))
    finally:
        builder.close()
    for store, other in [*((cpu[t], batch[t]) for t in cpu.node_types), *((cpu[e], batch[e]) for e in cpu.edge_types)]:
        for key, value in store.items():
            theirs = other[key]
            if isinstance(value, torch.Tensor):
                assert theirs.is_cuda and torch.equal(theirs.cpu(), value), (store._key, key, epoch, step)
            else:
                assert theirs == value, (store._key, key, epoch, step)


def gpu_report(trainer, decision) -> dict:
    """The typed cache on a GPU rank: its group and shard, where each shard of each type lives, and the rows served."""
    from lightning_zerocopy.callbacks import DataTelemetry

    spec = trainer.datamodule.builder("train").cache  # the TypedFeatureCache every builder carries
    shards = {t: [h.device_index for h in s.handles] for t, s in spec.specs}
    local = {t: [h.lives_on(trainer.strategy.root_device) for h in s.handles] for t, s in spec.specs}
    per_type = trainer.strategy.cache_counts_per_type() or {}
    telemetry = next(cb for cb in trainer.callbacks if isinstance(cb, DataTelemetry))
    totals = telemetry.cache_history[-1] if telemetry.cache_history else {}
    return {"policy": decision.layout.policy, "group": list(decision.group), "shard_index": decision.shard_index,
            "device": trainer.strategy.root_device.index, "shard_gpus": shards, "shard_local": local,
            "rows_per_type": {t: None if c is None else c._asdict() for t, c in per_type.items()},
            "rows_total": {k.split("/", 1)[1]: v for k, v in totals.items() if k.startswith("cache/")}}  # fmt: skip


def main(config: dict) -> None:
    pl.seed_everything(0)
    out, devices = config["out"], config.get("devices", 2)
    gpu, kind = config.get("accelerator") == "gpu", Kind(config.get("kind", "typed") == "typed")
    placement = {"sampler_placement": "gpu", "gather": "zerocopy"} if gpu else {}
    options = dict(drop_last=config.get("drop_last", True), eval_batch_size=config.get("eval_batch_size", 32),
                   num_threads=1, seed=1, **placement)  # fmt: skip
    if kind.typed:
        dataset = SyntheticHeteroGraph(num_papers=config.get("num_papers", 300), num_features=8, num_classes=4,
                                       featured_types=("paper", "institution"), cache_dir=config["cache"])  # fmt: skip
        dm = ZeroCopyHeteroDataModule(dataset, num_neighbors=[4, 3], batch_size=16, **options)
    else:
        dataset = SyntheticGraph(num_nodes=1000, avg_degree=6, num_features=8, num_classes=3, cache_dir=config["cache"])
        dm = ZeroCopyDataModule(dataset, fanouts=[4, 4], batch_size=64, **options)
    strategy = config.get("strategy", "ddp" if devices > 1 else "auto")
    if strategy == "zerocopy_ddp":
        strategy = ZeroCopyDDPStrategy(cache_budget=config.get("cache_budget", 0),
                                       cache_ranking=config.get("cache_ranking", "degree"), presample_batches=8,
                                       cache_policy=config.get("cache_policy", "auto"),
                                       process_group_backend="nccl" if gpu else "gloo")  # fmt: skip
    stage = config.get("stage", "fit")
    callbacks: list = [PredictionWriter(output_dir=out)] if stage == "predict" else [Report(out, kind)]
    if gpu:
        from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback

        callbacks.append(DataTelemetry(prog_bar=False))
        if config.get("pipeline"):
            callbacks.append(PipelineCallback(mode="worker", mps=False))
    if config.get("every_n_steps"):
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(out, "ckpt"), every_n_train_steps=config["every_n_steps"],
                                         save_top_k=-1, filename="{step}"))  # fmt: skip
    trainer = pl.Trainer(accelerator="gpu" if gpu else "cpu", devices=devices, strategy=strategy,
                         max_epochs=config.get("max_epochs", 1),
                         limit_val_batches=0, logger=False, default_root_dir=out, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=bool(config.get("every_n_steps")),
                         callbacks=callbacks)  # fmt: skip
    torch.manual_seed(0)
    # the library's model: every parameter gets a gradient from the seeds' loss, as DDP requires
    optimizer = lambda params: torch.optim.SGD(params, lr=0.05)  # noqa: E731
    model_cls = HeteroNodeClassifier if kind.typed else GraphSAGE
    model = model_cls(dm.num_features, dm.num_classes, hidden_channels=16, num_layers=2, dropout=0.0,
                      optimizer=optimizer)
    if stage == "predict":
        trainer.predict(model.eval(), datamodule=dm, return_predictions=False)
    else:
        trainer.fit(model, datamodule=dm, ckpt_path=config.get("ckpt"))


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        main(json.load(f))
