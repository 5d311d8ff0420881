"""The producer side of the pipeline: builds batches into slots it was handed, one stage at a time.

The same loop runs in a worker process (:mod:`.worker`) or in a thread of the trainer (:mod:`.in_process`);
only the channel differs. The protocol is a handful of small tuples; tensors cross it only when slots are
(re)allocated.

Trainer → producer::

    ("source", stage, source | pickled source)     register/replace the BatchSource of a stage (opened at once)
    ("start", stage, gen, epoch, start, stop)      produce steps [start, stop) of epoch; every slot is free
    ("free", stage, gen, slot)                     the trainer is done with slot (its GPU work on it has run)
    ("end", stage, gen)                            iteration abandoned: stop producing for it
    ("slots", stage, index | None, buffers)
                                                   the whole ring (index None) or one regrown slot
    ("stop",)                                      exit

Producer → trainer::

    ("opened", stage)                              the source is registered and opened
    ("layout", stage, gen, layout, sizes)          first batch built: please allocate the ring
    ("grow", stage, gen, slot, sizes)              batch does not fit slot: please grow it
    ("ready", stage, gen, slot, step, sizes, scalars, build_s, dispatch, stages)
                                                   dispatch: where a hybrid source sampled the batch
                                                   (a :class:`~lightning_zerocopy.sampling.Dispatch`), else None;
                                                   stages: where the build's time went (a
                                                   :class:`~.stage_times.BuildStages`), None for a source
                                                   that only has ``build_batch``
    ("cache", stage, (local, peer, host, row_bytes, per_plan))
                                                   worker process only: its feature caches' cumulative row counts
    ("error", stage, gen, traceback_text)

Three stages: with a two-stage source (``sample_batch`` / ``gather_batch``, see :func:`.source.two_stage`) the
producer samples batch ``t + 2`` on a thread of its own (:class:`.lookahead.Lookahead`) while it gathers batch
``t + 1`` into a slot and the trainer trains on batch ``t``.

Stage split (:mod:`.stage_times`): the producer times each batch's sample, gather, assemble and hand-over (GPU
times from CUDA events on the streams that do the work, read after the stream synchronization that precedes
``ready``; host times on the CPU) and sends them with ``ready``, with the gather's bytes and its bound: those bytes
over the PCIe bandwidth it measured once at start (:func:`~lightning_zerocopy.data.stage_bounds.h2d_bandwidth`). The
bookkeeping reuses its events from batch to batch (a handful per loader and a small pool on the sampling thread).

Hybrid sampling (:mod:`.hybrid_ahead`): a two-stage source whose ``hybrid_policy()`` returns a policy is sampled
through a :class:`~lightning_zerocopy.sampling.HybridDispatcher` instead, ``hybrid_depth`` batches ahead on several
devices (:class:`~.hybrid_ahead.HybridAhead`).

On CUDA the producer writes on a stream of its own and synchronizes it before announcing ``ready``, so a
ready slot's contents are complete for any stream of any process. The trainer announces ``free`` only once
the GPU work it queued on the slot (the step's forward and backward) has finished, which it learns from a
local CUDA event it polls. Neither side ever touches a slot the other owns, and no interprocess CUDA events
are needed (those are backed by files in ``/dev/shm`` that the driver can leave behind).

Feature-cache counters (``report_cache``, set by the worker process; :mod:`.cache_report`): the producer sends the
row counts of the feature caches open in its process in a ``cache`` message ahead of an iteration's last ``ready``
(and every :data:`~.cache_report.CACHE_REPORT_EVERY` batches), read where it synchronizes its stream anyway.
The channel's types are in :mod:`.channel`.
"""

from __future__ import annotations

import pickle
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from lightning_zerocopy.pipeline.cache_report import CACHE_REPORT_EVERY, CacheReport
from lightning_zerocopy.pipeline.channel import Channel, ChannelClosed
from lightning_zerocopy.pipeline.host_waits import wait_event
from lightning_zerocopy.pipeline.hybrid_ahead import HybridAhead
from lightning_zerocopy.pipeline.lookahead import Lookahead
from lightning_zerocopy.sampling.hybrid import Dispatch
from lightning_zerocopy.pipeline.slots import SlotLayout, write_batch
from lightning_zerocopy.pipeline.source import field_levels, takes_marks, two_stage
from lightning_zerocopy.pipeline.stage_times import SampleTime, StageClock, h2d_bandwidth_or_none, x_bytes
from lightning_zerocopy.pipeline.worker_profile import WorkerProfile, profile_spec


