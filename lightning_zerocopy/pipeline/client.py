"""The trainer side of the pipeline: owns the slot rings, hands slots out as batches and takes them back.

:class:`PipelineClient` speaks the protocol of :mod:`.producer` over a *transport* (a worker process,
:mod:`.worker`, or a thread, :mod:`.in_process`). A batch handed to the trainer is a ``Data`` of views into a
slot; the slot goes back to the producer only when the trainer asks for the next batch of that loader, i.e.
after the training step that used it (forward, backward, optimizer) was issued, and on CUDA only once that
work has run: a local event recorded on the trainer's stream is polled, and ``free`` is sent when it has
completed.
"""

from __future__ import annotations

import math
import pickle
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Protocol

import torch
from torch_geometric.data import Data

from lightning_zerocopy.options import check_depth
from lightning_zerocopy.pipeline.batch_timeout import BatchTimeout, process_state
from lightning_zerocopy.pipeline.host_waits import wait_event
from lightning_zerocopy.pipeline.slots import HETERO_TYPES, SlotLayout, SlotRing, unflatten_hetero
from lightning_zerocopy.pipeline.source import BatchSource, capacity_hint
from lightning_zerocopy.pipeline.stage_times import BuildStages, StageTotals
from lightning_zerocopy.sampling.hybrid.policy import HybridStats


class PipelineError(RuntimeError):
    """The pipeline's producer failed, died, or did not answer in time."""


class Transport(Protocol):
    """How the trainer reaches its producer."""

    #: True when the producer runs in another process (slots and sources are then shared/pickled).
    interprocess: bool

    def send(self, msg: tuple) -> None: ...

    def recv(self, timeout: float) -> Optional[tuple]:
        """The next message, or ``None`` after ``timeout`` seconds."""
        ...

    def check_alive(self, waiting_for: str) -> None:
        """Raise :class:`PipelineError` (naming ``waiting_for``) if the producer is gone."""
        ...

    def close(self, timeout: float = 5.0) -> None: ...


@dataclass(frozen=True)
class CacheReport:
    """Rows the feature caches of the producer's process served since they opened, by where they came from
    (cumulative), and the bytes of one row (for caches over typed rows, the host rows' mean width). Only a worker
    process reports (an in-process producer's caches are the trainer process's own).

    Attributes:
        per_plan: the same counts per cache plan, ``(plan digest, local, peer, host, row_bytes)`` each (one entry for
            a cache of one table, one per featured type for a cache over typed rows; ``()`` where not reported).
    """

    local: int
    peer: int
    host: int
    row_bytes: int
    per_plan: tuple[tuple[str, int, int, int, int], ...] = ()


@dataclass
class PipelineStats:
    """Running figures of one client, read by the telemetry callback."""

    batches: int = 0
    wait_s: float = 0.0
    build_s: float = 0.0
    last_wait_s: float = 0.0
    last_build_s: float = 0.0
    slot_bytes: int = 0
    grows: int = 0
    #: where a hybrid source's batches were sampled: batches, predicted and measured seconds per device
    sampling: HybridStats = field(default_factory=HybridStats)
    #: the worker's feature-cache counters as of its latest report (``None``: no report, or an in-process producer)
    cache: Optional[CacheReport] = None
    #: where the latest batch's build went: sample, gather (bytes, bound), assemble, hand-over (``None``: a source
    #: without stages, see :mod:`.stage_times`)
    last_stages: Optional[BuildStages] = None
    #: the stages summed over every batch that had them (means in ms: ``stages.mean_ms()``; ``stages.gather_GBps``)
    stages: StageTotals = field(default_factory=StageTotals)


@dataclass
class _Stage:
    source: Any
    ring: Optional[SlotRing] = None
    free_events: list = field(default_factory=list)
    gen: Optional[int] = None
    inbox: deque = field(default_factory=deque)
    opened: bool = False


