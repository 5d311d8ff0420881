"""``DataTelemetry``: how long training waits for data, and how fast data arrives, per training step.

Measured every step on the host and kept there (:attr:`DataTelemetry.history`, and running sums); handed to the
LightningModule's logger every ``trainer.log_every_n_steps`` steps and at an epoch's last batch as ``<name>_step``,
the figures of the steps since the previous hand-over, and at the epoch's end as ``<name>_epoch``, exact over the
epoch and over every DDP rank (:mod:`lightning_zerocopy.callbacks.step_figures`). Nothing is logged on the other
steps: a figure logged every step synchronizes every step with the GPU (Lightning copies a Python number to the
device, and reads progress-bar tensors back after each step), and a step that waits for the GPU cannot be queued
ahead of it. The values are CPU tensors, which the progress bar (``stall``, the stall fraction, and ``MEPS``,
millions of sampled edges per second, refreshed at each hand-over) reads without touching the GPU. The figures:

* ``data/stall_ms``: time training could not run for want of the next batch. On a GPU that is the GPU's
  idle gap on the trainer's stream between the end of one step's work and the start of the next (CUDA
  events; no synchronization); on the CPU, the host time between the end of one step and the start of the next;
* ``data/stall_frac``: that gap over the whole step interval (GPU time on a GPU);
* ``data/step_ms``: the step interval, start of one step to the start of the next (GPU time on a GPU);
* ``data/wait_ms``: host time between the end of one step and the start of the next (fetching the batch and
  moving it to the device). On a GPU the host runs ahead of the device, so this includes time the GPU was
  still busy with earlier steps and is no loss by itself (with ping-pong slots the host waits for a slot that
  frees when the step that used it has run);
* ``data/seps``: sampled edges per second delivered to training (``edge_index`` columns / step interval);
* ``data/gather_GBps``: feature bytes delivered per second (``x`` bytes / step interval);
* heterogeneous batches (``HeteroData``): edges and ``x`` bytes are summed over every edge and featured node type,
  and ``data/rows_<node type>`` is the mean number of sampled nodes of that type per step (every node type, with
  or without features; a featured type's rows are the rows its gather reads). Where no GPU feature cache serves the
  batches (the DataModule's ``feature_cache`` is ``None``), every row is read from host memory:
  ``data/host_bytes_<featured type>`` is the mean of that type's rows times its host table's row bytes
  (``feature_row_bytes``: the host dtype, not ``x``'s after a cast) per step, and ``data/host_bytes`` their sum. With
  a cache, the rows it served are known only from its GPU counters, read once per epoch: see ``cache/`` below;
* with :class:`~lightning_zerocopy.callbacks.PipelineCallback`: ``data/build_ms``, the producer's time to
  sample and gather the batch (off the trainer's critical path), and where it went
  (:mod:`lightning_zerocopy.pipeline.stage_times`; GPU times from CUDA events where the work runs on a GPU, read by
  the producer after the stream synchronization it does anyway, so nothing waits for them here):
  ``data/build_sample_ms`` (the sampler, unique/relabel included), ``data/build_gather_ms`` (the feature rows),
  ``data/build_assemble_ms`` (labels, id maps, the cast of ``x``, copies into the slot), ``data/build_handover_ms``
  (host time from the producer's stream synchronization to its ``ready`` message), ``data/gather_build_GBps`` (the
  feature bytes the gather stage moved, in the host table's dtype, over its time) and ``data/gather_bound_ms`` (those
  bytes over the PCIe bandwidth the producer measured at start: the gather's bound); where the sampling thread
  measured them, ``data/build_sample_host_ms`` and ``data/build_sample_cpu_ms`` (the sample's wall time and that
  thread's CPU time: what of the sample stage the thread spent waiting);
* with hybrid sampling (``sampler_placement: hybrid | auto``; from the pipeline's stats, or the DataModule's
  ``sampling_stats("train")`` without a pipeline): ``data/sample_ms`` and ``data/sample_pred_ms``, the measured
  and the cost model's predicted sampling time of the latest batch, and ``data/share_<device>``, the share of
  the batches so far that each device (``cpu``, ``gpu``) sampled;
* with a GPU feature cache (:class:`~lightning_zerocopy.strategies.ZeroCopyDDPStrategy`'s ``cache_budget``), per
  training epoch, summed over the DDP ranks (:attr:`DataTelemetry.cache_history` keeps this rank's):
  ``cache/hit_rate`` (rows served from GPU memory over all rows gathered),
  ``cache/local_rows``, ``cache/peer_rows`` and ``cache/host_rows`` (where the rows came from),
  ``cache/host_bytes`` (the rows not served from GPU memory times their row bytes) and ``cache/host_read_GBps``
  (those bytes over the epoch's wall time; over ranks, their bytes over their time: a rank's mean). A cache over
  typed rows counts each featured type apart (one plan per type; the bytes are each type's host rows times its own
  row bytes) and adds, per featured type, ``cache/rows_<type>`` (rows gathered), ``cache/hit_rate_<type>``,
  ``cache/host_rows_<type>`` and ``cache/host_bytes_<type>``. The rows of every
  process that gathers for this rank, counted once each: the caches of the trainer's process (read from the
  strategy at the epoch's start and end, one GPU synchronization each; this includes an in-process pipeline's
  producer thread), plus, with a :class:`~lightning_zerocopy.callbacks.PipelineCallback` worker process, the
  counters that worker reports through the pipeline's stats, per cache plan (mapped to node types through the
  strategy's ``cache_decision``) (read in the worker right after a stream
  synchronization it does anyway: at the last batch of every iteration and every 32 batches,
  :mod:`lightning_zerocopy.pipeline.cache_report`; nothing is synchronized in the trainer for them). The figures
  include the gathers of the validation run at the end of the epoch (one cache serves both loaders).

On a GPU a step's figures are counted once its events have completed (polled, never waited for during the
epoch), so a hand-over carries the steps whose GPU work has run; the steps still pending when validation starts or
the epoch ends are waited for then, so the epoch figures count every step interval.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from typing_extensions import override

from lightning_zerocopy.callbacks.predictions import is_hetero
from lightning_zerocopy.callbacks.step_figures import Ratio, StepSums, log_epoch_figures
from lightning_zerocopy.step_logging import is_log_step


@dataclass
class _PendingStep:
    """One step interval on a GPU, waiting for its events: previous step's start and end, this step's start."""

    host: dict[str, float]
    prev_start: Any
    prev_end: Any
    start: Any


class DataTelemetry(Callback):
    """Per-step data stall (GPU idle time on a GPU), host wait, SEPS and feature GB/s of the training loop.

    Args:
        prog_bar: show the stall share and MEPS in the progress bar (refreshed at each hand-over to the logger).
    """

    def __init__(self, prog_bar: bool = True) -> None:
        self.prog_bar = prog_bar
        self._history: list[dict[str, float]] = []
        self._uncounted: list[dict[str, float]] = []  # steps' raw records not yet turned into history figures
        #: per training epoch, this rank's feature-cache figures (see the module docstring)
        self.cache_history: list[dict[str, float]] = []
        self._epoch_start: Optional[float] = None
        self._epoch_counts: dict[tuple[str, str], _CacheTotals] = {}
        #: per featured type, host row bytes for ``data/host_bytes_<type>`` (``None``: a GPU cache serves rows)
        self._host_row_bytes: Optional[dict[str, int]] = None
        self._window = StepSums()  # the steps since the last hand-over
        self._epoch = StepSums()  # the steps of this epoch
        self._reset()

    @property
    def history(self) -> list[dict[str, float]]:
        """Every counted step's figures, on the host (``data/stall_ms``, ``data/stall_frac``, ...), oldest first.

        A step keeps its raw record (times, sizes) until this is read: turning it into figures every step cost
        ~20 µs of host time a step in the training loop (cProfile, ``python -m benchmarks.parts.step --profile``)."""
        if self._uncounted:
            self._history += [{name: ratio.value for name, ratio in StepSums.of(step).figures().items()}
                              for step in self._uncounted]  # fmt: skip
            self._uncounted.clear()
        return self._history

    def _reset(self) -> None:
        self._last_start: Optional[float] = None
        self._last_end: Optional[float] = None
        self._start_event: Any = None
        self._end_event: Any = None
        self._pending: deque[_PendingStep] = deque()

    @override
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._reset()
        self._window, self._epoch = StepSums(), StepSums()
        self._epoch_start = time.perf_counter()
        self._epoch_counts = _cache_counts(trainer)
        self._host_row_bytes = _uncached_row_bytes(trainer)

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._count_pending(wait=True)
        log_epoch_figures(trainer, pl_module, self._epoch.figures(), suffix="_epoch")
        self._log_cache_figures(trainer, pl_module)

    def _log_cache_figures(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        counts = _cache_counts(trainer)
        if not counts or self._epoch_start is None:
            return
        seconds = time.perf_counter() - self._epoch_start
        per_type: dict[str, _CacheTotals] = {}
        for key, now in counts.items():  # each process's rows once: its counts now less those at the start
            since = now.since(self._epoch_counts.get(key))
            per_type[key[1]] = per_type.get(key[1], _CacheTotals(0, 0, 0, 0)).plus(since)
        epoch = _CacheTotals(0, 0, 0, 0)
        for totals in per_type.values():
            epoch = epoch.plus(totals)
        local, peer, host = epoch.local, epoch.peer, epoch.host
        figures = {
            "cache/hit_rate": Ratio(local + peer, local + peer + host),
            "cache/local_rows": Ratio(local),
            "cache/peer_rows": Ratio(peer),
            "cache/host_rows": Ratio(host),
            "cache/host_bytes": Ratio(epoch.host_bytes),
            "cache/host_read_GBps": Ratio(epoch.host_bytes, seconds, 1e-9),
        }
        for node_type, totals in sorted(per_type.items()) if len(_cached_types(trainer)) > 1 else ():
            served = totals.local + totals.peer  # (one type's figures are the totals)
            figures[f"cache/rows_{node_type}"] = Ratio(served + totals.host)
            figures[f"cache/hit_rate_{node_type}"] = Ratio(served, served + totals.host)
            figures[f"cache/host_rows_{node_type}"] = Ratio(totals.host)
            figures[f"cache/host_bytes_{node_type}"] = Ratio(totals.host_bytes)
        self.cache_history.append({name: float(ratio.value) for name, ratio in figures.items()})
        log_epoch_figures(trainer, pl_module, figures)

    @override
    def on_validation_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._count_pending(wait=True)  # the epoch's figures count every step, also those still on the GPU

    @override
    def on_validation_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._reset()  # the validation loop is not a data stall of the next training step

    @override
    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        on_gpu = pl_module.device.type == "cuda"
        start_event = _record(pl_module.device) if on_gpu else None
        if self._last_start is not None and self._last_end is not None:
            host = _host_figures(trainer, batch, interval_s=now - self._last_start, wait_s=now - self._last_end,
                                 host_row_bytes=self._host_row_bytes)  # fmt: skip
            if on_gpu and self._start_event is not None and self._end_event is not None:
                self._pending.append(_PendingStep(host, self._start_event, self._end_event, start_event))
            else:
                self._count(host, stall_s=host["wait_s"], interval_s=host["interval_s"])
        self._count_pending(wait=False)
        self._last_start, self._start_event = now, start_event

    @override
    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._last_end = time.perf_counter()
        self._end_event = _record(pl_module.device) if pl_module.device.type == "cuda" else None
        if is_log_step(trainer):
            self._count_pending(wait=False)
            self._hand_over(pl_module)

    def _count_pending(self, wait: bool) -> None:
        """Count the pending GPU steps whose events have completed (``wait``: all of them, waiting for the GPU)."""
        while self._pending and (wait or self._pending[0].start.query()):  # query() does not block
            step = self._pending.popleft()
            if wait:
                step.start.synchronize()
            gap_s = step.prev_end.elapsed_time(step.start) / 1e3
            interval_s = step.prev_start.elapsed_time(step.start) / 1e3
            self._count(step.host, stall_s=max(gap_s, 0.0), interval_s=interval_s)

    def _count(self, host: dict[str, float], stall_s: float, interval_s: float) -> None:
        """One step interval's figures: into the history, the hand-over window and the epoch (host numbers only)."""
        step = {**host, "stall_s": stall_s, "interval_s": interval_s}
        self._window.add(step)
        self._epoch.add(step)
        self._uncounted.append(step)

    def _hand_over(self, pl_module: "pl.LightningModule") -> None:
        """Log the window's figures as ``<name>_step`` (CPU tensors: no device copy now, no read-back later)."""
        figures = {name: ratio.value for name, ratio in self._window.figures().items()}
        self._window = StepSums()
        if not figures:
            return
        for name, value in figures.items():
            pl_module.log(f"{name}_step", torch.tensor(value, dtype=torch.float64), on_step=True, on_epoch=False)
        if self.prog_bar:  # two compact figures; the full set goes to the logger
            pl_module.log("stall", torch.tensor(figures["data/stall_frac"]), prog_bar=True, logger=False,
                          on_step=True, on_epoch=False)  # fmt: skip
            if "data/seps" in figures:
                pl_module.log("MEPS", torch.tensor(figures["data/seps"] / 1e6), prog_bar=True, logger=False,
                              on_step=True, on_epoch=False)  # fmt: skip


