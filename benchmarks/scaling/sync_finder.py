"""Where a rank's training step waits for its GPU: for a few steps of one phase, PyTorch's CUDA sync debug mode
(``torch.cuda.set_sync_debug_mode("warn")``) warns at every synchronizing call, and :class:`SyncFinder` counts them
by the Python stack that made them (the innermost frames outside torch and Lightning first). Issue 39: the data
phase's forward took 1.2–2.7 ms more host time than the model phase's, with the GPU forward lasting exactly the host
forward; a sync inside it would explain both. Run it as a knob variant of the diagnostic on the largest GPU count:
``python -m benchmarks.scaling.diag --plan knobs --knobs sync_debug_steps=20`` (each rank's report gains ``syncs``)."""

from __future__ import annotations

import traceback
import warnings
from collections import Counter
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch

from benchmarks.scaling.phase_window import PhaseWindow

__all__ = ["SyncFinder", "caller_frames"]

#: frames of these packages are the machinery, not the caller to name
_MACHINERY = ("/torch/", "/pytorch_lightning/", "/lightning_fabric/", "/torchmetrics/", "/warnings.py",
              "/scaling/sync_finder.py")  # fmt: skip


def caller_frames(stack: list[traceback.FrameSummary], depth: int = 4) -> str:
    """The ``depth`` innermost frames of ``stack`` outside the machinery (else the innermost frames), innermost
    first, as ``file:line function`` joined by `` < ``."""
    ours = [f for f in stack if not any(part in f.filename for part in _MACHINERY)]
    picked = (ours or stack)[-depth:][::-1]
    return " < ".join(f"{f.filename.rsplit('/', 2)[-2:][-1]}:{f.lineno} {f.name}" for f in picked)


class SyncFinder(pl.Callback):
    """Counts the synchronizing CUDA calls of ``steps`` training steps of phase ``phase`` (the first of that phase
    after ``skip`` steps), by caller.

    Args:
        phase_of: the phase of an epoch (as :class:`~benchmarks.scaling.timeline.StepTimeline` takes it).
        steps: how many steps to watch (0: none).
        phase: the phase to watch.
        skip: steps of the phase left out first (its first steps carry set-up).
        set_mode: how to switch the debug mode (for tests; default ``torch.cuda.set_sync_debug_mode``).
    """

    def __init__(self, phase_of: Callable[[int], str], steps: int, phase: str = "data", skip: int = 5,
                 set_mode: Optional[Callable[[str], None]] = None) -> None:  # fmt: skip
        self.phase = phase
        self.window = PhaseWindow(phase_of, steps, (phase,), skip)
        self.set_mode = set_mode or torch.cuda.set_sync_debug_mode
        self.counts: Counter[str] = Counter()
        self._context: Optional[Any] = None

    @property
    def steps(self) -> int:
        """Steps to watch in a phase (0: none)."""
        return self.window.steps

    @property
    def watched(self) -> int:
        """Steps watched so far."""
        return self.window.watched[self.phase]

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                             batch_idx: int) -> None:  # fmt: skip
        if self.window.opens(trainer.current_epoch) is None:
            return
        self._context = warnings.catch_warnings()
        self._context.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._record
        self.set_mode("warn")

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        if self._context is None:
            return
        self.set_mode("default")
        self._context.__exit__(None, None, None)
        self._context = None
        self.window.count(self.phase)

    def _record(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                line: Optional[str] = None) -> None:  # fmt: skip
        if "synchroniz" not in str(message):
            return
        self.counts[caller_frames(traceback.extract_stack()[:-1])] += 1

    def summary(self) -> dict[str, Any]:
        """``{"steps": watched steps, "per_step": {caller: syncs per step}}``, most frequent first."""
        per_step = {k: round(v / self.watched, 3) for k, v in self.counts.most_common()} if self.watched else {}
        return {"phase": self.phase, "steps": self.watched, "per_step": per_step}
