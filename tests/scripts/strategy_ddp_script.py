"""A DDP job with ZeroCopyDDPStrategy, used by test_strategy_ddp.py (CPU ranks, gloo) and
test_two_gpus_cuda.py (``"accelerator": "gpu"``: NCCL, the zero-copy gather, every batch's features checked).

``python strategy_ddp_script.py CONFIG_JSON``; Lightning's launcher re-runs it once per extra local rank (and the
test starts one launcher per simulated node with ``NODE_RANK`` set). Every rank writes ``rank<N>.json``: where it
runs, the training seeds of epoch 0, the shared segments it maps and their PSS, its cache decision and (GPU) the
rows its cache served from the local shard, peers and host memory.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytorch_lightning as pl
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_sage import TinySAGE  # noqa: E402  (this script's folder)

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.graph import mapped_footprint
from lightning_zerocopy.strategies import ZeroCopyDDPStrategy


class Report(pl.Callback):
    def __init__(self, config: dict) -> None:
        self.config = config
        self.seeds: list[list[int]] = []
        self.paths: list[str] = []
        self.sizes = 0

    def setup(self, trainer, pl_module, stage) -> None:
        handles = trainer.datamodule.handles
        tensors = [handles.graph.indptr, handles.graph.indices, handles.features.data, handles.labels]
        self.paths = [t.path for t in tensors]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.config.get("accelerator") == "gpu":  # the features are bitwise the host table's rows of n_id
            table = trainer.datamodule._builders["train"]._host.features.data
            assert batch.x.is_cuda and torch.equal(batch.x.cpu(), table[batch.n_id.cpu()]), "wrong feature rows"
        if trainer.current_epoch == 0:
            self.seeds.append(batch.n_id[: batch.batch_size].tolist())
        if self.config.get("die_rank") == trainer.global_rank and batch_idx == 2:
            with open(os.path.join(self.config["out"], f"dying{trainer.global_rank}"), "w") as f:
                f.write(str(os.getpid()))
            os._exit(7)
        if self.config.get("kill_worker_rank") == trainer.global_rank and batch_idx == 2 and trainer.current_epoch == 0:
            pipeline = next(cb for cb in trainer.callbacks if isinstance(cb, PipelineCallback))
            worker = pipeline.client.transport.pid
            with open(os.path.join(self.config["out"], f"worker{trainer.global_rank}"), "w") as f:
                f.write(str(worker))
            os.kill(worker, signal.SIGKILL)
        if self.config.get("dawdle"):
            if batch_idx == 1:
                open(os.path.join(self.config["out"], f"training{trainer.global_rank}"), "w").close()
            time.sleep(self.config["dawdle"])

    def on_exception(self, trainer, pl_module, exception) -> None:
        if self.config.get("slow_exception_rank") == trainer.global_rank:
            time.sleep(3.0)  # a slow shutdown (a GPU pipeline's): the other ranks exit meanwhile

    def on_train_end(self, trainer, pl_module) -> None:
        strategy = trainer.strategy
        decision = strategy.cache_decision
        (plan,) = decision.plans.values()  # one table: one node type
        builder = trainer.datamodule._builders["train"]
        host = builder._host
        tensors = (host.graph.indptr, host.graph.indices, host.features.data, host.labels)
        for tensor in tensors:
            tensor.sum()  # every page resident in this process, so PSS shows whether the ranks share them
        self.sizes = sum(t.numel() * t.element_size() for t in tensors)
        pss, rss = mapped_footprint(self.paths)
        report = {
            "rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "pid": os.getpid(),
            "seeds": self.seeds,
            "paths": self.paths,
            "segment_bytes": self.sizes,
            "pss": pss,
            "rss": rss,
            "train_idx": trainer.datamodule.plan("train").input_nodes.tolist(),
            "policy": decision.layout.policy,
            "group": list(decision.group),
            "shard_index": decision.shard_index,
            "rows": plan.rows.tolist(),
            "bounds": list(plan.bounds),
            "digest": plan.digest,
            "expected_hit_rate": decision.expected_hit_rate,
            "note": decision.layout.note,
            "cache_rows": _cache_rows(trainer),
        }
        with open(os.path.join(self.config["out"], f"rank{trainer.global_rank}.json"), "w", encoding="utf-8") as f:
            json.dump(report, f)
        with open(os.path.join(self.config["out"], f"pid{trainer.global_rank}"), "w") as f:
            f.write(str(os.getpid()))


def _cache_rows(trainer) -> dict:
    """Rows the feature cache served on this rank (its own gathers, or its pipeline worker's report)."""
    telemetry = next((cb for cb in trainer.callbacks if isinstance(cb, DataTelemetry)), None)
    if telemetry is None or not telemetry.cache_history:
        return {}
    last = telemetry.cache_history[-1]
    return {k.split("/", 1)[1]: v for k, v in last.items() if k.startswith("cache/")}


class Pids(pl.Callback):
    def __init__(self, out: str) -> None:
        self.out = out

    def setup(self, trainer, pl_module, stage) -> None:
        with open(os.path.join(self.out, f"pid{trainer.global_rank}"), "w") as f:
            f.write(str(os.getpid()))


def main(config: dict) -> None:
    pl.seed_everything(0)
    dataset = SyntheticGraph(
        num_nodes=config.get("num_nodes_graph", 2000), avg_degree=6, num_features=8, num_classes=3,
        cache_dir=config["cache"],
    )
    gpu = config.get("accelerator") == "gpu"
    dm = ZeroCopyDataModule(dataset, fanouts=[4, 4], batch_size=64, drop_last=True, seed=1,
                            gather="zerocopy" if gpu else "cpu")  # fmt: skip
    strategy = ZeroCopyDDPStrategy(
        cache_budget=config.get("budget", "2KiB"),
        cache_ranking=config.get("ranking", "degree"),
        cache_policy=config.get("policy", "auto"),
        presample_batches=config.get("presample_batches", 24),
        peer_access=config.get("peer_access"),
        process_group_backend="nccl" if gpu else "gloo",
        liveness_interval=config.get("liveness_interval", 0.5),
    )
    trainer = pl.Trainer(
        accelerator="gpu" if gpu else "cpu",
        devices=config.get("devices", 2),
        num_nodes=config.get("num_nodes", 1),
        strategy=strategy,
        max_epochs=config.get("epochs", 1),
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Pids(config["out"]), Report(config)]
        + ([DataTelemetry(prog_bar=False)] if gpu else [])
        + ([PipelineCallback(mode="worker", mps=config.get("mps", False))] if config.get("pipeline") else []),
    )
    trainer.fit(TinySAGE(dm.num_features, dm.num_classes), datamodule=dm)


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        main(json.load(f))