def _host_figures(trainer: "pl.Trainer", batch: Any, interval_s: float, wait_s: float,
                  host_row_bytes: Optional[dict[str, int]] = None) -> dict[str, float]:  # fmt: skip
    """What the host knows of a step interval: its times, the batch's sizes (shapes, not values) and the
    producer's and sampler's latest figures (``host_row_bytes``: see :func:`_hetero_sizes`)."""
    host = {"interval_s": interval_s, "wait_s": wait_s}
    if is_hetero(batch):
        host.update(_hetero_sizes(batch, host_row_bytes))
    else:
        edge_index, x = getattr(batch, "edge_index", None), getattr(batch, "x", None)
        host["edges"] = float(edge_index.size(1)) if isinstance(edge_index, torch.Tensor) else -1.0
        host["x_bytes"] = float(x.numel() * x.element_size()) if isinstance(x, torch.Tensor) else -1.0
    stats = _pipeline_stats(trainer)
    if stats is not None:
        host["build_ms"] = 1e3 * stats.last_build_s
        stages = getattr(stats, "last_stages", None)
        if stages is not None:
            host.update(_stage_figures(stages))
    host.update(_sampling_metrics(trainer, stats))
    return host


def _hetero_sizes(batch: Any, host_row_bytes: Optional[dict[str, int]] = None) -> dict[str, float]:
    """A heterogeneous batch's sizes: ``edges`` over every edge type, ``x_bytes`` over every featured node type
    (``-1``: none has them, as for a homogeneous batch without the field) and ``rows_<type>``, the sampled nodes of
    each node type (``n_id``, else the store's ``num_nodes``); with ``host_row_bytes`` (per featured type, the host
    table's row bytes, given where no GPU cache serves rows) ``host_bytes_<type>``, that type's rows times its row
    bytes, and ``host_bytes``, their sum over the featured types."""
    edges = [store.edge_index for store in batch.edge_stores if isinstance(store.get("edge_index"), torch.Tensor)]
    xs = [store.x for store in batch.node_stores if isinstance(store.get("x"), torch.Tensor)]
    out = {
        "edges": float(sum(index.size(1) for index in edges)) if edges else -1.0,
        "x_bytes": float(sum(x.numel() * x.element_size() for x in xs)) if xs else -1.0,
    }
    for store in batch.node_stores:
        n_id = store.get("n_id")
        rows = n_id.numel() if isinstance(n_id, torch.Tensor) else store.num_nodes
        if rows is not None:
            out[f"rows_{store._key}"] = float(rows)
    if host_row_bytes is not None:
        total = 0.0
        for node_type, row_bytes in host_row_bytes.items():
            rows = out.get(f"rows_{node_type}")
            if rows is not None:
                out[f"host_bytes_{node_type}"] = rows * row_bytes
                total += rows * row_bytes
        out["host_bytes"] = total
    return out


