"""No host-device synchronization in a steady-state GPU training step (issue 20, item 1).

A real ``Trainer.fit`` of ``models.GraphSAGE`` on the ZeroCopyDataModule's GPU batches, with ``DataTelemetry`` and
the progress bar on: between two hand-overs to the logger (``log_every_n_steps``), torch's sync debug mode
(``torch.cuda.set_sync_debug_mode``) reports every synchronizing torch call of the trainer process, and the
main thread's ``Event/Stream.synchronize`` and ``torch.cuda.synchronize`` calls are counted. Building a batch in
the trainer's process (the in-process loader) is left out of the count: that is the data path's work, which the
pipeline moves to a producer; the ``PipelineCallback`` variant builds in a worker process and counts everything.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.loggers import CSVLogger

from helpers import sync_warnings
from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GraphSAGE

LOG_EVERY = 10
WINDOW = (LOG_EVERY + 1, 2 * LOG_EVERY - 1)  # batches 11..18: after the hand-over at batch 9, before the one at 19


class _SyncWatch(Callback):
    """Sync debug mode "warn" from the start of batch ``WINDOW[0]`` to the start of batch ``WINDOW[1]`` of the first
    epoch: everything in between (steps, hooks, logging, progress bar, fetching the next batches) is watched."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.active = False
        self.warnings: list[str] = []
        self.explicit: list[str] = []
        self.steps = 0
        self._catch = warnings.catch_warnings(record=True)
        main = threading.main_thread()
        for owner, name in ((torch.cuda.Event, "synchronize"), (torch.cuda.Stream, "synchronize"), (torch.cuda, "synchronize")):
            original = getattr(owner, name)

            def counted(*args, _original=original, _name=f"{getattr(owner, '__name__', owner)}.{name}", **kwargs):
                if self.active and threading.current_thread() is main:
                    self.explicit.append(_name)
                return _original(*args, **kwargs)

            monkeypatch.setattr(owner, name, counted)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch != 0:
            return
        if batch_idx == WINDOW[0]:
            self._records = self._catch.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            self.active = True
        elif batch_idx == WINDOW[1] and self.active:
            self._stop()
        if self.active:
            self.steps += 1

    def _stop(self) -> None:
        torch.cuda.set_sync_debug_mode(0)
        self.active = False
        self._catch.__exit__(None, None, None)
        self.warnings = sync_warnings(self._records)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.active:
            self._stop()


def _quiet_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process loader builds batches with the sync debug mode off (the data path's syncs are not counted)."""
    original = BatchBuilder.build_batch

    def build_batch(self, *args, **kwargs):
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            return original(self, *args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(mode)

    monkeypatch.setattr(BatchBuilder, "build_batch", build_batch)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", ["in_process_loader", "zerocopy_ddp_cache", "pipeline_worker"])
def test_no_synchronization_between_two_log_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str) -> None:
    dataset = SyntheticGraph(num_nodes=40_000, avg_degree=10, num_features=64, num_classes=8,
                             cache_dir=str(tmp_path / "data"))  # fmt: skip
    dm = ZeroCopyDataModule(dataset, fanouts=[10, 5], batch_size=512, sampler_placement="gpu", gather="zerocopy")
    callbacks: list[Callback] = [DataTelemetry(prog_bar=True)]
    strategy: object = "auto"
    if variant == "pipeline_worker":
        callbacks.append(PipelineCallback(mode="worker", depth=2))
    else:
        _quiet_build(monkeypatch)
    if variant == "zerocopy_ddp_cache":
        from lightning_zerocopy.strategies import ZeroCopyDDPStrategy

        strategy = ZeroCopyDDPStrategy(cache_budget="4MiB")
    watch = _SyncWatch(monkeypatch)
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, strategy=strategy, max_epochs=1, limit_val_batches=2, num_sanity_val_steps=0,
        log_every_n_steps=LOG_EVERY, logger=CSVLogger(str(tmp_path)), enable_checkpointing=False,
        enable_progress_bar=True, enable_model_summary=False, callbacks=[*callbacks, watch],
    )  # fmt: skip
    model = GraphSAGE(64, 8, hidden_channels=64, num_layers=2)
    trainer.fit(model, datamodule=dm)

    assert watch.steps == WINDOW[1] - WINDOW[0], "the watched window did not run: too few batches per epoch"
    assert watch.warnings == [], "synchronizing torch calls between two log steps:\n" + "\n".join(watch.warnings)
    assert watch.explicit == [], f"explicit synchronizations between two log steps: {watch.explicit}"
    # the figures still reach the logger and the progress bar
    logged = trainer.logged_metrics
    for key in ("train_loss", "train_acc_step", "train_acc_epoch", "data/stall_frac_step", "data/stall_frac_epoch"):
        assert key in logged, sorted(logged)
    assert {"train_loss", "train_acc_step", "stall"} <= set(trainer.progress_bar_metrics)
    if variant == "zerocopy_ddp_cache":
        assert "cache/hit_rate" in logged
