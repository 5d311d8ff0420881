"""One rank's per-step timeline: where a training step's time goes, phase by phase, without synchronizing the steps.

:class:`StepTimeline` marks every training step at Lightning's hooks, on the host (``time.perf_counter``) and, on a
GPU, with CUDA events on the trainer's stream: ``start`` (``on_train_batch_start``: the batch fetched and moved),
``bwd0`` (``on_before_backward``: ``training_step`` returned), ``bwd1`` (``on_after_backward``: the backward and
DDP's gradient all-reduce, whose tail the reducer waits for at its end) and ``end`` (``on_train_batch_end``: the
optimizer step and Lightning's post-step work). :func:`timed_allreduce`, registered as the DDP comm hook, marks each
gradient bucket's all-reduce: at its launch (the bucket's gradients ready) and once it has completed (an event
recorded from the future's callback, on a stream that waited for the collective). Events are read only once
``query()`` says they have completed (polled at the next steps' starts, never waited for), and at the epoch's end,
after the epoch timer's synchronization. Figures per step, in ms (GPU: between the events; host: between the
host marks, prefixed ``h_``):

* ``fwd`` (start -> bwd0), ``bwd`` (bwd0 -> bwd1, the all-reduce's exposed tail included), ``opt`` (bwd1 -> end),
  ``step`` (start -> the next step's start), ``gap`` (end -> the next step's start: the GPU idle between steps);
* ``comm`` (each bucket's launch -> completed, summed), ``comm_tail`` (the last bucket's launch -> completed: the
  all-reduce left once the last gradient is ready, the wait for the slower rank included), ``buckets``;
* ``h_fwd``, ``h_bwd``, ``h_opt``, ``h_step``, ``h_between`` (end -> the next step's start on the host),
  ``h_fetch`` (inside the training loader's ``next()`` in that window: Lightning fetches one batch ahead, so this
  is the next batch's wait for the pipeline worker or its in-process build), ``h_handover`` (the pipeline client's
  own wait for the worker's ``ready`` message, in that fetch), ``h_lightning`` (``h_between - h_fetch``: Lightning's
  and the callbacks' work between steps).

On a CPU every figure is a host time (the GPU names then hold the host's). Figures are kept per phase (the name
``phase_of(epoch)`` gives each epoch), skipping each epoch's first ``skip`` steps. The marks cost some tens of
microseconds of host time a step (event records and queries; the comm hook runs DDP's all-reduce from Python), in
every run alike: ``comm_timing=0`` (:mod:`.knobs`) measures a run without the hook.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch

__all__ = ["CommTimer", "StepTimeline", "summarize_values", "timed_allreduce"]

_MARKS = ("start", "bwd0", "bwd1", "end")


class _Mark:
    """A point of a step: host time and, on a GPU, a CUDA event recorded on the current stream."""

    __slots__ = ("host", "event")

    def __init__(self, cuda: bool) -> None:
        self.host = time.perf_counter()
        self.event: Any = None
        if cuda:
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()

    def done(self) -> bool:
        return self.event is None or bool(self.event.query())

    def ms_until(self, later: "_Mark") -> float:
        if self.event is not None and later.event is not None:
            return float(self.event.elapsed_time(later.event))
        return 1e3 * (later.host - self.host)


class CommTimer:
    """The DDP comm hook's state: the all-reduces of the current step, ``[launch, completed]`` marks per bucket, and
    how the completion callbacks ran (``inline``: within the hook, as NCCL's completed-at-launch futures do, so the
    completion event is exact; ``deferred``: later, from another thread, so it is an upper bound)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.current: list[list[Optional[_Mark]]] = []
        self.inline = 0
        self.deferred = 0
        self._lock = threading.Lock()

    def start_step(self) -> list[list[Optional[_Mark]]]:
        self.current = []
        return self.current

    def _count(self, inline: bool) -> None:
        with self._lock:
            if inline:
                self.inline += 1
            else:
                self.deferred += 1