class PipelineClient:
    """Trainer-side end of a batch pipeline.

    Args:
        transport: the channel to the producer (already started).
        depth: slots per loader (2 = ping-pong: the producer fills one while the trainer uses the other).
        device: where slots live: a CUDA device, or CPU (shared host memory).
        growth: when a batch does not fit, its slot grows to this factor times what it needs.
        timeout: seconds to wait for one batch before raising (the producer being alive but stuck); ``None``:
            derived from the builds measured so far (:mod:`~lightning_zerocopy.pipeline.batch_timeout`).
    """

    def __init__(
        self,
        transport: Transport,
        depth: int = 2,
        device: torch.device | str = "cpu",
        growth: float = 1.25,
        timeout: Optional[float] = None,
    ) -> None:
        check_depth(depth, "PipelineClient")
        self.transport = transport
        self.depth = depth
        self.device = torch.device(device)
        self.growth = growth
        self.timeout = BatchTimeout(timeout)
        self.stats = PipelineStats()
        self._stages: dict[str, _Stage] = {}
        self._gen = 0
        self._closed = False
        self._send_lock = threading.Lock()
        self._notifier: Optional[_FreeNotifier] = None

    # ---- public API ------------------------------------------------------------------------------------------
    def register(self, stage: str, source: BatchSource) -> None:
        """Send the picklable ``source`` of a loader to the producer and wait until the producer has opened it
        (``source.open()``, if it has one: shared host memory must be mapped while its names exist)."""
        st = self._stages.get(stage)
        if st is None:
            st = self._stages[stage] = _Stage(source)
        else:
            st.source = source
        st.opened = False
        # a worker gets a plain pickle (tensors by value, e.g. the plan's seed ids, which may live in a mapped file
        # that torch.multiprocessing cannot pass as a descriptor); shared host memory is opened by name there
        payload = pickle.dumps(source) if self.transport.interprocess else source
        self._send(("source", stage, payload))
        self._pump(lambda: st.opened, f"the {stage} batch source to be opened")

    def iterate(self, stage: str, epoch: int, start: int = 0, stop: Optional[int] = None) -> Iterator[Data]:
        """Yield batches ``start..stop-1`` of ``epoch`` of a registered stage, built by the producer."""
        st = self._stages[stage]
        if stop is None:
            stop = st.source.num_steps(epoch)
        self._gen += 1
        gen = self._gen
        st.gen = gen
        st.inbox.clear()
        if st.ring is not None and self.device.type == "cuda":
            # a new iteration hands every slot back at once: let queued work that reads them finish first
            torch.cuda.current_stream(self.device).synchronize()
        self._send(("start", stage, gen, epoch, start, stop))
        return self._generate(stage, st, gen, epoch, start, stop)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the producer and release the slots; ``timeout``: seconds the producer (and the slot-release thread)
        get to stop before the producer is ended (see the transport's ``close``)."""
        if self._closed:
            return
        self._closed = True
        if self._notifier is not None:
            self._notifier.close(timeout)
        try:
            self._send(("stop",))
        except Exception:  # noqa: BLE001 - a dead producer needs no stop message
            pass
        self.transport.close(timeout)
        self._stages.clear()
        if self.device.type == "cuda" and self.transport.interprocess:
            torch.cuda.ipc_collect()  # release what the worker held (torch's IPC ref-count files in /dev/shm)

    # ---- internals -------------------------------------------------------------------------------------------
    def _send(self, msg: tuple) -> None:
        with self._send_lock:  # the free notifier thread sends too
            self.transport.send(msg)

    def _generate(self, stage: str, st: _Stage, gen: int, epoch: int, start: int, stop: int) -> Iterator[Data]:
        held: Optional[int] = None
        try:
            for step in range(start, stop):
                what = f"{stage} batch {step} of epoch {epoch}"
                t0 = time.perf_counter()
                msg = self._wait_ready(stage, st, gen, what)
                wait_s = time.perf_counter() - t0
                slot, got_step, sizes, scalars, build_s, dispatch = msg[3:9]
                stages = msg[9] if len(msg) > 9 else None  # a producer without the stage split sends 9 fields
                if got_step != step:
                    raise PipelineError(f"pipeline protocol error: expected {what}, the producer sent step {got_step}")
                batch = st.ring.view(slot, sizes, scalars)
                if HETERO_TYPES in scalars:
                    batch = unflatten_hetero(batch)
                held = slot
                self.stats.batches += 1
                self.stats.wait_s += wait_s
                self.stats.build_s += build_s
                self.stats.last_wait_s, self.stats.last_build_s = wait_s, build_s
                self.timeout.record(build_s)
                if dispatch is not None:
                    self.stats.sampling.record(dispatch)
                self.stats.last_stages = stages
                if stages is not None:
                    self.stats.stages.add(stages)
                yield batch
                del batch
                self._release(stage, st, gen, held)
                held = None
        finally:
            if not self._closed and st.gen == gen:
                try:
                    if held is not None:
                        self._release(stage, st, gen, held)
                    self._send(("end", stage, gen))
                except Exception:  # noqa: BLE001 - the producer may already be gone
                    pass
                st.gen = None

    def _release(self, stage: str, st: _Stage, gen: int, slot: int) -> None:
        if self.device.type != "cuda":
            self._send(("free", stage, gen, slot))
            return
        event = st.free_events[slot]
        event.record(torch.cuda.current_stream(self.device))  # after the step's kernels that read the slot
        if self._notifier is None:
            self._notifier = _FreeNotifier(self._send, self.device)
        self._notifier.put(("free", stage, gen, slot), event)

    def _wait_ready(self, stage: str, st: _Stage, gen: int, what: str) -> tuple:
        self._pump(lambda: bool(st.inbox), what)
        return st.inbox.popleft()

    def _pump(self, done, what: str) -> None:
        """Handle producer messages until ``done()``; raise if the producer dies or stays silent too long."""
        limit = self.timeout.seconds
        deadline = time.monotonic() + limit
        while not done():
            msg = self.transport.recv(timeout=0.2)
            if msg is None:
                self.transport.check_alive(what)
                if getattr(self.transport, "starting", False):  # a worker still starting is not a stuck producer
                    deadline = time.monotonic() + limit
                elif time.monotonic() > deadline:
                    raise PipelineError(self._silent(what, limit))
                continue
            self._dispatch(msg, what)

    def _silent(self, what: str, limit: float) -> str:
        """The error for a live producer that delivered nothing within ``limit`` seconds: the worker's pid and state."""
        pid = getattr(self.transport, "pid", None)
        state = process_state(pid)
        who = "the pipeline producer" if pid is None else f"the pipeline worker (pid {pid}, state {state})"
        resume = f"; `kill -CONT {pid}` resumes a stopped worker" if state is not None and "stopped" in state else ""
        return (f"{who} did not deliver {what} within {limit:g} s although it is alive (the limit: "
                f"{self.timeout.describe()}){resume}")  # fmt: skip

    def _dispatch(self, msg: tuple, what: str) -> None:
        kind, stage = msg[0], msg[1]
        if kind == "cache":  # the producer process's counters, whatever stage's batch they came with
            self.stats.cache = CacheReport(*msg[2])
            return
        st = self._stages.get(stage)
        if st is None:
            return
        if kind == "opened":
            st.opened = True
        elif kind == "ready":
            if msg[2] == st.gen:
                st.inbox.append(msg)
        elif kind == "layout":
            _, _, _, layout, sizes = msg
            self._allocate(stage, st, layout, sizes)
        elif kind == "grow":
            _, _, _, slot, sizes = msg
            buffers = st.ring.grow(slot, sizes)
            self.stats.grows += 1
            self.stats.slot_bytes = sum(s.ring.nbytes() for s in self._stages.values() if s.ring is not None)
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
            self._send(("slots", stage, slot, buffers))
        elif kind == "error":
            raise PipelineError(
                f"the pipeline producer failed while building {stage} batches (the trainer waited for {what}); "
                f"its traceback:\n{msg[3]}"
            )
        else:
            raise PipelineError(f"pipeline protocol error: unknown message {kind!r}")

    def _allocate(self, stage: str, st: _Stage, layout: SlotLayout, sizes: dict[str, int]) -> None:
        capacity = {axis: int(math.ceil(n * self.growth)) for axis, n in sizes.items()}
        for axis, bound in (capacity_hint(st.source) or {}).items():
            if axis in capacity:
                capacity[axis] = max(capacity[axis], int(bound))
        st.ring = SlotRing(layout, capacity, self.depth, self.device, self.growth, shared=self.transport.interprocess)
        if self.device.type == "cuda":
            st.free_events = [wait_event() for _ in range(self.depth)]  # its release thread sleeps on them
            torch.cuda.current_stream(self.device).synchronize()  # the slots exist before the producer writes
        self.stats.slot_bytes = sum(s.ring.nbytes() for s in self._stages.values() if s.ring is not None)
        self._send(("slots", stage, None, st.ring.slots))


class _FreeNotifier:
    """Sends a slot's ``free`` message once the GPU work the trainer queued on it has run.

    A thread of the trainer process waits on each slot's event in release order (CUDA work on one stream
    completes in order), so the trainer's own thread never blocks on the GPU to hand a slot back and the
    producer can refill it while the trainer has already queued the next step.
    """

    def __init__(self, send, device: torch.device) -> None:
        self._send = send
        self._device = device
        self._queue: "queue.Queue[Optional[tuple[tuple, Any]]]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="lightning-zerocopy-slot-release", daemon=True)
        self._thread.start()

    def put(self, msg: tuple, event: Any) -> None:
        self._queue.put((msg, event))

    def _run(self) -> None:
        torch.cuda.set_device(self._device)
        while True:
            item = self._queue.get()
            if item is None:
                return
            msg, event = item
            event.synchronize()
            try:
                self._send(msg)
            except Exception:  # noqa: BLE001 - a dead producer is reported by the trainer's own wait
                return

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the releases queued so far, waiting up to ``timeout`` seconds: behind a stream that never
        drains (a collective a stopping peer never joins) the thread waits for good (a daemon: it ends with the
        process)."""
        self._queue.put(None)
        self._thread.join(timeout)
