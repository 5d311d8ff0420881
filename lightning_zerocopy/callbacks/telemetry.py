"""``DataTelemetry``: how long the trainer waits for data, and how fast data arrives, per training step.

Logged through the LightningModule's logger, per step and as epoch means (the progress bar shows ``stall``,
the stall fraction, and ``MEPS``, millions of sampled edges per second):

* ``data/stall_ms``: host time between the end of one training step and the start of the next (fetching the
  batch and moving it to the device), i.e. what the trainer waited for data;
* ``data/stall_frac``: that time over the whole step interval;
* ``data/seps``: sampled edges per second delivered to the trainer (``edge_index`` columns / step interval);
* ``data/gather_GBps``: feature bytes delivered per second (``x`` bytes / step interval);
* with :class:`~lightning_zerocopy.callbacks.PipelineCallback`: ``data/build_ms``, the producer's time to
  sample and gather the batch (off the trainer's critical path).

Intervals are host wall-clock times: on a GPU the host runs ahead of the device until something synchronizes,
so per-step figures fluctuate; their averages over an epoch (logged ``on_epoch``) are the ones to read.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from typing_extensions import override


class DataTelemetry(Callback):
    """Per-step data-wait (stall), SEPS and feature GB/s of the training loop.

    Args:
        prog_bar: show the figures in the progress bar.
    """

    def __init__(self, prog_bar: bool = True) -> None:
        self.prog_bar = prog_bar
        self._last_start: Optional[float] = None
        self._last_end: Optional[float] = None
        self.history: list[dict[str, float]] = []

    def _reset(self) -> None:
        self._last_start = None
        self._last_end = None

    @override
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._reset()

    @override
    def on_validation_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._reset()  # the validation loop is not a data stall of the next training step

    @override
    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last_start is not None and self._last_end is not None:
            interval = now - self._last_start
            stall = now - self._last_end
            metrics = {"data/stall_ms": 1e3 * stall, "data/stall_frac": stall / interval if interval > 0 else 0.0}
            edge_index = getattr(batch, "edge_index", None)
            if isinstance(edge_index, torch.Tensor) and interval > 0:
                metrics["data/seps"] = edge_index.size(1) / interval
            x = getattr(batch, "x", None)
            if isinstance(x, torch.Tensor) and interval > 0:
                metrics["data/gather_GBps"] = x.numel() * x.element_size() / interval / 1e9
            stats = _pipeline_stats(trainer)
            if stats is not None:
                metrics["data/build_ms"] = 1e3 * stats.last_build_s
            self.history.append(metrics)
            bs = getattr(batch, "batch_size", None)
            bs = bs if isinstance(bs, int) else None
            pl_module.log_dict(metrics, on_step=True, on_epoch=True, batch_size=bs)
            if self.prog_bar:  # two compact figures; the full set goes to the logger
                pl_module.log("stall", metrics["data/stall_frac"], prog_bar=True, logger=False, batch_size=bs)
                if "data/seps" in metrics:
                    pl_module.log("MEPS", metrics["data/seps"] / 1e6, prog_bar=True, logger=False, batch_size=bs)
        self._last_start = now

    @override
    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._last_end = time.perf_counter()


def _pipeline_stats(trainer: "pl.Trainer"):
    from lightning_zerocopy.callbacks.pipeline import PipelineCallback

    for callback in trainer.callbacks:
        if isinstance(callback, PipelineCallback):
            return callback.stats
    return None
