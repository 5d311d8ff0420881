"""DataTelemetry: on the CPU the stall is the host's wait for data; on a GPU it is the GPU's idle gap between
steps, which a slow loader causes and a host that merely runs ahead of a busy GPU does not."""

from __future__ import annotations

import statistics
import time
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from torch_geometric.data import Data

from lightning_zerocopy.callbacks import DataTelemetry


class _SlowLoader:
    """Batches that take ``host_ms`` of host time each to produce."""

    def __init__(self, steps: int, host_ms: float) -> None:
        self.steps, self.host_ms = steps, host_ms

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        for _ in range(self.steps):
            time.sleep(self.host_ms / 1e3)
            yield Data(x=torch.randn(64, 8), edge_index=torch.randint(0, 64, (2, 256)), batch_size=16)


class _BusyModel(pl.LightningModule):
    """A step that keeps the GPU busy for ``gpu_cycles`` clock cycles (``torch.cuda._sleep``), or does nothing
    on the CPU."""

    def __init__(self, gpu_cycles: int = 0) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 2)
        self.gpu_cycles = gpu_cycles

    def training_step(self, batch, batch_idx):
        if self.gpu_cycles and batch.x.is_cuda:
            torch.cuda._sleep(self.gpu_cycles)
        return self.lin(batch.x).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(accelerator: str, host_ms: float, gpu_cycles: int = 0, steps: int = 40) -> list[dict[str, float]]:
    telemetry = DataTelemetry(prog_bar=False)
    trainer = pl.Trainer(
        accelerator=accelerator, devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, callbacks=[telemetry],
    )  # fmt: skip
    trainer.fit(_BusyModel(gpu_cycles), train_dataloaders=_SlowLoader(steps, host_ms))
    assert len(telemetry.history) >= steps // 2
    return telemetry.history[5:]


def _median(history: list[dict[str, float]], key: str) -> float:
    return statistics.median(m[key] for m in history)


def test_on_the_cpu_the_stall_is_the_host_wait():
    history = _fit("cpu", host_ms=20)
    assert all(m["data/stall_ms"] == m["data/wait_ms"] for m in history)
    assert _median(history, "data/stall_ms") >= 18 and 0 < _median(history, "data/stall_frac") <= 1
    for key in ("data/seps", "data/gather_GBps"):
        assert _median(history, key) > 0


def _cycles_per_ms() -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    start.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    end.synchronize()
    return 50_000_000 / start.elapsed_time(end)


@pytest.mark.cuda
def test_on_a_gpu_the_stall_is_idle_gpu_time_not_host_wait():
    cycles_per_ms = _cycles_per_ms()
    # GPU-bound: 30 ms of GPU work per step, 3 ms to load a batch: the host waits, the GPU never idles
    busy = _fit("gpu", host_ms=3, gpu_cycles=int(30 * cycles_per_ms))
    # loader-bound: 2 ms of GPU work, 30 ms to load: the GPU idles most of each step
    starved = _fit("gpu", host_ms=30, gpu_cycles=int(2 * cycles_per_ms))
    assert _median(busy, "data/wait_ms") >= 2.5  # the host did wait for every batch ...
    assert _median(busy, "data/stall_frac") < 0.15, busy[:5]  # ... but the GPU was busy meanwhile
    assert _median(starved, "data/stall_frac") > 0.6, starved[:5]
    assert _median(starved, "data/stall_ms") > 20


def _one_type_strategy(readings, row_bytes: int):
    """A strategy with a cache over one table (one node type, plan ``"one-plan"``), counters read from ``readings``."""
    from types import SimpleNamespace

    from lightning_zerocopy.graph.schema import NODE

    decision = SimpleNamespace(plans={NODE: SimpleNamespace(digest="one-plan")}, row_bytes={NODE: row_bytes})
    return SimpleNamespace(cache_decision=decision, cache_counts_per_type=lambda: {NODE: next(readings)})


