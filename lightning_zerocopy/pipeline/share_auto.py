"""``PipelineCallback(worker_sm_percent="auto")``: one pipeline worker per MPS share, the smallest that keeps pace.

MPS fixes a worker's share when the worker creates its CUDA context, and a worker started after the DataModule's
``setup`` could not map the host memory (its names are unlinked by then). So during ``setup`` a worker is started
for every share of the ladder (10, 20, 30 %): the first builds the batches, the others only open their sources
(host memory mapped, no GPU placement, no slots) and wait. Each training step then feeds a
:class:`~lightning_zerocopy.pipeline.share_choice.ShareCalibrator` with the producer's build time of the step's batch
and the step's GPU time (CUDA events on the trainer's stream, read once they have completed: no synchronization).
When a share does not keep pace, the loaders move to the next worker between two batches (the rest of the epoch
comes from it, same batches); once a share is chosen the other workers are closed.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Optional

import torch
from pytorch_lightning.utilities import rank_zero_info

from lightning_zerocopy.pipeline.share_choice import SHARE_LADDER, ShareCalibrator

__all__ = ["AutoShare"]


class AutoShare:
    """The workers of the ladder's shares and the calibration that picks one.

    Args:
        start: ``start(percent, standby)`` starts a registered pipeline client whose worker has ``percent`` % of the
            SMs (``standby``: its sources are opened without GPU placement).
        device: the trainer's CUDA device.
        calibrator: the rule (default: :class:`ShareCalibrator` over :data:`SHARE_LADDER`).
    """

    def __init__(self, start: Callable[[int, bool], object], device: torch.device,
                 calibrator: Optional[ShareCalibrator] = None) -> None:  # fmt: skip
        self.calibrator = calibrator or ShareCalibrator(SHARE_LADDER)
        self.device = device
        self.clients: dict[int, object] = {}
        try:
            for i, percent in enumerate(self.calibrator.ladder):
                self.clients[percent] = start(percent, i > 0)
        except BaseException:
            self.close()
            raise
        self._pending: deque = deque()  # (start event, end event, build seconds) of steps not yet timed
        self._start: Optional[torch.cuda.Event] = None

    @property
    def active(self):
        """The client whose worker builds the batches now."""
        return self.clients[self.calibrator.current]

    def step_started(self) -> None:
        """At a training batch's start: a CUDA event on the trainer's stream."""
        if self.calibrator.done:
            return
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record(torch.cuda.current_stream(self.device))

    def step_ended(self, build_s: float) -> None:
        """At the batch's end: time the steps whose events have completed and move to another share if the rule
        says so; once it has decided, close the other workers."""
        if self.calibrator.done or self._start is None:
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.device))
        self._pending.append((self._start, end, build_s, self.calibrator.current))
        self._start = None
        while self._pending and self._pending[0][1].query():
            start, end, build, percent = self._pending.popleft()
            if percent != self.calibrator.current:
                continue  # measured under a share left since
            self.calibrator.record(1e3 * build, start.elapsed_time(end))
            if self.calibrator.done:
                rank_zero_info(f"PipelineCallback(worker_sm_percent='auto'): {self.calibrator.choice.summary()}")
                self._close_others()
                self._pending.clear()
                return

    def _close_others(self) -> None:
        keep = self.calibrator.current
        for percent in [p for p in self.clients if p != keep]:
            self.clients.pop(percent).close()

    def close(self, timeout: float = 5.0) -> None:
        """Close every worker, each given ``timeout`` seconds to stop (saying what an unfinished calibration
        measured: a run shorter than it needs)."""
        if self.clients and not self.calibrator.done:
            rank_zero_info(f"PipelineCallback(worker_sm_percent='auto'): {self.calibrator.unfinished()}")
        clients, self.clients = list(self.clients.values()), {}
        for client in clients:
            client.close(timeout)