def _uncached_row_bytes(trainer: "pl.Trainer") -> Optional[dict[str, int]]:
    """Per featured type, the host row bytes of a heterogeneous DataModule whose batches no GPU feature cache serves
    (every row read from host memory); ``None`` with a cache (its counters tell, per epoch) or another DataModule."""
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is None or getattr(datamodule, "feature_cache", None) is not None:
        return None
    try:
        row_bytes = getattr(datamodule, "feature_row_bytes", None)  # a heterogeneous DataModule's, after setup
    except RuntimeError:  # not set up
        return None
    return None if row_bytes is None else dict(row_bytes)


def _stage_figures(stages: Any) -> dict[str, float]:
    """The step record of the producer's stage split (a ``BuildStages``): ms per stage, the gather's bytes and
    seconds (summed into ``data/gather_build_GBps``) and its bound."""
    out = {f"build_{stage}_ms": 1e3 * seconds for stage, seconds in stages.seconds().items()}
    out["stage_gather_bytes"] = float(stages.gather_bytes)
    out["stage_gather_s"] = float(stages.gather_s)
    if stages.gather_bound_s is not None:
        out["gather_bound_ms"] = 1e3 * stages.gather_bound_s
    if stages.sample_cpu_s is not None:  # the sampling thread measured the sample's host and CPU time (both or none)
        out["build_sample_host_ms"] = 1e3 * stages.sample_host_s
        out["build_sample_cpu_ms"] = 1e3 * stages.sample_cpu_s
    return out