def test_cache_figures_per_epoch_from_the_datamodule() -> None:
    """The epoch's cache counts (a delta since the epoch started, from the strategy) become hit rate, row sources
    and host GB/s."""
    from types import SimpleNamespace

    from lightning_zerocopy.cache.segmented import CacheCounts

    readings = iter([CacheCounts(10, 0, 5), CacheCounts(40, 10, 25)])
    strategy = _one_type_strategy(readings, row_bytes=16)
    logged: dict[str, float] = {}
    module = _LoggingModule(logged)
    telemetry = DataTelemetry(prog_bar=False)
    trainer = SimpleNamespace(strategy=strategy)
    telemetry.on_train_epoch_start(trainer, module)
    telemetry.on_train_epoch_end(trainer, module)
    assert logged["cache/local_rows"] == 30 and logged["cache/peer_rows"] == 10 and logged["cache/host_rows"] == 20
    assert logged["cache/hit_rate"] == pytest.approx(40 / 60)
    assert logged["cache/host_bytes"] == 20 * 16 and logged["cache/host_read_GBps"] > 0
    assert telemetry.cache_history == [logged]
    assert not any(name.startswith("cache/rows_") for name in logged)  # one type: its figures are the totals
    # the epoch figures are reduced over the ranks by this callback (sync_dist only marks them as job-wide)
    assert all(kw["sync_dist"] and kw["on_epoch"] and not kw["on_step"] for kw in module.kwargs.values())


class _LoggingModule:
    """Records ``log`` calls: the value as a number and the keyword arguments, by name."""

    def __init__(self, logged: dict[str, float]) -> None:
        self.logged, self.kwargs, self.device = logged, {}, torch.device("cpu")

    def log(self, name: str, value, **kwargs) -> None:
        assert isinstance(value, torch.Tensor)
        self.logged[name] = float(value)
        self.kwargs[name] = kwargs


