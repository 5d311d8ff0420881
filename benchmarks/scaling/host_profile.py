"""Where a rank's main thread spends a training step, per phase: PyTorch's profiler over a few steps of each phase,
summed by operator and CUDA runtime call (their host time, self time, calls per step).

Issue 39: the data phase's forward took 1.2–2.7 ms more host time than the model phase's on the same module, and the
CUDA sync debug mode found no synchronizing call in it (0.05 a step, 2 x H200, 2026-11-29); the trainer's main
thread ran at 0.62–0.70 of a core in both phases, so in the data phase it waits ~1.8 ms more a step without a sync
that PyTorch reports. What that wait is (a CUDA runtime call that blocks, e.g. an allocation or an event wait, or a
Python lock) shows here as a runtime call's or operator's host time, next to the same step's in the model phase.
Run it as a knob variant of the diagnostic: ``python -m benchmarks.scaling.diag --plan knobs --knobs
profile_steps=20`` (each rank's report gains ``host_profile``: per phase, the ``top`` entries by host time per step).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import pytorch_lightning as pl

from benchmarks.scaling.phase_window import PhaseWindow

__all__ = ["HostProfile", "profile_lines", "summarize"]


def summarize(averages: Any, steps: int, top: int = 15) -> list[dict[str, Any]]:
    """The ``top`` entries of a profiler's ``key_averages()`` by host time (their own and their children's, in
    microseconds per step), with their self time and calls per step; largest first."""
    if steps <= 0:
        return []
    rows = [
        {
            "name": str(e.key),
            "host_us": round(float(e.cpu_time_total) / steps, 1),
            "self_us": round(float(e.self_cpu_time_total) / steps, 1),
            "calls": round(int(e.count) / steps, 2),
        }
        for e in averages
    ]
    rows.sort(key=lambda r: (-r["host_us"], r["name"]))
    return rows[:top]


def profile_lines(runs: list[dict[str, Any]], top: int = 8) -> list[str]:
    """For the log: each profiled rank and phase of ``runs`` (the diagnostic's reports), its ``top`` entries as
    ``name host_us/self_us xcalls`` (microseconds and calls per step)."""
    lines = []
    for run in runs:
        for rank, diag in enumerate(run.get("per_rank_diag") or []):
            for phase, found in sorted(((diag or {}).get("host_profile") or {}).items()):
                entries = "; ".join(f"{e['name']} {e['host_us']:.0f}/{e['self_us']:.0f} us x{e['calls']:g}"
                                    for e in found["top"][:top])  # fmt: skip
                lines.append(f"{run['name']} r{rank} {phase} ({found['steps']} steps): {entries}")
    return lines


class HostProfile(pl.Callback):
    """Profiles ``steps`` training steps of each phase in ``phases`` (after ``skip`` steps of it), one profiler
    session per phase (host activity and CUDA runtime calls).

    Args:
        phase_of: the phase of an epoch (as :class:`~benchmarks.scaling.timeline.StepTimeline` takes it).
        steps: steps to profile in each phase (0: none).
        phases: the phases to profile.
        skip: steps of a phase left out first (its first steps carry set-up).
        make_profiler: builds a started-on-enter profiler (for tests; default ``torch.profiler.profile`` with the
            CPU activity, and the CUDA one on a GPU).
    """

    def __init__(self, phase_of: Callable[[int], str], steps: int, phases: tuple[str, ...] = ("data", "model"),
                 skip: int = 5, make_profiler: Optional[Callable[[], Any]] = None) -> None:  # fmt: skip
        self.window = PhaseWindow(phase_of, steps, phases, skip)
        self.make_profiler = make_profiler or _cuda_profiler
        self.results: dict[str, dict[str, Any]] = {}
        self._running: Optional[tuple[str, Any]] = None

    @property
    def steps(self) -> int:
        """Steps to watch in a phase (0: none)."""
        return self.window.steps

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                             batch_idx: int) -> None:  # fmt: skip
        phase = self.window.opens(trainer.current_epoch)
        if phase is None or self._running is not None:
            return
        profiler = self.make_profiler()
        profiler.__enter__()
        self._running = (phase, profiler)

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        if self._running is None:
            return
        if self.window.count(self._running[0]):
            self._finish()

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._finish()  # a phase that ended before its steps were profiled keeps those it had

    def _finish(self) -> None:
        if self._running is None:
            return
        phase, profiler = self._running
        self._running = None
        profiler.__exit__(None, None, None)
        self.window.close(phase)
        steps = self.window.watched[phase]
        self.results[phase] = {"steps": steps, "top": summarize(profiler.key_averages(), steps)}

    def summary(self) -> dict[str, Any]:
        """``{phase: {"steps": n, "top": [...]}}`` for each profiled phase."""
        return dict(self.results)


def _cuda_profiler() -> Any:
    """The host's operators, and with a GPU the CUDA runtime calls (each with the host time it took)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    return profile(activities=[ProfilerActivity.CPU, *cuda])
