"""Which MPS share the pipeline worker needs: the smallest that builds a batch within the training step.

Under MPS the worker's share of the SMs is fixed when it creates its CUDA context (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
at spawn), and the trainer keeps the rest. Too small a share and the producer cannot keep pace (the trainer
stalls); too large and the producer's kernels take SMs the step could use. The rule: given the producer's median
build time per batch under each share of a ladder, measured side by side with the step time on the same batches,
take the smallest share whose build time fits in the step with some headroom; if none does, the share that builds
fastest, and say that the data path bounds the step.

Two users of the rule: ``benchmarks/parts/pipeline.py`` (``worker_mps_X`` rows give the build time under X %, the
``model_only`` row the step time; its report prints the choice), and :class:`ShareCalibrator`, which
``PipelineCallback(worker_sm_percent="auto")`` feeds with each training step's figures. A running worker's share
cannot change, and a worker started later could not map the DataModule's host memory (its names are unlinked after
``setup``), so the callback starts one worker per share of the ladder during ``setup``, all but the first idle (no
GPU placement, no slots), and moves to the next share between two batches when the current one does not keep pace.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

__all__ = ["SHARE_LADDER", "ShareCalibrator", "ShareChoice", "choose_share"]

#: the worker shares (percent of the SMs) tried, smallest first
SHARE_LADDER: tuple[int, ...] = (10, 20, 30)


@dataclass(frozen=True)
class ShareChoice:
    """The chosen share and the figures behind it.

    Attributes:
        percent: the worker's share of the SMs.
        build_ms: the producer's median build time per batch under that share.
        step_ms: the training step's median time.
        keeps_pace: whether ``build_ms`` fits in the step (within the headroom); ``False``: no share of the ladder
            does, and ``percent`` is the fastest-building one.
    """

    percent: int
    build_ms: float
    step_ms: float
    keeps_pace: bool

    def summary(self) -> str:
        verdict = "keeps pace with" if self.keeps_pace else "cannot keep pace with (the data path bounds)"
        return (
            f"worker share {self.percent}%: a batch is built in {self.build_ms:.2f} ms, which {verdict} a "
            f"{self.step_ms:.2f} ms step"
        )


def choose_share(
    build_ms: Mapping[int, float], step_ms: float, ladder: Sequence[int] = SHARE_LADDER, headroom: float = 0.9
) -> ShareChoice:
    """The smallest share of ``ladder`` whose build time is at most ``headroom * step_ms``.

    Args:
        build_ms: median build time per batch (ms), by worker share (percent); shares of ``ladder`` that were not
            measured are skipped.
        step_ms: median training-step time (ms) on the same batches.
        ladder: shares to consider, in any order (tried smallest first).
        headroom: the share of the step the build may fill (below 1: step-to-step jitter must not stall the trainer).

    Raises:
        ValueError: no share of ``ladder`` was measured, a time is not positive, or ``headroom`` is not in (0, 1].
    """
    if not 0 < headroom <= 1:
        raise ValueError(f"`headroom` must be in (0, 1], got {headroom}")
    if not step_ms > 0:
        raise ValueError(f"`step_ms` must be > 0, got {step_ms}")
    measured = {int(p): float(build_ms[p]) for p in sorted(set(ladder)) if p in build_ms}
    if not measured:
        raise ValueError(f"no build time measured for any share of the ladder {sorted(set(ladder))}: got {dict(build_ms)}")
    bad = {p: t for p, t in measured.items() if not t > 0}
    if bad:
        raise ValueError(f"build times must be > 0 ms, got {bad}")
    for percent, t in measured.items():
        if t <= headroom * step_ms:
            return ShareChoice(percent, t, float(step_ms), keeps_pace=True)
    fastest = min(measured, key=lambda p: (measured[p], p))
    return ShareChoice(fastest, measured[fastest], float(step_ms), keeps_pace=False)


class ShareCalibrator:
    """Tries the shares of a ladder in turn on a running job and settles on the first that keeps pace.

    Each training step reports the producer's build time of its batch and the step's GPU time
    (:meth:`record`). After ``warmup`` steps under a share (its first batches include the worker's GPU placement),
    the medians of the next ``steps`` decide: a share whose build time fits in ``headroom`` of the step is kept;
    otherwise the next share of the ladder is tried; after the last, :func:`choose_share` over all that were
    measured picks the fastest-building one.

    Args:
        ladder: the shares to try, smallest first.
        warmup: steps skipped after each move.
        steps: steps measured per share.
        headroom: see :func:`choose_share`.
    """

    def __init__(self, ladder: Sequence[int] = SHARE_LADDER, warmup: int = 10, steps: int = 40, headroom: float = 0.9) -> None:
        if not ladder or list(ladder) != sorted(set(ladder)):
            raise ValueError(f"`ladder` must be increasing shares, got {list(ladder)}")
        if warmup < 0 or steps < 1:
            raise ValueError(f"`warmup` must be >= 0 and `steps` >= 1, got {warmup} and {steps}")
        self.ladder = tuple(int(p) for p in ladder)
        self.warmup, self.steps, self.headroom = int(warmup), int(steps), float(headroom)
        self.current = self.ladder[0]
        self.choice: Optional[ShareChoice] = None
        self._seen = 0
        self._build: list[float] = []
        self._step: list[float] = []
        self._measured: dict[int, tuple[float, float]] = {}  # share -> (median build ms, median step ms)

    @property
    def done(self) -> bool:
        return self.choice is not None

    @property
    def steps_needed(self) -> int:
        """Training steps a calibration may take at most: warm-up and measured steps under every share."""
        return (self.warmup + self.steps) * len(self.ladder)

    def unfinished(self) -> str:
        """What an unfinished calibration measured so far (for the message when training ends before it decides)."""
        measured = ", ".join(f"{p}%: build {b:.2f} ms vs step {s:.2f} ms" for p, (b, s) in self._measured.items())
        return (
            f"the share calibration did not finish (it needs up to {self.steps_needed} training steps; measured "
            f"{measured or 'no share yet'}); the worker kept {self.current}%"
        )

    def record(self, build_ms: float, step_ms: float) -> Optional[int]:
        """One step's figures under :attr:`current`; returns the share to move to now, else ``None``."""
        if self.done:
            return None
        self._seen += 1
        if self._seen <= self.warmup:
            return None
        self._build.append(float(build_ms))
        self._step.append(float(step_ms))
        if len(self._build) < self.steps:
            return None
        build, step = statistics.median(self._build), statistics.median(self._step)
        self._measured[self.current] = (build, step)
        index = self.ladder.index(self.current)
        if build <= self.headroom * step or index + 1 == len(self.ladder):
            best = choose_share({p: b for p, (b, _) in self._measured.items()}, step, self.ladder, self.headroom)
            self.choice = best
            if best.percent != self.current:
                self.current = best.percent
                return best.percent
            return None
        self.current = self.ladder[index + 1]
        self._seen, self._build, self._step = 0, [], []
        return self.current