def _record(device: torch.device) -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


def _sampling_metrics(trainer: "pl.Trainer", pipeline_stats: Any) -> dict[str, float]:
    """Hybrid sampling figures of the latest batch: measured and predicted ms, and each device's share."""
    sampling = getattr(pipeline_stats, "sampling", None)
    if sampling is None or sampling.last is None:
        provider = getattr(getattr(trainer, "datamodule", None), "sampling_stats", None)
        sampling = provider("train") if callable(provider) else None
    if sampling is None or sampling.last is None:
        return {}
    out = {"sample_ms": 1e3 * sampling.last.measured_s, "sample_pred_ms": 1e3 * sampling.last.predicted_s}
    for lane in sampling.lanes:
        out[f"share_{lane}"] = sampling.share(lane)
    return out


def _pipeline_stats(trainer: "pl.Trainer"):
    from lightning_zerocopy.callbacks.pipeline import PipelineCallback

    for callback in getattr(trainer, "callbacks", ()):
        if isinstance(callback, PipelineCallback):
            return callback.stats
    return None


class _CacheTotals(NamedTuple):
    """Cumulative rows one process's feature caches served, by source, and the host bytes they read."""

    local: int
    peer: int
    host: int
    host_bytes: int

    def plus(self, other: "_CacheTotals") -> "_CacheTotals":
        return _CacheTotals(*(a + b for a, b in zip(self, other)))

    def since(self, before: Optional["_CacheTotals"]) -> "_CacheTotals":
        """The rows counted after ``before`` (everything, when there is none or the counters restarted since)."""
        if before is None or any(b > a for a, b in zip(self, before)):
            return self
        return _CacheTotals(*(a - b for a, b in zip(self, before)))