class _HybridDataModule(pl.LightningDataModule):
    """Batches whose sampling a fake hybrid dispatcher placed: every third on the CPU, the rest on the GPU."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        from lightning_zerocopy.sampling import HybridStats

        self.steps, self.stats = steps, HybridStats()

    def sampling_stats(self, split: str):
        assert split == "train"
        return self.stats

    def train_dataloader(self):
        from lightning_zerocopy.sampling import Dispatch

        def batches():
            for step in range(self.steps):
                lane = "cpu" if step % 3 == 0 else "gpu"
                self.stats.record(Dispatch(step, lane, 100.0, predicted_s=0.004, measured_s=0.005 if lane == "gpu" else 0.02))
                yield Data(x=torch.randn(64, 8), edge_index=torch.randint(0, 64, (2, 256)), batch_size=16)

        return _Batches(batches(), self.steps)


class _Batches:
    def __init__(self, it, n: int) -> None:
        self.it, self.n = it, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return self.it


def test_hybrid_sampling_shares_and_predicted_vs_measured_times_are_logged():
    telemetry = DataTelemetry(prog_bar=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, callbacks=[telemetry],
    )  # fmt: skip
    trainer.fit(_BusyModel(), datamodule=_HybridDataModule(30))
    last = telemetry.history[-1]
    assert last["data/share_cpu"] == pytest.approx(1 / 3, abs=0.05)
    assert last["data/share_gpu"] == pytest.approx(2 / 3, abs=0.05)
    assert last["data/sample_pred_ms"] == pytest.approx(4.0)
    assert {m["data/sample_ms"] for m in telemetry.history} == {5.0, 20.0}


def test_cache_figures_sum_the_trainer_process_and_the_pipeline_worker_each_once() -> None:
    """The trainer process's caches (the strategy) and a pipeline worker's (its reports in the pipeline's stats)
    are different rows: the epoch's figures are the sum of each one's delta; a worker whose counters restarted
    (a new worker) counts from zero."""
    from types import SimpleNamespace

    from lightning_zerocopy.callbacks import PipelineCallback
    from lightning_zerocopy.cache.segmented import CacheCounts
    from lightning_zerocopy.pipeline.client import CacheReport, PipelineStats

    readings = iter([CacheCounts(10, 0, 5), CacheCounts(12, 0, 6), CacheCounts(12, 0, 6), CacheCounts(12, 0, 6)])
    strategy = _one_type_strategy(readings, row_bytes=16)
    pipeline = PipelineCallback(mode="worker")
    pipeline.client = SimpleNamespace(stats=PipelineStats())
    logged: dict[str, float] = {}
    module = _LoggingModule(logged)
    telemetry = DataTelemetry(prog_bar=False)
    trainer = SimpleNamespace(strategy=strategy, callbacks=[pipeline, telemetry])

    telemetry.on_train_epoch_start(trainer, module)  # the worker has not reported yet
    pipeline.client.stats.cache = CacheReport(local=100, peer=50, host=50, row_bytes=64,
                                              per_plan=(("one-plan", 100, 50, 50, 64),))  # fmt: skip
    telemetry.on_train_epoch_end(trainer, module)
    assert (logged["cache/local_rows"], logged["cache/peer_rows"], logged["cache/host_rows"]) == (102, 50, 51)
    assert logged["cache/hit_rate"] == pytest.approx(152 / 203)
    assert logged["cache/host_bytes"] == 1 * 16 + 50 * 64  # each process's host rows at its row bytes

    telemetry.on_train_epoch_start(trainer, module)
    pipeline.client.stats.cache = CacheReport(30, 0, 10, 64, (("one-plan", 30, 0, 10, 64),))  # a restarted worker
    telemetry.on_train_epoch_end(trainer, module)
    assert (logged["cache/local_rows"], logged["cache/peer_rows"], logged["cache/host_rows"]) == (30, 0, 10)
    assert len(telemetry.cache_history) == 2


def test_two_ranks_log_job_wide_epoch_figures_without_sync_dist_warnings(tmp_path) -> None:
    """Issue 22: under DDP the epoch figures were logged per rank and Lightning warned "It is recommended to use
    `self.log(..., sync_dist=True)`" for each. Now every rank logs the job's figures: the ranks' sums added before
    dividing (the stall share over both ranks' step time; the accuracy over both ranks' seeds)."""
    import json
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[1] / "scripts" / "telemetry_ddp_script.py"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for key in ("LOCAL_RANK", "WORLD_SIZE", "GLOBAL_RANK", "RANK", "NODE_RANK"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), str(tmp_path / "cache")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in ranks:
        assert not [w for w in rank["warnings"] if "sync_dist" in w], rank["warnings"]
    assert ranks[0]["epoch"] == ranks[1]["epoch"]  # one figure for the job, the same on every rank
    history = [h for rank in ranks for h in rank["history"]]
    stall, interval = sum(h["data/stall_ms"] for h in history), sum(h["data/step_ms"] for h in history)
    epoch = ranks[0]["epoch"]
    assert epoch["data/stall_frac_epoch"] == pytest.approx(stall / interval, rel=1e-9)
    assert epoch["data/step_ms_epoch"] == pytest.approx(interval / len(history), rel=1e-9)
    correct, labeled = sum(r["correct"] for r in ranks), sum(r["labeled"] for r in ranks)
    assert epoch["train_acc_epoch"] == pytest.approx(correct / labeled, rel=1e-12)


def test_figures_never_make_lightning_infer_a_batch_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Link batches as PyG's LinkNeighborLoader makes them have no ``batch_size``; Lightning would guess one from the
    batch's tensors (and warn it is ambiguous) for a figure averaged over the epoch. The telemetry's step figures are
    step-only and its epoch figures a ``max`` over ranks, so Lightning never has to guess, on any step."""
    from pytorch_lightning.trainer.connectors.logger_connector import result

    guesses: list[Any] = []
    monkeypatch.setattr(result, "extract_batch_size", lambda batch: guesses.append(batch) or 1)

    class _LinkBatches(_SlowLoader):
        def __iter__(self):
            for batch in super().__iter__():
                del batch.batch_size
                batch.edge_label_index = torch.randint(0, 64, (2, 32))
                batch.input_id = torch.arange(16)
                yield batch

    telemetry = DataTelemetry(prog_bar=True)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, callbacks=[telemetry],
                         log_every_n_steps=1)  # fmt: skip
    trainer.fit(_BusyModel(), train_dataloaders=_LinkBatches(6, 0.0))
    assert any(name.endswith("_epoch") for name in trainer.callback_metrics), trainer.callback_metrics
    assert {"stall", "MEPS"} <= set(trainer.callback_metrics)
    assert guesses == []


def test_step_figures_are_built_when_the_history_is_read_not_in_the_training_loop(monkeypatch) -> None:
    """A step's history figures cost host time in the loop (~20 µs a step); they are built when ``history`` is
    read, from the same per-step record, so they stay each step's own figures."""
    from lightning_zerocopy.callbacks.step_figures import StepSums

    built: list[int] = []
    original = StepSums.figures
    monkeypatch.setattr(StepSums, "figures", lambda self: built.append(self.steps) or original(self))
    telemetry = DataTelemetry(prog_bar=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False, log_every_n_steps=100,
        enable_model_summary=False, enable_checkpointing=False, callbacks=[telemetry],
    )  # fmt: skip
    trainer.fit(_BusyModel(), train_dataloaders=_SlowLoader(30, host_ms=1))
    assert len(built) == 2  # the epoch's last batch hands its window over, and the epoch's figures: no per-step work
    history = telemetry.history
    assert len(history) == 29 and built[2:] == [1] * 29  # every counted step, each from its own record
    assert telemetry.history is history and len(built) == 31  # built once
    assert all(h["data/stall_ms"] == h["data/wait_ms"] and h["data/stall_ms"] >= 0.9 for h in history)
