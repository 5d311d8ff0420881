"""How long the trainer waits for one batch from a live producer, and what it says when the wait runs out.

A fixed 10-minute default left a trainer silent for ten minutes when its worker was stopped (SIGSTOP, a debugger, a
stuck driver call). The default is now derived from the batches measured so far: :data:`FACTOR` times the slowest build
of this run, at least :data:`FLOOR_S` (60 s), so a frozen worker is named within about a minute on a normal run;
before the first batch (the worker's start, the first slots, a hybrid sampler's calibration) it is
:data:`FIRST_BATCH_S`. A number given by the user (``PipelineCallback(timeout=...)``) is used as it is.

When the wait runs out the error names the worker's pid and its state as the kernel reports it (``T (stopped)``:
``kill -CONT <pid>`` resumes it).
"""

from __future__ import annotations

from typing import Optional

from lightning_zerocopy.process_state import _stat

__all__ = ["FACTOR", "FIRST_BATCH_S", "FLOOR_S", "BatchTimeout", "process_state"]

FLOOR_S = 60.0
FACTOR = 20.0
FIRST_BATCH_S = 600.0

_STATES = {
    "R": "running", "S": "sleeping", "D": "in uninterruptible I/O", "T": "stopped", "t": "stopped by a debugger",
    "Z": "a zombie", "X": "dead", "I": "idle",
}  # fmt: skip


class BatchTimeout:
    """The wait for one batch: ``fixed`` seconds, or (``None``) derived from the slowest build measured so far.

    Args:
        fixed: seconds given by the user, or ``None`` for the derived default.
    """

    def __init__(self, fixed: Optional[float] = None) -> None:
        if fixed is not None and not fixed > 0:
            raise ValueError(f"`timeout` must be a positive number of seconds or None (derived), got {fixed!r}")
        self.fixed = None if fixed is None else float(fixed)
        self.slowest_build_s: Optional[float] = None

    def record(self, build_s: float) -> None:
        """A batch was built in ``build_s`` seconds."""
        if self.slowest_build_s is None or build_s > self.slowest_build_s:
            self.slowest_build_s = float(build_s)

    @property
    def seconds(self) -> float:
        if self.fixed is not None:
            return self.fixed
        if self.slowest_build_s is None:
            return FIRST_BATCH_S
        return max(FLOOR_S, FACTOR * self.slowest_build_s)

    def describe(self) -> str:
        """Why the limit is what it is, for the error."""
        if self.fixed is not None:
            return f"PipelineCallback(timeout={self.fixed:g})"
        if self.slowest_build_s is None:
            return "the allowance before a first batch"
        return (f"{FACTOR:g} x the slowest batch built so far ({self.slowest_build_s:.2f} s), at least {FLOOR_S:g} s; "
                "set PipelineCallback(timeout=...) for batches this slow")  # fmt: skip


def process_state(pid: Optional[int]) -> Optional[str]:
    """``"T (stopped)"`` and the like: process ``pid``'s state from ``/proc`` (``None`` where unknown)."""
    fields = None if pid is None else _stat(pid)
    return f"{fields[0]} ({_STATES.get(fields[0], 'unknown')})" if fields else None