def _cached_types(trainer: "pl.Trainer") -> dict[str, Any]:
    """The plan of each featured node type of the strategy's feature cache (``{}`` without one)."""
    return getattr(getattr(getattr(trainer, "strategy", None), "cache_decision", None), "plans", {})


def _cache_counts(trainer: "pl.Trainer") -> dict[tuple[str, str], _CacheTotals]:
    """The feature-cache counters of every process that gathers for this rank, by ``(process, node type)``: process
    ``"trainer"`` (the strategy's caches in this process, which include an in-process pipeline producer's; one GPU
    synchronization) and ``"pipeline"`` (a pipeline worker's, from its latest report, per cache plan mapped to the
    node types of the strategy's ``cache_decision``; no synchronization); each featured type's host bytes at its own
    row bytes. Each process's rows are in exactly one process's entries."""
    out: dict[tuple[str, str], _CacheTotals] = {}
    plans = _cached_types(trainer)
    if not plans:  # no cache (or another strategy)
        return out
    strategy = trainer.strategy
    for node_type, own in (strategy.cache_counts_per_type() or {}).items():  # type: ignore[attr-defined]
        if own is not None:
            width = int(strategy.cache_decision.row_bytes[node_type])  # type: ignore[attr-defined]
            local, peer, host = int(own.local), int(own.peer), int(own.host)
            out[("trainer", node_type)] = _CacheTotals(local, peer, host, host * width)
    report = getattr(_pipeline_stats(trainer), "cache", None)  # a worker process's, through the pipeline's stats
    type_of = {plan.digest: t for t, plan in plans.items()}
    for digest, local, peer, host, width in getattr(report, "per_plan", ()):
        if digest in type_of:
            before = out.get(("pipeline", type_of[digest]), _CacheTotals(0, 0, 0, 0))
            out[("pipeline", type_of[digest])] = before.plus(_CacheTotals(local, peer, host, host * width))
    return out
