"""Batch-order or address-order reads for a zero-copy gather, fixed or chosen by timing both.

Random reads of host rows are bound by address translation; reading them in ascending address order (ids sorted on
the GPU, rows written back to their batch positions) touches fewer pages per batch, but costs a sort. Which wins
depends on the table, the batch and the machine, so ``"auto"`` times both on the first gathers and keeps the faster
per row (see ``docs/ARCHITECTURE.md``).
"""

from __future__ import annotations

import statistics
import threading
from typing import Callable, Optional

import torch

from lightning_zerocopy.options import GatherMode, check_choice

__all__ = ["ReadOrderChooser"]


class ReadOrderChooser:
    """Runs gathers in a fixed read order, or, for ``"auto"``, alternates both until each ran ``trial_calls`` times.

    Args:
        mode: ``"direct"`` (batch order), ``"sorted"`` (address order) or ``"auto"``.
        trial_calls: gathers per order that ``"auto"`` times before choosing.
    """

    def __init__(self, mode: GatherMode = "auto", trial_calls: int = 3) -> None:
        check_choice(mode, GatherMode, "mode")
        if mode == "staged":
            raise ValueError("'staged' is not a read order of the zero-copy kernel: a table gathering with it reads "
                             "through gather.staged (gather.staged.staged_for); set mode to auto, direct or sorted")
        if trial_calls < 1:
            raise ValueError(f"`trial_calls` must be >= 1, got {trial_calls}")
        self.mode: GatherMode = mode
        self.trial_calls = trial_calls
        self._trials: dict[str, list[float]] = {"direct": [], "sorted": []}
        self._lock = threading.Lock()

    @property
    def chosen(self) -> Optional[str]:
        """``"direct"`` or ``"sorted"`` once decided (at once unless ``mode="auto"``), else None."""
        if self.mode != "auto":
            return self.mode
        with self._lock:
            if min(len(v) for v in self._trials.values()) < self.trial_calls:
                return None
            direct = statistics.median(self._trials["direct"])
            ordered = statistics.median(self._trials["sorted"])
        return "sorted" if ordered < direct else "direct"

    @property
    def trial_times(self) -> dict[str, list[float]]:
        """Per-row seconds measured for each order during the ``auto`` trials."""
        with self._lock:
            return {k: list(v) for k, v in self._trials.items()}

    def run(self, gather: Callable[[bool], None], rows: int, stream: torch.cuda.Stream) -> None:
        """Call ``gather(sort_ids)`` in the chosen order, or time it in the next trial order on ``stream``."""
        mode = self.chosen
        if mode is not None:
            gather(mode == "sorted")
            return
        with self._lock:
            mode = "direct" if len(self._trials["direct"]) <= len(self._trials["sorted"]) else "sorted"
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        gather(mode == "sorted")
        end.record(stream)
        end.synchronize()
        if rows > 0:
            with self._lock:
                self._trials[mode].append(start.elapsed_time(end) * 1e-3 / rows)
