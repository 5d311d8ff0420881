"""Where a batch build's time goes: the producer's stage split, timed without adding a host synchronization.

The producer splits each batch it builds into four stages:

* ``sample``: the sampler (on the GPU: its kernels, unique/relabel included, and its read-back), on the lookahead
  thread's stream (:class:`~.lookahead.Lookahead`). Its GPU time spans the sampler's size read-backs, so it also
  holds whatever the sampling thread waited for between its kernels: the GPU (in the worker, its kernels queue
  behind the producer's gather and cast on the same share), and the host (wake-ups, the interpreter lock). Beside
  it, the same sample's host (wall) time and the sampling thread's CPU time (``sample_host_s``, ``sample_cpu_s``):
  the difference is time the thread slept;
* ``gather``: the feature rows (the zero-copy gather reads them from host memory), and the bytes of those rows in
  the host table's dtype, so ``gather_bytes / gather_s`` is the gather's rate and ``gather_bytes`` over the PCIe
  bandwidth (:func:`~lightning_zerocopy.data.stage_bounds.h2d_bandwidth`) its bound;
* ``assemble``: the rest of the batch: labels, the id maps, edge features, the cast of ``x`` to the builder's
  ``x_dtype``, and the copies of the fields the builder did not write into the slot (``write_batch``);
* ``handover``: host time from the return of the producer's stream synchronization to its ``ready`` message sent
  (the synchronization itself returns when the work above is done: that wait is the GPU time of the stages above,
  not counted twice). The write of a message into the channel is timed once it returned, so it is counted in the
  next batch's hand-over.

On a CUDA producer ``sample``, ``gather`` and ``assemble`` are GPU times: CUDA timing events recorded on the stream
that does the work (the sampling stream, the producer's stream), reused from batch to batch, and read only after the
producer's stream synchronization that precedes ``ready`` anyway. By then they have all completed (the producer's
stream waited for the sample's end event before its gather), so reading them waits for nothing; an event that has
not completed is never waited for (the stage falls back to its host time). Without a CUDA stream (CPU slots) every
stage is a host time. A hybrid source's sample is the host time its dispatcher measured.

A source whose ``gather_batch`` takes no ``marks`` (the builders' hook, :class:`~lightning_zerocopy.data.assemble.StageMarks`)
has its whole ``gather_batch`` counted as ``gather``, with the bytes of the batch's ``x``; a source that only has
``build_batch`` reports no split.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

__all__ = [
    "STAGES",
    "BuildStages",
    "EventPairs",
    "SampleTime",
    "StageClock",
    "StageTotals",
    "elapsed_s",
    "h2d_bandwidth_or_none",
    "x_bytes",
]

#: the stages of a build, in order
STAGES: tuple[str, ...] = ("sample", "gather", "assemble", "handover")


@dataclass(frozen=True)
class BuildStages:
    """Where one batch's build went, in seconds per stage (see the module docstring), and what its gather moved.

    Attributes:
        sample_s, gather_s, assemble_s, handover_s: the stages' times.
        gather_bytes: bytes of the feature rows gathered, in the host table's dtype (rows served from a GPU cache
            included, so the bound below is an upper bound on the PCIe time with a cache).
        gather_bound_s: ``gather_bytes`` over the PCIe bandwidth measured in the producer's process (a contiguous
            pinned host-to-device copy); ``None`` without one (a CPU producer, or the measurement failed).
        gpu_times: whether ``sample_s``, ``gather_s`` and ``assemble_s`` are GPU times (CUDA events).
        sample_host_s, sample_cpu_s: the sample's host (wall) time on the thread that sampled it, and that thread's
            CPU time over it (``None`` where not measured: a sample timed by its stream boundaries, or a hybrid
            dispatcher's, which gives its host time only).
    """

    sample_s: float
    gather_s: float
    assemble_s: float
    handover_s: float
    gather_bytes: int = 0
    gather_bound_s: Optional[float] = None
    gpu_times: bool = False
    sample_host_s: Optional[float] = None
    sample_cpu_s: Optional[float] = None

    def seconds(self) -> dict[str, float]:
        """Seconds per stage, by name (:data:`STAGES`)."""
        return {stage: float(getattr(self, f"{stage}_s")) for stage in STAGES}

    @property
    def gather_GBps(self) -> Optional[float]:
        """Feature bytes gathered per second of the gather stage (``None`` when either is zero)."""
        return self.gather_bytes / self.gather_s * 1e-9 if self.gather_bytes > 0 and self.gather_s > 0 else None


@dataclass
class StageTotals:
    """Running sums of :class:`BuildStages` (``PipelineClient.stats.stages``), for benchmarks."""

    batches: int = 0
    sample_s: float = 0.0
    gather_s: float = 0.0
    assemble_s: float = 0.0
    handover_s: float = 0.0
    gather_bytes: int = 0
    #: the bound's sums over the batches that had one (bytes and seconds)
    bound_bytes: int = 0
    gather_bound_s: float = 0.0
    bound_batches: int = 0

    def add(self, stages: BuildStages) -> None:
        """Count one batch's stages."""
        self.batches += 1
        self.sample_s += stages.sample_s
        self.gather_s += stages.gather_s
        self.assemble_s += stages.assemble_s
        self.handover_s += stages.handover_s
        self.gather_bytes += int(stages.gather_bytes)
        if stages.gather_bound_s is not None:
            self.bound_bytes += int(stages.gather_bytes)
            self.gather_bound_s += stages.gather_bound_s
            self.bound_batches += 1

    def mean_ms(self) -> dict[str, float]:
        """Mean milliseconds per batch of each stage (:data:`STAGES`), plus ``"gather_bound"`` when measured."""
        if self.batches == 0:
            return {}
        out = {stage: 1e3 * getattr(self, f"{stage}_s") / self.batches for stage in STAGES}
        if self.bound_batches:
            out["gather_bound"] = 1e3 * self.gather_bound_s / self.bound_batches
        return out

    @property
    def gather_GBps(self) -> Optional[float]:
        """Feature bytes gathered over the gather stage's time, over every batch (``None`` before any)."""
        return self.gather_bytes / self.gather_s * 1e-9 if self.gather_bytes > 0 and self.gather_s > 0 else None

    @property
    def h2d_GBps(self) -> Optional[float]:
        """The PCIe bandwidth the bounds were computed with (``None`` without one)."""
        return self.bound_bytes / self.gather_bound_s * 1e-9 if self.gather_bound_s > 0 else None


def elapsed_s(start: Any, end: Any) -> Optional[float]:
    """Seconds from CUDA event ``start`` to ``end`` if both have completed, else ``None`` (never waits)."""
    try:
        if not (end.query() and start.query()):
            return None
        return float(start.elapsed_time(end)) / 1e3
    except RuntimeError:  # not recorded, or recorded in another context: no figure rather than a fault
        return None


class EventPairs:
    """A free list of ``(start, end)`` CUDA timing events: each sample takes a pair and gives it back once read,
    so sampling allocates no event in steady state (a pair that is never given back is simply dropped)."""

    def __init__(self) -> None:
        self._free: deque[tuple[Any, Any]] = deque()  # append/pop are atomic: taken on one thread, given on another

    def take(self) -> tuple[Any, Any]:
        try:
            return self._free.pop()
        except IndexError:
            return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def give_back(self, pair: tuple[Any, Any]) -> None:
        self._free.append(pair)

    def __len__(self) -> int:
        return len(self._free)


@dataclass
class SampleTime:
    """The time of one sample: host seconds, and on CUDA the timing events around its work on the sampling stream;
    ``cpu_s``: the CPU time of the thread that sampled, over the same span (``None`` where not measured).

    :meth:`seconds` reads the events once they have completed (the producer calls it after its stream
    synchronization) and gives them back to their pool.
    """

    host_s: float
    events: Optional[tuple[Any, Any]] = None
    pool: Optional[EventPairs] = field(default=None, repr=False)
    cpu_s: Optional[float] = None

    def seconds(self) -> float:
        """The sample's GPU time when its events have completed, else its host time (once: the events go back)."""
        events, self.events = self.events, None
        if events is None:
            return self.host_s
        value = elapsed_s(*events)
        if self.pool is not None:
            self.pool.give_back(events)
        return self.host_s if value is None else value

    def release(self) -> None:
        """Give the events back unread (re-recording them later is safe: a stream that waits on an event waits
        for the work the event tracked when the wait was queued)."""
        events, self.events = self.events, None
        if events is not None and self.pool is not None:
            self.pool.give_back(events)


class StageClock:
    """The boundaries of one batch's build on the producer's stream, and the bytes its gather read.

    One clock per loader of a producer, reused for each of its batches: on CUDA one timing event per boundary
    (recorded on ``stream``, read by :meth:`stages` after the producer synchronized that stream), else host times.
    A builder marks the end of its feature gather through :meth:`mark` (the
    :class:`~lightning_zerocopy.data.assemble.StageMarks` hook).

    Args:
        stream: the producer's CUDA stream, or ``None`` for host times.
    """

    BOUNDARIES = ("sample_start", "start", "gathered", "built", "write_start", "written")

    def __init__(self, stream: Optional[Any] = None) -> None:
        self._stream = stream
        self._events = None if stream is None else {b: torch.cuda.Event(enable_timing=True) for b in self.BOUNDARIES}
        self._host: dict[str, float] = {}
        self._recorded: set[str] = set()
        self.gather_bytes = 0
        #: the sample of the batch being built, when it was sampled on the lookahead thread or by a dispatcher
        self.sample: Optional[SampleTime] = None

    @property
    def split(self) -> bool:
        """Whether this batch was built in stages (a gather started), so :meth:`stages` has something to say."""
        return "start" in self._recorded

    @property
    def marked(self) -> bool:
        """Whether the builder marked the end of its feature gather (and counted its bytes)."""
        return "gathered" in self._recorded

    @property
    def gpu_times(self) -> bool:
        """Whether the boundaries are CUDA events (GPU times)."""
        return self._events is not None

    def begin(self) -> None:
        """Forget the previous batch (its boundaries, bytes and sample)."""
        self._recorded.clear()
        self._host.clear()
        self.gather_bytes = 0
        if self.sample is not None:  # a batch abandoned before its stages were read: its events go back unread
            self.sample.release()
        self.sample = None

    def record(self, boundary: str) -> None:
        """Record ``boundary`` (one of :attr:`BOUNDARIES`) now: an event on the stream, or the host time."""
        if self._events is not None:
            self._events[boundary].record(self._stream)
        else:
            self._host[boundary] = time.perf_counter()
        self._recorded.add(boundary)

    def mark(self, stage: str, nbytes: int = 0) -> None:
        """A builder's mark: ``"gather"`` ends the feature gather, which read ``nbytes`` bytes of feature rows."""
        if stage == "gather":
            self.record("gathered")
            self.gather_bytes += int(nbytes)

    def span(self, first: str, last: str) -> Optional[float]:
        """Seconds between two boundaries of this batch (``None`` if one was not recorded, or not complete)."""
        if first not in self._recorded or last not in self._recorded:
            return None
        if self._events is not None:
            return elapsed_s(self._events[first], self._events[last])
        return self._host[last] - self._host[first]

    def stages(self, handover_s: float, h2d_GBps: Optional[float], x_bytes: int = 0) -> BuildStages:
        """The batch's :class:`BuildStages` (call after the producer's stream synchronization).

        Args:
            handover_s: the hand-over's host time.
            h2d_GBps: the PCIe bandwidth for the gather's bound (``None``: no bound).
            x_bytes: the gather's bytes when the builder did not mark its gather (the batch's ``x``).
        """
        sample_host_s = sample_cpu_s = None
        if self.sample is not None:
            sample_s = self.sample.seconds()
            if self.sample.cpu_s is not None:  # the sampling thread measured both (a dispatcher's: host time only)
                sample_host_s, sample_cpu_s = self.sample.host_s, self.sample.cpu_s
            self.sample = None
        else:
            sample_s = self.span("sample_start", "start") or 0.0
        marked = self.marked
        nbytes = self.gather_bytes if marked else int(x_bytes)
        gather_s = self.span("start", "gathered" if marked else "built") or 0.0
        assemble_s = (self.span("gathered", "built") or 0.0) if marked else 0.0
        assemble_s += self.span("write_start", "written") or 0.0
        bound = nbytes / (h2d_GBps * 1e9) if h2d_GBps and nbytes > 0 else None
        return BuildStages(sample_s, gather_s, assemble_s, float(handover_s), nbytes, bound, self.gpu_times,
                           sample_host_s, sample_cpu_s)  # fmt: skip


def x_bytes(data: Any) -> int:
    """Bytes of a batch's ``x`` (0 without one): the gather's bytes for a source that does not mark its gather."""
    x = getattr(data, "x", None)
    return int(x.numel() * x.element_size()) if isinstance(x, torch.Tensor) else 0


def h2d_bandwidth_or_none(device: torch.device) -> Optional[float]:
    """The PCIe bandwidth for the gather's bound (measured once per process; ``None`` if it cannot be: telemetry
    never stops the producer)."""
    from lightning_zerocopy.data.stage_bounds import h2d_bandwidth

    try:
        return h2d_bandwidth(device)
    except Exception:  # noqa: BLE001 - no bound rather than no batches
        return None