@dataclass
class _Stage:
    source: Any = None
    layout: Optional[SlotLayout] = None
    buffers: list[dict[str, torch.Tensor]] = field(default_factory=list)
    free: deque = field(default_factory=deque)
    gen: Optional[int] = None
    epoch: int = 0
    next_step: int = 0
    stop: int = 0
    order: int = 0
    waiting: bool = False
    pending: Optional[tuple] = None  # (gen, step, data, sizes, build_s, sample)
    hybrid: Optional[bool] = None  # whether the source is sampled through the hybrid dispatcher (decided once)
    dispatch: Optional[Dispatch] = None  # where the batch being produced was sampled (hybrid only)
    clock: Optional[StageClock] = None  # the stage boundaries of the batch being produced (events reused)
    marks: Optional[bool] = None  # whether the source's gather_batch takes the clock as `marks` (decided once)

    def has_work(self) -> bool:
        if self.gen is None or self.waiting or self.next_step >= self.stop:
            return False
        return self.pending is not None or self.layout is None or bool(self.free)


def _fits(layout: SlotLayout, buffers: dict[str, torch.Tensor], sizes: dict[str, int]) -> bool:
    return all(sizes[f.axis] <= f.capacity(buffers[f.name]) for f in layout.fields)


class Producer:
    """Builds the batches the trainer asks for into the slots it shares.

    Args:
        channel: the producer's end of the channel.
        device: ``None`` for CPU slots, or the CUDA device the slots live on (the producer then writes on a
            side stream of its own).
        lookahead: sample the next batch on a thread of its own while gathering the current one (two-stage
            sources only; without it a two-stage source samples, then gathers, each batch on the producer's
            thread; other sources build each batch in one call).
        sm_share: a :class:`~.sm_share.GreenShare` whose streams the producer gathers and samples on, confining
            its kernels to a share of the SMs; ``None``: ordinary side streams.
        hybrid_depth: batches a hybrid source keeps sampled ahead of the one being gathered (split between the
            devices by the dispatcher).
        report_cache: send the trainer the row counters of the feature caches open in this process (a worker
            process; see the module docstring).
    """

    def __init__(
        self,
        channel: Channel,
        device: Optional[torch.device] = None,
        lookahead: bool = True,
        sm_share: Optional[Any] = None,
        hybrid_depth: int = 4,
        report_cache: bool = False,
    ) -> None:
        if hybrid_depth < 1:
            raise ValueError(f"`hybrid_depth` must be >= 1, got {hybrid_depth}")
        self.channel = channel
        self.hybrid_depth = int(hybrid_depth)
        self._hybrid = HybridAhead(self.hybrid_depth)  # a hybrid source's batches sampled ahead
        self.device = device
        self.lookahead = lookahead
        self._cache_report = CacheReport(report_cache, self._send)
        self.stages: dict[str, _Stage] = {}
        self._order = 0
        self._sm_share = sm_share
        self._stream = None
        self._synced: Any = None  # the event the host waits on for the stream's work (.host_waits: it sleeps)
        self._sampler: Optional[Lookahead] = None
        self._h2d_GBps: Optional[float] = None  # the PCIe bandwidth the gather's bound divides by (CUDA only)
        self._last_send_s = 0.0  # how long the previous `ready` took to send (counted in the next hand-over)
        from lightning_zerocopy.data.resources import ResourceScope

        #: the data path's GPU resources this producer's sources open with (one per host memory and device)
        self._scope = ResourceScope()
        self._profile = WorkerProfile(profile_spec())  # a window of torch.profiler when the environment asks

    @property
    def report_cache(self) -> bool:
        """Whether this producer reports its process's feature-cache counters (:mod:`.cache_report`)."""
        return self._cache_report.enabled

    # ---- main loop -------------------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve commands until ``("stop",)`` or until the trainer's end of the channel closes."""
        make_stream = None
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            share, device = self._sm_share, self.device
            make_stream = share.stream if share is not None else (lambda: torch.cuda.Stream(device))
            self._stream = make_stream()
            self._synced = wait_event()
            self._h2d_GBps = h2d_bandwidth_or_none(self.device)
        self._hybrid.make_stream = make_stream
        self._sampler = Lookahead(make_stream)
        closed = False
        try:
            while True:
                stage = self._pick()
                if stage is None:
                    if not self._handle(self.channel.recv()):
                        return
                    continue
                while self.channel.poll():  # commands first: a 'start'/'end' can change what to do
                    if not self._handle(self.channel.recv()):
                        return
                stage = self._pick()
                if stage is not None:
                    self._produce(stage)
        except ChannelClosed:
            closed = True
            return
        finally:
            try:
                self._close()
            except Exception:
                # the trainer is gone (it died, or another rank's death took GPU memory this process read, which
                # leaves the CUDA context broken): nobody needs these resources any more and the process exits
                if not closed:
                    raise

    def _close(self) -> None:
        # the slots first: closing sources and caches below can take seconds (host unregistration), and a worker the
        # trainer terminates meanwhile would never free them (see .worker._release_slots)
        self._release_slots_quietly()
        self._profile.close()
        self._sampler.close()
        self._hybrid.close()
        for st in self.stages.values():
            if hasattr(st.source, "close"):
                st.source.close()
        self._scope.close()  # GPU copies, caches and host registrations of this producer

    def release_slots(self) -> None:
        """Forget every slot buffer and any batch built into one (when :meth:`run` ends; a worker process calls it
        again before it exits, see :func:`.worker._release_slots`). Work still queued on the producer's stream may
        write into a slot: it is waited for first, so the trainer may reuse the memory once this returned."""
        if self._stream is not None:
            self._stream.synchronize()
        for st in self.stages.values():
            st.buffers = []
            st.free.clear()
            st.pending = None

    def _release_slots_quietly(self) -> None:
        try:
            self.release_slots()
        except Exception:  # noqa: BLE001 - a failed GPU sync here is reported by the work that failed
            pass

    def _pick(self) -> Optional[str]:
        best, best_order = None, -1
        for name, st in self.stages.items():
            if st.has_work() and st.order > best_order:
                best, best_order = name, st.order
        return best

    # ---- commands --------------------------------------------------------------------------------------------
    def _handle(self, msg: tuple) -> bool:
        kind = msg[0]
        if kind == "stop":
            return False
        stage = self.stages.setdefault(msg[1], _Stage())
        if kind == "source":
            try:
                stage.source = pickle.loads(msg[2]) if isinstance(msg[2], bytes) else msg[2]
                stage.hybrid = stage.marks = None  # decided again for the new source
                if hasattr(stage.source, "open"):
                    stage.source.open(self._scope)  # map the shared host memory now, while its names still exist
            except Exception:  # noqa: BLE001 - reported to the trainer, which raises it
                self._send(("error", msg[1], None, traceback.format_exc()))
            else:
                self._send(("opened", msg[1]))
        elif kind == "start":
            _, _, gen, epoch, start, stop = msg
            self._order += 1
            stage.gen, stage.epoch, stage.next_step, stage.stop = gen, epoch, start, stop
            stage.order = self._order
            stage.free = deque(range(len(stage.buffers)))
            self._hybrid.drop(msg[1], keep_gen=gen)
            if stage.pending is not None and stage.pending[0] != gen:
                stage.pending = None
        elif kind == "free":
            _, _, gen, slot = msg
            if gen == stage.gen:
                stage.free.append(slot)
        elif kind == "end":
            if msg[2] == stage.gen:
                if stage.next_step < stage.stop:  # abandoned early: its last batch did not report
                    self._cache_report.report_quietly(msg[1], self._stream)
                stage.gen = None
                stage.pending = None
                self._hybrid.drop(msg[1])
        elif kind == "slots":
            _, _, index, buffers = msg
            if index is None:
                stage.buffers = list(buffers)
                stage.free = deque(range(len(stage.buffers)))
            else:
                stage.buffers[index] = buffers
            stage.waiting = False
        else:
            raise ValueError(f"pipeline producer got an unknown command {kind!r}")
        return True

    # ---- producing -------------------------------------------------------------------------------------------
    def _produce(self, name: str) -> None:
        self._profile.before_batch()  # LIGHTNING_ZEROCOPY_WORKER_PROFILE's window (.worker_profile)
        st = self.stages[name]
        gen = st.gen
        try:
            if self._stream is not None:
                with torch.cuda.stream(self._stream):
                    self._produce_on_stream(name, st)
            else:
                self._produce_on_stream(name, st)
        except ChannelClosed:
            raise
        except Exception:  # noqa: BLE001 - any builder failure is reported to the trainer, which raises it
            st.gen, st.pending = None, None
            self._hybrid.drop(name)
            self._send(("error", name, gen, traceback.format_exc()))

    def _produce_on_stream(self, name: str, st: _Stage) -> None:
        if st.clock is None:
            st.clock = StageClock(self._stream)
        clock = st.clock
        if st.pending is not None:
            _, step, data, sizes, build_s, sample = st.pending
            st.pending = None
            slot = st.free[0]
        else:
            step = st.next_step
            slot = st.free[0] if st.free else None
            out = None if slot is None else st.buffers[slot]
            data, build_s, sample = self._build(name, st, step, out, clock)
            if st.layout is None:
                st.layout = SlotLayout.from_batch(data, field_levels(st.source))
                sizes = st.layout.sizes(data)
                st.pending, st.waiting = (st.gen, step, data, sizes, build_s, sample), True
                self._send(("layout", name, st.gen, st.layout, sizes))
                return
            sizes = st.layout.sizes(data)
            if slot is None:  # cannot happen with has_work(), kept for clarity of the invariant
                raise RuntimeError("pipeline producer built a batch without a free slot")
        buffers = st.buffers[slot]
        if not _fits(st.layout, buffers, sizes):
            st.pending, st.waiting = (st.gen, step, data, sizes, build_s, sample), True
            self._send(("grow", name, st.gen, slot, sizes))
            return
        t0 = time.perf_counter()
        clock.record("write_start")
        write_batch(st.layout, buffers, data, sizes)
        clock.record("written")
        if self._stream is not None:  # the slot is complete before it is announced (and build_s is real)
            self._synced.record(self._stream)
            self._synced.synchronize()
        synced = time.perf_counter()
        build_s += synced - t0
        scalars = st.layout.scalars(data)
        gather_bytes = x_bytes(data) if clock.split and not clock.marked else 0
        # only now, with this stream synchronized, may the sample's memory go back to the allocator: it was allocated
        # on the sampling thread's stream, whose next sample would otherwise reuse it while the gather still read it
        del data, sample
        st.free.popleft()
        st.next_step = step + 1
        dispatch, st.dispatch = st.dispatch, None
        if st.next_step == st.stop or st.next_step % CACHE_REPORT_EVERY == 0:
            self._cache_report.report(name)  # right after the stream synchronized: the counters are complete
        stages = None
        if clock.split:  # read now: every event of the batch has completed (the stream synchronized above)
            stages = clock.stages(time.perf_counter() - synced + self._last_send_s, self._h2d_GBps, gather_bytes)
        sent = time.perf_counter()
        self._send(("ready", name, st.gen, slot, step, sizes, scalars, build_s, dispatch, stages))
        self._last_send_s = time.perf_counter() - sent

    def _build(
        self, name: str, st: _Stage, step: int, out: Optional[dict[str, torch.Tensor]], clock: StageClock
    ) -> tuple[Any, float, Any]:
        """Build batch ``step`` of a stage into ``out``; returns it, the seconds its sampling and gather took and
        its sample (``None`` for a one-stage source), which the caller keeps until its stream has synchronized.

        A two-stage source is sampled on the lookahead thread (batch ``step`` was usually sampled there while
        the previous batch was gathered) and the sample of ``step + 1`` is started before this gather; without
        lookahead it is sampled, then gathered, on this thread. ``clock`` gets the stage boundaries.
        """
        source = st.source
        clock.begin()
        if not two_stage(source):
            t0 = time.perf_counter()
            data = source.build_batch(source.plan(st.epoch, step), out=out)
            return data, time.perf_counter() - t0, None
        if not self.lookahead:
            t0 = time.perf_counter()
            clock.record("sample_start")
            sampled = source.sample_batch(source.plan(st.epoch, step))
            data = self._gather(st, sampled, out, clock)
            return data, time.perf_counter() - t0, sampled
        if self._hybrid.uses(st):
            return self._build_hybrid(name, st, step, out, clock)
        assert self._sampler is not None
        epoch = st.epoch
        sampled, timing = self._sampler.take_timed((name, st.gen, step), lambda: source.sample_batch(source.plan(epoch, step)))
        clock.sample = timing
        if step + 1 < st.stop:
            self._sampler.submit((name, st.gen, step + 1), lambda: source.sample_batch(source.plan(epoch, step + 1)))
        t0 = time.perf_counter()
        data = self._gather(st, sampled, out, clock)
        return data, timing.host_s + time.perf_counter() - t0, sampled

    def _gather(self, st: _Stage, sampled: Any, out: Optional[dict[str, torch.Tensor]], clock: StageClock) -> Any:
        """``source.gather_batch(sampled, out)`` between the clock's ``start`` and ``built`` boundaries, handing the
        clock to a source that marks the end of its feature gather."""
        source = st.source
        if st.marks is None:
            st.marks = takes_marks(source.gather_batch)
        clock.record("start")
        data = source.gather_batch(sampled, out=out, marks=clock) if st.marks else source.gather_batch(sampled, out=out)
        clock.record("built")
        return data

    def _build_hybrid(
        self, name: str, st: _Stage, step: int, out: Optional[dict[str, torch.Tensor]], clock: StageClock
    ) -> tuple[Any, float, Any]:
        """:meth:`_build` of a hybrid source: batch ``step`` taken from :class:`~.hybrid_ahead.HybridAhead`, then
        gathered."""
        sampled, sample_s = self._hybrid.take(name, st, step)
        clock.sample = SampleTime(sample_s)  # the dispatcher's measured (host) time
        t0 = time.perf_counter()
        data = self._gather(st, sampled, out, clock)
        return data, sample_s + time.perf_counter() - t0, sampled

    def _send(self, msg: tuple) -> None:
        try:
            self.channel.send(msg)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError) as exc:
            raise ChannelClosed() from exc

