"""Which MPS share the pipeline worker needs: the smallest that builds a batch within the training step.

Under MPS the worker's share of the SMs is fixed when it creates its CUDA context (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
at spawn), and the trainer keeps the rest. Too small a share and the producer cannot keep pace (the trainer
stalls); too large and the producer's kernels take SMs the step could use. The rule: given the producer's median
build time per batch under each share of a ladder, measured side by side with the step time on the same batches,
take the smallest share whose build time fits in the step with some headroom; if none does, the share that builds
fastest, and say that the data path bounds the step.

The measurements come from ``benchmarks/pipeline.py`` (``worker_mps_X`` rows give the build time under X %, the
``model_only`` row the step time); its report prints this choice. A run cannot change a running worker's share, and
a new worker cannot map the DataModule's host memory once its names are unlinked after ``setup``: choosing at run
time needs a worker spawned per share while the names exist (see ``README.md``, "The pipeline callback and MPS").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = ["SHARE_LADDER", "ShareChoice", "choose_share"]

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