def timed_allreduce(state, bucket):  # type: ignore[no-untyped-def]
    """DDP's default all-reduce (divide by the world size, sum over the ranks), with each bucket's launch and
    completion marked in ``state`` (a :class:`CommTimer`; register with
    ``DistributedDataParallel.register_comm_hook(state, this)``). Returns the ``torch.futures.Future`` of the
    bucket's reduced tensor. (No annotations: DDP checks them and the postponed ones here would be strings.)"""
    import torch.distributed as dist

    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())
    entry: list[Optional[_Mark]] = [_Mark(state.cuda), None]
    state.current.append(entry)
    returned = [False]
    future = dist.all_reduce(tensor, async_op=True).get_future()

    def completed(fut: torch.futures.Future) -> torch.Tensor:
        entry[1] = _Mark(state.cuda)  # on a stream that waited for the collective (a CUDA future's callback)
        state._count(inline=not returned[0])
        return fut.value()[0]

    chained = future.then(completed)
    returned[0] = True
    return chained


class StepTimeline(pl.Callback):
    """Per-step phase times of this rank (see the module docstring).

    Args:
        phase_of: the phase an epoch's steps belong to (e.g. ``"warmup"``, ``"data"``, ``"model"``).
        cuda: mark with CUDA events (the trainer's stream) beside the host clock.
        comm_timing: register :func:`timed_allreduce` as the DDP comm hook (when the model is wrapped in DDP).
        fetch: ``(h_fetch seconds, h_handover seconds)`` of the latest fetch, read at each step's start
            (``None`` each where unknown).
        keep: the last steps of each phase kept as raw per-step figures in the summary.
        skip: steps at the start of every epoch left out (the epoch's first steps carry its set-up).
    """

    def __init__(self, phase_of: Callable[[int], str], cuda: bool, comm_timing: bool = True,
                 fetch: Optional[Callable[[], tuple[Optional[float], Optional[float]]]] = None, keep: int = 256,
                 skip: int = 2) -> None:  # fmt: skip
        self.phase_of, self.cuda, self.comm_timing = phase_of, cuda, comm_timing
        self.fetch = fetch or (lambda: (None, None))
        self.keep, self.skip = int(keep), int(skip)
        self.comm = CommTimer(cuda)
        self.comm_registered = False
        #: the DDP wrapper's settings in effect and the gradients it reduces (``None`` without DDP)
        self.ddp_settings: Optional[dict[str, Any]] = None
        self.values: dict[str, dict[str, list[float]]] = {}  # phase -> figure -> per-step values
        self.first_steps: dict[str, int] = {}  # phase -> the global step of its first kept step
        self._current: Optional[dict[str, Any]] = None
        self._pending: deque[dict[str, Any]] = deque()
        self._previous: Optional[dict[str, Any]] = None

    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        from torch.nn.parallel import DistributedDataParallel

        model = trainer.strategy.model
        if not isinstance(model, DistributedDataParallel):
            return
        params = [p for p in model.parameters() if p.requires_grad]
        self.ddp_settings = {
            "static_graph": bool(model.static_graph), "gradient_as_bucket_view": bool(model.gradient_as_bucket_view),
            "bucket_cap_mb": float(model.bucket_bytes_cap) / 2**20,
            "sync_buffers": getattr(model, "forward_sync_buffers", getattr(model, "broadcast_buffers", None)),
            "buffers": sum(1 for _ in model.module.buffers()), "parameters": sum(p.numel() for p in params),
            "gradient_bytes": sum(p.numel() * p.element_size() for p in params),
        }  # fmt: skip
        if self.comm_timing:
            model.register_comm_hook(self.comm, timed_allreduce)
            self.comm_registered = True

    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._previous = None  # no interval spans two epochs

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                             batch_idx: int) -> None:  # fmt: skip
        fetch_s, handover_s = self.fetch()
        self._current = {"epoch": trainer.current_epoch, "index": batch_idx, "step": trainer.global_step,
                         "marks": {"start": _Mark(self.cuda)}, "fetch": fetch_s, "handover": handover_s,
                         "comm": self.comm.start_step()}  # fmt: skip
        self._count(wait=False)

    def _mark(self, name: str) -> None:
        if self._current is not None:
            self._current["marks"][name] = _Mark(self.cuda)

    def on_before_backward(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", loss: Any) -> None:
        self._mark("bwd0")

    def on_after_backward(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._mark("bwd1")

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        self._mark("end")
        if self._current is not None:
            self._pending.append(self._current)
            self._current = None

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.cuda:
            torch.cuda.synchronize()  # the epoch is over: its last steps' events may be read now
        self._count(wait=True)

    # ---- reading the marks -----------------------------------------------------------------------------------
    def _ready(self, record: dict[str, Any]) -> bool:
        marks = list(record["marks"].values()) + [m for entry in record["comm"] for m in entry]
        return all(m is not None and m.done() for m in marks)

    def _count(self, wait: bool) -> None:
        while self._pending and (self._ready(self._pending[0]) or (wait and self._wait(self._pending[0]))):
            record = self._pending.popleft()
            previous = self._previous if self._previous is not None and self._previous["epoch"] == record["epoch"] else None
            figures = step_figures(record, previous)
            self._previous = record
            if record["index"] < self.skip:
                continue
            phase = self.phase_of(record["epoch"])
            self.first_steps.setdefault(phase, record["step"])
            table = self.values.setdefault(phase, {})
            for name, value in figures.items():
                table.setdefault(name, []).append(value)

    def _wait(self, record: dict[str, Any]) -> bool:
        """At the epoch's end: a completion callback that never ran leaves its bucket unmarked (counted, skipped)."""
        record["comm"][:] = [entry for entry in record["comm"] if entry[1] is not None]
        return self._ready(record)

    def summary(self) -> dict[str, Any]:
        """Per phase: ``steps`` counted, ``median`` / ``p10`` / ``p90`` / ``mean`` of every figure, and ``raw``, the
        last :attr:`keep` steps' figures (``raw_first_step``: the global step of the first of them, so two ranks'
        steps line up); plus how the comm hook ran."""
        phases = {}
        for phase, table in self.values.items():
            n = max((len(v) for v in table.values()), default=0)
            first = self.first_steps.get(phase, 0) + max(0, n - self.keep)
            phases[phase] = {"steps": n, **summarize_values(table),
                             "raw": {k: [round(x, 4) for x in v[-self.keep:]] for k, v in table.items()},
                             "raw_first_step": first}  # fmt: skip
        return {"clock": "cuda_events" if self.cuda else "host", "comm_hook": self.comm_registered,
                "ddp": self.ddp_settings,
                "comm_callbacks": {"inline": self.comm.inline, "deferred": self.comm.deferred}, "phases": phases}  # fmt: skip


def step_figures(record: dict[str, Any], previous: Optional[dict[str, Any]]) -> dict[str, float]:
    """One step's figures in ms (see the module docstring) from its marks and the previous step's of the same epoch."""
    marks, out = record["marks"], {}
    for name, a, b in (("fwd", "start", "bwd0"), ("bwd", "bwd0", "bwd1"), ("opt", "bwd1", "end")):
        if a in marks and b in marks:
            out[name] = marks[a].ms_until(marks[b])
            out["h_" + name] = 1e3 * (marks[b].host - marks[a].host)
    if previous is not None:
        before = previous["marks"]
        out["step"] = before["start"].ms_until(marks["start"])
        out["h_step"] = 1e3 * (marks["start"].host - before["start"].host)
        if "end" in before:
            out["gap"] = max(0.0, before["end"].ms_until(marks["start"]))
            out["h_between"] = 1e3 * (marks["start"].host - before["end"].host)
            if record["fetch"] is not None:
                out["h_fetch"] = 1e3 * record["fetch"]
                out["h_lightning"] = out["h_between"] - out["h_fetch"]
    if record["handover"] is not None:
        out["h_handover"] = 1e3 * record["handover"]
    comm = [entry for entry in record["comm"] if entry[1] is not None]
    out["buckets"] = float(len(comm))
    if comm:
        out["comm"] = sum(launch.ms_until(done) for launch, done in comm)
        out["comm_tail"] = comm[-1][0].ms_until(comm[-1][1])
    return out


def summarize_values(table: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """``median``, ``p10``, ``p90`` and ``mean`` of each list of ``table`` (empty lists left out)."""
    out: dict[str, dict[str, float]] = {"median": {}, "p10": {}, "p90": {}, "mean": {}}
    for name, values in table.items():
        if not values:
            continue
        ordered = sorted(values)
        pick = lambda q: ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]  # noqa: E731
        out["median"][name] = round(pick(0.5), 4)
        out["p10"][name] = round(pick(0.1), 4)
        out["p90"][name] = round(pick(0.9), 4)
        out["mean"][name] = round(sum(values) / len(values), 4)
    return out
