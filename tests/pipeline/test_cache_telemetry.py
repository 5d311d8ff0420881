"""Feature-cache counters of the process that gathers reach DataTelemetry: a pipeline worker reports its caches'
row counts through the pipeline's stats; an in-process producer's caches are the trainer process's own (read by
the strategy) and are not reported a second time.

The GPU cache is replaced by a CPU fake tracked like the strategy's caches (``helpers.pipeline_fakes.FakeRowCache``).
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from helpers.pipeline_fakes import CachedSource
from pytorch_lightning.strategies import SingleDeviceStrategy

from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
from lightning_zerocopy.callbacks.pipeline import trainer_batch_limit
from lightning_zerocopy.pipeline import start_pipeline
from lightning_zerocopy.pipeline.loader import PipelineLoader
from lightning_zerocopy.pipeline.cache_report import CACHE_REPORT_EVERY
from lightning_zerocopy.pipeline.session import PipelineSession
from lightning_zerocopy.cache.sharded_provider import open_cache_counts
from lightning_zerocopy.graph.schema import NODE


def _rows(report) -> tuple[int, int, int]:
    return (report.local, report.peer, report.host)


def _plus(a, b) -> tuple[int, int, int]:
    return tuple(x + y for x, y in zip(a, b))


def test_a_worker_reports_its_cache_counters_with_the_last_batch_and_every_n_batches():
    steps = CACHE_REPORT_EVERY + 8
    src = CachedSource(steps=steps, seed=5)
    client = start_pipeline("worker", depth=2, timeout=60)
    try:
        client.register("train", src)
        assert client.stats.cache is None  # nothing gathered yet: nothing reported
        for step, _batch in enumerate(client.iterate("train", 0)):
            if step == CACHE_REPORT_EVERY - 1:  # reported just before this batch: the rows of batches 0..31
                assert _rows(client.stats.cache) == src.expected_rows(0, range(CACHE_REPORT_EVERY))
            if step == steps - 1:  # the last batch of the iteration arrives with the totals of all of them
                assert _rows(client.stats.cache) == src.expected_rows(0)
        assert client.stats.cache.row_bytes == 32
        epoch0 = src.expected_rows(0)
        assert all(n > 0 for n in epoch0)

        # an iteration abandoned early reports what was gathered when the trainer ends it (picked up with the
        # next iteration's first batch): at least the batches taken, at most the whole epoch
        it = client.iterate("train", 1)
        for _ in range(5):
            next(it)
        it.close()
        it = client.iterate("train", 2, start=0, stop=3)
        next(it)
        got = _rows(client.stats.cache)
        low, high = _plus(epoch0, src.expected_rows(1, range(5))), _plus(epoch0, src.expected_rows(1))
        assert all(lo <= g <= hi for lo, g, hi in zip(low, got, high)), (low, got, high)
        it.close()
    finally:
        client.close()


def test_an_in_process_producer_reports_nothing_its_caches_are_the_trainers():
    src = CachedSource(steps=6, seed=6)
    client = start_pipeline("in_process", depth=2, timeout=60)
    try:
        client.register("train", src)
        for _ in client.iterate("train", 0):
            pass
        assert client.stats.cache is None
        # the strategy's reading of this process's caches sees the producer thread's rows, once
        assert tuple(open_cache_counts("fake-plan")) == src.expected_rows(0)
    finally:
        client.close()
    assert open_cache_counts("fake-plan") is None  # closed with the producer


class _CountingStrategy(SingleDeviceStrategy):
    """The strategy's side of the cache telemetry (as ZeroCopyDDPStrategy): this process's open caches."""

    cache_decision = SimpleNamespace(plans={NODE: SimpleNamespace(digest="fake-plan")}, row_bytes={NODE: 32})

    def cache_counts_per_type(self):
        return {NODE: open_cache_counts("fake-plan")}


class _Inner:
    """The DataModule loader a PipelineLoader stands in for: its length and position."""

    epoch, start_step = 0, 0

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def state_dict(self) -> dict:
        return {}


class _Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        return self.lin(batch.x).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.parametrize("mode", ["worker", "in_process"])
def test_data_telemetry_logs_the_rows_the_pipeline_gathered_once(mode):
    """Per epoch, DataTelemetry's cache figures are the rows the producer gathered that epoch, whether a worker
    process (reported through the pipeline) or a producer thread of the trainer (read by the strategy) gathered
    them; never both."""
    steps, epochs = 9, 2
    src = CachedSource(steps=steps, seed=7)
    pipeline = PipelineCallback(mode=mode, depth=2)
    pipeline.client = start_pipeline(mode, depth=2, timeout=60)  # what attach_host_memory does for a DataModule
    pipeline.client.register("train", src)
    telemetry = DataTelemetry(prog_bar=False)
    trainer = pl.Trainer(
        accelerator="cpu", strategy=_CountingStrategy(device=torch.device("cpu")), max_epochs=epochs, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        callbacks=[pipeline, telemetry],
    )  # fmt: skip
    trainer.fit(_Model(), train_dataloaders=PipelineLoader(pipeline.client, "train", _Inner(steps)))
    assert pipeline.client is None  # closed at teardown

    assert len(telemetry.cache_history) == epochs
    for epoch, figures in enumerate(telemetry.cache_history):
        local, peer, host = src.expected_rows(epoch)
        assert figures["cache/local_rows"] == local, (epoch, figures)
        assert figures["cache/peer_rows"] == peer, (epoch, figures)
        assert figures["cache/host_rows"] == host, (epoch, figures)
        assert figures["cache/hit_rate"] == pytest.approx((local + peer) / (local + peer + host))
        assert figures["cache/host_read_GBps"] > 0


def test_under_limit_train_batches_a_worker_reports_each_epochs_rows_with_its_last_batch():
    """``limit_train_batches`` below the loader's length: the loader asks the worker for the batches the loop takes
    (``trainer_batch_limit``), so the last of them brings the epoch's cache counters and each epoch's figures are
    its own rows (an unbounded request left the epoch unreported: the worker reports every 32 batches and at the
    end of what it was asked for)."""
    steps, taken, epochs = 9, 5, 2
    src = CachedSource(steps=steps, seed=8)
    pipeline = PipelineCallback(mode="worker", depth=2)
    pipeline.client = start_pipeline("worker", depth=2, timeout=60)
    pipeline.client.register("train", src)
    telemetry = DataTelemetry(prog_bar=False)
    trainer = pl.Trainer(
        accelerator="cpu", strategy=_CountingStrategy(device=torch.device("cpu")), max_epochs=epochs, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        limit_train_batches=taken, callbacks=[pipeline, telemetry],
    )  # fmt: skip
    loader = PipelineLoader(pipeline.client, "train", _Inner(steps), limit=partial(trainer_batch_limit, trainer, "train"))
    trainer.fit(_Model(), train_dataloaders=loader)
    assert len(telemetry.cache_history) == epochs
    for epoch, figures in enumerate(telemetry.cache_history):
        local, peer, host = src.expected_rows(epoch, range(taken))
        assert (figures["cache/local_rows"], figures["cache/peer_rows"], figures["cache/host_rows"]) == \
            (local, peer, host), (epoch, figures)  # fmt: skip


def test_the_sessions_loaders_ask_the_trainer_how_many_training_batches_it_takes():
    session = PipelineSession(("train", "val"), (), client=object())
    session.batch_limit = lambda split: {"train": 4}.get(split)
    train, val = session.loader("train", _Inner(9)), session.loader("val", _Inner(9))
    assert train._limit() == 4 and val._limit() is None
    trainer = pl.Trainer(accelerator="cpu", limit_train_batches=3, logger=False, enable_progress_bar=False)
    assert trainer_batch_limit(trainer, "train") is None  # before fit: no loader measured yet (inf)
    trainer.fit_loop.max_batches = 3  # what fit sets once it has measured the training loader
    assert trainer_batch_limit(trainer, "train") == 3 and trainer_batch_limit(trainer, "val") is None
