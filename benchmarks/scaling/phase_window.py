"""Which training steps a per-phase probe of the scaling diagnostic watches (:class:`~.sync_finder.SyncFinder`,
:class:`~.host_profile.HostProfile`): in each phase it probes, ``steps`` steps after the phase's first ``skip`` (its
first steps carry set-up), counted over the run, until the window is full or closed."""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable, Optional

__all__ = ["PhaseWindow"]


class PhaseWindow:
    """The watched steps of each phase of ``phases``.

    Args:
        phase_of: the phase of an epoch (as :class:`~benchmarks.scaling.timeline.StepTimeline` takes it).
        steps: steps to watch in each phase (0: none).
        phases: the phases to watch.
        skip: steps of a phase left out first.
    """

    def __init__(self, phase_of: Callable[[int], str], steps: int, phases: Iterable[str], skip: int) -> None:
        self.phase_of, self.steps, self.phases, self.skip = phase_of, int(steps), tuple(phases), int(skip)
        self.watched: Counter[str] = Counter()
        self._seen: Counter[str] = Counter()
        self._closed: set[str] = set()

    def opens(self, epoch: int) -> Optional[str]:
        """At a step's start in ``epoch``: its phase when the step is one to watch, else ``None``."""
        phase = self.phase_of(epoch)
        if phase not in self.phases or phase in self._closed or self.watched[phase] >= self.steps:
            return None
        self._seen[phase] += 1
        return phase if self._seen[phase] > self.skip else None

    def count(self, phase: str) -> bool:
        """A watched step of ``phase`` ended; whether the phase's window is full now."""
        self.watched[phase] += 1
        return self.watched[phase] >= self.steps

    def close(self, phase: str) -> None:
        """Watch no more steps of ``phase`` (it ended before its window was full: keep what it watched)."""
        self._closed.add(phase)
