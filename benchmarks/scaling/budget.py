"""How long a scaling run trains: :class:`EpochTimer` (seconds and steps of every epoch) and :class:`RunBudget` (the
warm-up epoch's length and the measured epochs' step cap, the same on every rank)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch

__all__ = ["EpochTimer", "RunBudget"]


class EpochTimer(pl.Callback):
    """Seconds and steps of every training epoch (the device synchronized at both ends on a GPU)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.seconds: list[float] = []
        self.steps: list[int] = []
        self._t = 0.0

    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self._t = time.perf_counter()
        self.steps.append(0)

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        self.steps[-1] += 1

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds.append(time.perf_counter() - self._t)


class RunBudget(pl.Callback):
    """Bounds a run's training time: the first (warm-up) epoch runs ``warmup_batches`` steps (0: as many as the
    others), and once it ended rank 0 sizes every later epoch so that they take about ``seconds`` together at the
    steady step time of the warm-up's second half (a warm-up of at least 3 steps; at least :attr:`MIN_STEPS` steps,
    never more than the trainer's own limit), and hands that step count to every rank (one broadcast: the ranks stop
    at the same step, no rank waits in a collective for another). ``seconds <= 0``: no cap.

    The steady step time is the median interval between the ends of the second half's steps: the warm-up's slow
    outliers (allocator growth, the ring's copies, logging steps) and the epoch's end (the telemetry's epoch figures,
    the pipeline's epoch switch) stay out of it. (A mean up to the epoch's end, as before 2026-11-28, read ~48 ms for
    ~12 ms steps on 2 x H200 and cut the measured epochs to a fifth of ``seconds``.)

    The cap sets the fit loop's ``max_batches``, where ``Trainer(limit_train_batches=...)`` puts its own limit."""

    #: the fewest steps a measured epoch keeps, however slow the warm-up was
    MIN_STEPS = 10

    def __init__(self, warmup_batches: int, seconds: float, epochs: int, cuda: bool,
                 clock: Callable[[], float] = time.perf_counter) -> None:  # fmt: skip
        self.warmup_batches, self.seconds, self.epochs = int(warmup_batches), float(seconds), int(epochs)
        self.cuda, self.clock = cuda, clock
        #: the warm-up's steady step time in seconds (``None`` until it is known)
        self.step_s: Optional[float] = None
        self.cap: Optional[int] = None
        self._limit: Any = None
        self._ends: list[float] = []

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._limit = trainer.fit_loop.max_batches  # the trainer's own (--limit-batches, else the whole split)
        if 0 < self.warmup_batches < self._limit:
            trainer.fit_loop.max_batches = self.warmup_batches

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        if trainer.current_epoch == 0:  # host times: in a steady state the host keeps the GPU's pace
            self._ends.append(self.clock())

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if trainer.current_epoch != 0:
            return
        full = self._limit
        cap = full
        if self.seconds > 0 and self.epochs > 1 and len(self._ends) >= 3:  # a second half of >= 1 step interval
            half = len(self._ends) // 2
            self.step_s = statistics.median(b - a for a, b in zip(self._ends[half:], self._ends[half + 1 :]))
            cap = max(self.MIN_STEPS, int(self.seconds / (self.epochs - 1) / max(self.step_s, 1e-6)))
        cap = trainer.strategy.broadcast(min(cap, full))  # rank 0's figure on every rank
        self.cap = None if cap == float("inf") else int(cap)
        trainer.fit_loop.max_batches = cap

