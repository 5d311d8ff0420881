"""Hybrid sampling: each batch is sampled on the device (CPU threads or the GPU) expected to finish it first.

The CPU and GPU samplers return bitwise the same sample for the same seeds and batch seed, so where a batch is
sampled changes nothing in the batch: this module only decides *where*.

* :class:`HybridPolicy` (pure, no threads): per device ("lane") a :class:`~.cost_model.LinearCostModel` and
  the batches queued on it. A batch goes to the lane whose backlog (predicted seconds still queued, minus what
  the running batch has already spent) plus its own predicted time is smallest. Uncalibrated lanes are tried
  first, and a lane left unused for ``explore_every`` batches is probed when it is idle, so its model does not go
  stale while the other device's load changes. ``mode="auto"`` keeps both lanes only if together they are
  measurably faster than the better one alone (see :meth:`HybridPolicy.decide_auto`). With ``prefer`` (e.g. the
  CPU, which takes no SMs from training) and a deadline per batch (when the consumer will need it), a batch goes
  to the preferred lane whenever that lane is expected to finish it in time, else to the earliest finish.
* :class:`HybridDispatcher`: one thread per lane runs the samples; results are taken back by key in whatever
  order the caller asks (the producer asks in batch order), a sampler's exception is re-raised in the taker. A
  probe of a stale lane is a *shadow* sample: the batch also runs on the idle stale lane, only to measure it, so
  a probe never delays a batch (the serial :meth:`HybridDispatcher.run` puts the batch itself there instead).
  On CUDA each lane samples on a stream of its own and :meth:`HybridDispatcher.take` makes the caller's
  current stream wait for it (an event, no host sync), as the single-lane lookahead does.

The clock is injectable, so tests run the policy against a fake clock and fake costs.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Literal, Optional, Sequence

import torch

from lightning_zerocopy.sampling.cost_model import LinearCostModel

__all__ = ["Dispatch", "HybridDispatcher", "HybridMode", "HybridPolicy", "HybridStats", "LaneStats"]

#: ``hybrid``: every lane keeps sampling; ``auto``: after calibration keep both lanes only where that is faster.
HybridMode = Literal["hybrid", "auto"]


@dataclass(frozen=True)
class Dispatch:
    """Where one batch was sampled: its lane, its expected size, the predicted and measured seconds."""

    key: Hashable
    lane: str
    size: float
    predicted_s: float
    measured_s: float


@dataclass
class LaneStats:
    """Totals of one lane (for telemetry): batches sampled there, predicted and measured seconds."""

    batches: int = 0
    predicted_s: float = 0.0
    measured_s: float = 0.0


@dataclass
class HybridStats:
    """Per-lane totals, the last dispatch, and the ``auto`` decision (``None`` until made)."""

    lanes: dict[str, LaneStats] = field(default_factory=dict)
    last: Optional[Dispatch] = None
    probes: int = 0  # shadow samples run only to measure an idle lane (not counted in ``lanes``)
    auto_choice: Optional[tuple[str, ...]] = None

    def record(self, dispatch: Dispatch) -> None:
        """Count one measured batch (e.g. a record that crossed from a pipeline worker)."""
        stats = self.lanes.setdefault(dispatch.lane, LaneStats())
        stats.batches += 1
        stats.predicted_s += dispatch.predicted_s
        stats.measured_s += dispatch.measured_s
        self.last = dispatch

    def share(self, lane: str) -> float:
        """Fraction of the measured batches that ``lane`` sampled (0 when none were)."""
        total = sum(s.batches for s in self.lanes.values())
        return self.lanes[lane].batches / total if total and lane in self.lanes else 0.0


@dataclass
class _Pending:
    predicted_s: float
    started_at: Optional[float] = None


@dataclass
class _Lane:
    name: str
    model: LinearCostModel
    pending: dict = field(default_factory=dict)  # key -> _Pending
    last_dispatch: int = -1
    skip: int = 0  # first measurements not fed to the model (warm-up: lazy setup, kernel loading)
    enabled: bool = True


class HybridPolicy:
    """Chooses a lane per batch from per-lane linear cost models and queues (not thread-safe; see the dispatcher).

    Args:
        lanes: lane names, e.g. ``("cpu", "gpu")``; the first is the fallback of ties.
        mode: ``"hybrid"`` or ``"auto"`` (module docstring).
        forgetting: the cost models' forgetting factor (see :class:`LinearCostModel`).
        explore_every: an idle lane unused for this many dispatches gets the next batch (keeps its model fresh).
        warmup: measurements per lane dropped before the model is fed (the first call pays one-time setup).
        auto_after: measured batches (all lanes calibrated) before ``auto`` decides.
        auto_margin: ``auto`` keeps every lane if their summed rates beat the best single lane by this fraction.
        prefer: a lane that gets a batch whenever it is expected to finish it before the batch's deadline (see
            :meth:`choose`); ``None``: always the earliest finish.
    """

    def __init__(
        self,
        lanes: Sequence[str],
        mode: HybridMode = "hybrid",
        forgetting: float = 0.9,
        explore_every: int = 32,
        warmup: int = 1,
        auto_after: int = 64,
        auto_margin: float = 0.1,
        prefer: Optional[str] = None,
    ) -> None:
        names = list(lanes)
        if prefer is not None and prefer not in names:
            raise ValueError(f"`prefer` must be one of the lanes {names!r}, got {prefer!r}")
        self.prefer = prefer
        if not names or len(set(names)) != len(names):
            raise ValueError(f"`lanes` must be distinct lane names, got {names!r}")
        if mode not in ("hybrid", "auto"):
            raise ValueError(f"`mode` must be 'hybrid' or 'auto', got {mode!r}")
        if explore_every < 1 or warmup < 0 or auto_after < 1 or auto_margin < 0:
            raise ValueError("`explore_every` and `auto_after` must be >= 1, `warmup` and `auto_margin` >= 0")
        self.mode: HybridMode = mode
        self.explore_every = int(explore_every)
        self.auto_after = int(auto_after)
        self.auto_margin = float(auto_margin)
        self._lanes = {n: _Lane(n, LinearCostModel(forgetting=forgetting), skip=int(warmup)) for n in names}
        self._dispatched = 0
        self._measured = 0
        self._mean_size: Optional[float] = None
        self.stats = HybridStats(lanes={n: LaneStats() for n in names})

    @property
    def lanes(self) -> list[str]:
        """Lane names, in the given order."""
        return list(self._lanes)

    @property
    def active_lanes(self) -> list[str]:
        """Lanes that still get batches (all, unless ``auto`` dropped some)."""
        return [n for n, lane in self._lanes.items() if lane.enabled]

    def model(self, lane: str) -> LinearCostModel:
        """The cost model of ``lane``."""
        return self._lanes[lane].model

    def backlog(self, lane: str, now: float) -> float:
        """Predicted seconds until ``lane`` has finished everything queued on it."""
        total = 0.0
        for p in self._lanes[lane].pending.values():
            spent = 0.0 if p.started_at is None else max(now - p.started_at, 0.0)
            total += max(p.predicted_s - spent, 0.0)
        return total

    def choose(self, size: float, now: float, deadline: Optional[float] = None, explore: bool = True) -> str:
        """The lane for a batch of expected ``size`` at time ``now``.

        Args:
            deadline: when the batch will be needed (same clock as ``now``); with ``prefer`` set, the preferred
                lane gets the batch if it is expected to finish by then.
            explore: put the batch itself on a stale idle lane (serial use); a dispatcher that probes with
                shadow samples (:meth:`stale_lane`) passes ``False``.
        """
        active = [self._lanes[n] for n in self.active_lanes]
        cold = [lane for lane in active if not lane.model.calibrated]
        if cold:  # calibrate first: an idle cold lane, else the cold lane with the least queued
            return min(cold, key=lambda lane: (len(lane.pending) > 0, len(lane.pending))).name
        if explore:
            stale = self.stale_lane()
            if stale is not None:
                return stale
        finish = {lane.name: self.backlog(lane.name, now) + lane.model.predict(size) for lane in active}
        if self.prefer in finish and deadline is not None and now + finish[self.prefer] <= deadline:
            return self.prefer
        return min(finish, key=lambda name: finish[name])

    def stale_lane(self, exclude: Optional[str] = None) -> Optional[str]:
        """An idle, calibrated lane not used for ``explore_every`` dispatches (the longest unused), if any."""
        active = [self._lanes[n] for n in self.active_lanes]
        if len(active) < 2:
            return None
        stale = [lane for lane in active if lane.name != exclude and not lane.pending and lane.model.calibrated
                 and self._dispatched - lane.last_dispatch >= self.explore_every]  # fmt: skip
        return min(stale, key=lambda lane: lane.last_dispatch).name if stale else None

    def dispatched(self, lane: str, key: Hashable, size: float) -> float:
        """Record that batch ``key`` was queued on ``lane``; returns its predicted seconds."""
        state = self._lanes[lane]
        predicted = state.model.predict(size)
        state.pending[key] = _Pending(predicted)
        state.last_dispatch = self._dispatched
        self._dispatched += 1
        return predicted

    def started(self, lane: str, key: Hashable, now: float) -> None:
        """Batch ``key`` started running on ``lane`` at ``now``."""
        pending = self._lanes[lane].pending.get(key)
        if pending is not None:
            pending.started_at = now

    def finished(
        self, lane: str, key: Hashable, size: float, seconds: Optional[float], probe: bool = False
    ) -> Optional[Dispatch]:
        """Batch ``key`` left ``lane``; ``seconds`` is its measured time, ``None`` if it failed. Feeds the model.
        A ``probe`` (shadow sample) calibrates the lane but is not counted as a batch of it."""
        state = self._lanes[lane]
        pending = state.pending.pop(key, None)
        if seconds is None or pending is None:
            return None
        record = Dispatch(key, lane, float(size), pending.predicted_s, float(seconds))
        if probe:
            self.stats.probes += 1
        else:
            self.stats.record(record)
        if state.skip > 0:
            state.skip -= 1
            return record
        state.model.observe(size, seconds)
        self._measured += 1
        self._mean_size = float(size) if self._mean_size is None else 0.9 * self._mean_size + 0.1 * float(size)
        if self.mode == "auto" and self.stats.auto_choice is None and self._measured >= self.auto_after:
            self.decide_auto()
        return record

    def decide_auto(self) -> Optional[tuple[str, ...]]:
        """``auto``'s choice, once every lane is calibrated: all lanes if the sum of their rates (batches per
        second at the mean batch size, as measured while sharing the machine) beats the best lane's rate by
        ``auto_margin``, else the best lane alone. Returns the kept lanes (``None``: not decidable yet)."""
        lanes = list(self._lanes.values())
        if self._mean_size is None or not all(lane.model.calibrated for lane in lanes):
            return None
        rates = {lane.name: 1.0 / lane.model.predict(self._mean_size) for lane in lanes}
        best = max(rates, key=lambda n: rates[n])
        keep = tuple(rates) if sum(rates.values()) >= (1.0 + self.auto_margin) * rates[best] else (best,)
        for lane in lanes:
            lane.enabled = lane.name in keep
        self.stats.auto_choice = keep
        return keep


class HybridDispatcher:
    """Runs samples on per-lane threads as :class:`HybridPolicy` places them; results are taken by key.

    Args:
        policy: the placement policy (its lanes name the threads).
        make_stream: ``make_stream(lane)`` is called once on a lane's thread to create the CUDA stream it samples
            on, or ``None`` to sample without streams.
        clock: seconds, monotonic (injectable for tests).
    """

    def __init__(
        self,
        policy: HybridPolicy,
        make_stream: Optional[Callable[[str], Any]] = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.policy = policy
        self._make_stream = make_stream
        self._clock = clock
        self._lock = threading.Lock()
        self._executors = {
            lane: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lzc-sampler-{lane}") for lane in policy.lanes
        }
        self._streams: dict[str, Any] = {}
        self._futures: dict[Hashable, tuple[str, Future]] = {}

    @property
    def stats(self) -> HybridStats:
        """The policy's per-lane totals and last dispatch."""
        return self.policy.stats

    def __contains__(self, key: Hashable) -> bool:
        return key in self._futures

    def submit(self, key: Hashable, size: float, sample: Callable[[str], Any], deadline_s: Optional[float] = None) -> str:
        """Queue ``sample(lane)`` for batch ``key`` (expected ``size``) on the chosen lane; returns the lane.

        Args:
            deadline_s: seconds from now until the caller will take the batch (for a policy with ``prefer``).
        """
        if key in self._futures:
            raise ValueError(f"batch {key!r} is already queued")
        with self._lock:
            now = self._clock()
            deadline = None if deadline_s is None else now + deadline_s
            lane = self.policy.choose(size, now, deadline=deadline, explore=False)
            self.policy.dispatched(lane, key, size)
            probe = self.policy.stale_lane(exclude=lane)
            if probe is not None:
                self.policy.dispatched(probe, _Probe(key), size)
        future = self._executors[lane].submit(self._run, lane, key, size, sample)
        self._futures[key] = (lane, future)
        if probe is not None:  # a shadow sample on the idle stale lane: measured, then dropped
            self._executors[probe].submit(self._run, probe, _Probe(key), size, sample)
        return lane

    def take(self, key: Hashable) -> tuple[Any, Optional[Dispatch]]:
        """The sample of batch ``key`` (submitted before) and its dispatch record; re-raises the sampler's
        exception. On CUDA the caller's current stream waits for the lane's stream (no host sync)."""
        entry = self._futures.pop(key, None)
        if entry is None:
            raise KeyError(f"batch {key!r} was not submitted")
        result, event, record = entry[1].result()
        if event is not None:
            event.wait()
        return result, record

    def run(self, key: Hashable, size: float, sample: Callable[[str], Any]) -> tuple[Any, Optional[Dispatch]]:
        """Choose a lane and run ``sample(lane)`` on the calling thread (serial use, e.g. without a pipeline)."""
        with self._lock:
            lane = self.policy.choose(size, self._clock())
            self.policy.dispatched(lane, key, size)
        result, _, record = self._measure(lane, key, size, sample, stream=None)
        return result, record

    def drop(self, where: Optional[Callable[[Hashable], bool]] = None) -> None:
        """Forget the queued batches whose key satisfies ``where`` (default: all), e.g. those of an abandoned
        iteration; a sample already running finishes unread (and still calibrates its lane)."""
        keys = [key for key in self._futures if where is None or where(key)]
        for key in keys:
            lane, future = self._futures.pop(key)
            if future.cancel():  # never started: take it off the lane's predicted backlog
                with self._lock:
                    self.policy.finished(lane, key, 0.0, None)

    def close(self) -> None:
        """Drop queued work and stop the lane threads (waits for samples in progress)."""
        self.drop()
        for executor in self._executors.values():
            executor.shutdown(wait=True, cancel_futures=True)

    def _run(self, lane: str, key: Hashable, size: float, sample: Callable[[str], Any]) -> tuple[Any, Any, Any]:
        if isinstance(key, _Probe):
            try:
                return self._run_on_stream(lane, key, size, sample)
            except Exception:  # noqa: BLE001 - a probe only measures; the batch itself reports its errors
                return None, None, None
        return self._run_on_stream(lane, key, size, sample)

    def _run_on_stream(self, lane: str, key: Hashable, size: float, sample: Callable[[str], Any]) -> tuple[Any, Any, Any]:
        stream = None
        if self._make_stream is not None:
            stream = self._streams.get(lane)
            if stream is None:
                stream = self._streams[lane] = self._make_stream(lane)
        return self._measure(lane, key, size, sample, stream)

    def _measure(self, lane: str, key: Hashable, size: float, sample: Callable[[str], Any], stream: Any) -> tuple[Any, Any, Any]:
        with self._lock:
            start = self._clock()
            self.policy.started(lane, key, start)
        try:
            event = None
            if stream is None:
                result = sample(lane)
            else:
                with torch.cuda.device(stream.device), torch.cuda.stream(stream):
                    result = sample(lane)
                    event = torch.cuda.Event()
                    event.record(stream)
                    event.synchronize()  # the measured time is the device's, not the launch's
        except BaseException:
            with self._lock:
                self.policy.finished(lane, key, size, None)
            raise
        with self._lock:
            record = self.policy.finished(lane, key, size, self._clock() - start, probe=isinstance(key, _Probe))
        return result, event, record


@dataclass(frozen=True)
class _Probe:
    """The key of a shadow sample of batch ``key``."""

    key: Hashable
