"""The training-step benchmark's rows (``benchmarks/parts/step/``): what each row trains, and how a step is timed.

Every row trains the same GraphSAGE (same seed, so the same initial weights; Adam) on the same pre-staged batches:
a plain PyTorch loop, a bare ``LightningModule`` (returns the loss, logs nothing) and ``models.GraphSAGE``, in fp32
or ``bf16-mixed``, untrimmed or trimmed per hop, eager or compiled, with or without ``DataTelemetry``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback

from benchmarks.common.rows import pick_rows

__all__ = ["ROWS", "BareModule", "RowSpec", "StepTimer", "e2e_callbacks", "plain_loop", "select"]


@dataclass(frozen=True)
class RowSpec:
    """One way to run the training step.

    Attributes:
        name: the ``--rows`` name.
        doc: one line for the report.
        kind: ``"plain"`` (a PyTorch loop), ``"bare"`` (a LightningModule that only returns the loss) or ``"ours"``
            (``lightning_zerocopy.models.GraphSAGE``).
        trim: each layer trimmed to the hops it still needs.
        bf16: ``precision="bf16-mixed"`` (the plain loop: ``torch.autocast``).
        telemetry: ``DataTelemetry`` in the Trainer's callbacks.
        compile: ``models.GraphSAGE(compile=True)``.
        e2e: also what ``benchmarks.end_to_end``'s rows add to the Trainer: a ``CSVLogger`` (every
            ``log_every_n_steps``) and its ``TrainClock``.
        fused: ``torch.optim.Adam(fused=True)`` as the model's optimizer.
    """

    name: str
    doc: str
    kind: str
    trim: bool = False
    bf16: bool = False
    telemetry: bool = False
    compile: bool = False
    e2e: bool = False
    fused: bool = False


_ROW_LIST = [
    RowSpec("plain", "plain PyTorch loop (net, Adam, no Lightning), fp32", "plain"),
    RowSpec("bare", "bare LightningModule (returns the loss, logs nothing), fp32", "bare"),
    RowSpec("bare_bf16", "bare, `bf16-mixed`", "bare", bf16=True),
    RowSpec("bare_trim", "bare, each layer trimmed to the hops it still needs (`num_sampled_*_per_hop`), fp32", "bare", trim=True),
    RowSpec("bare_trim_bf16", "bare, trimmed + `bf16-mixed`", "bare", trim=True, bf16=True),
    RowSpec("ours_untrimmed", "`models.GraphSAGE(trim=False)`, fp32", "ours"),
    RowSpec("ours", "`models.GraphSAGE` (trimmed by default), fp32", "ours", trim=True),
    RowSpec("ours_telemetry", "`models.GraphSAGE` + `DataTelemetry`, fp32", "ours", trim=True, telemetry=True),
    RowSpec("ours_e2e", "`models.GraphSAGE` + `DataTelemetry` + a `CSVLogger` and `TrainClock` (what `benchmarks.end_to_end`'s "
            "rows run), fp32", "ours", trim=True, telemetry=True, e2e=True),  # fmt: skip
    RowSpec("ours_e2e_bf16", "`ours_e2e`, `bf16-mixed` (benchmarks.end_to_end's rows on a GPU)", "ours", trim=True, bf16=True,
            telemetry=True, e2e=True),  # fmt: skip
    RowSpec("ours_fused", "`models.GraphSAGE` + `DataTelemetry`, `Adam(fused=True)` (one optimizer kernel per dtype and "
            "device), fp32", "ours", trim=True, telemetry=True, fused=True),  # fmt: skip
    RowSpec("ours_bf16", "`models.GraphSAGE` + `DataTelemetry`, `bf16-mixed` (the GPU recipes)", "ours", trim=True,
            bf16=True, telemetry=True),  # fmt: skip
    RowSpec("ours_compiled", "`models.GraphSAGE(compile=True)`, fp32", "ours", trim=True, compile=True),
    RowSpec("ours_compiled_bf16", "`models.GraphSAGE(compile=True)` + `DataTelemetry`, `bf16-mixed`", "ours", trim=True,
            bf16=True, telemetry=True, compile=True),  # fmt: skip
]

#: Every row by name, in the report's order.
ROWS: dict[str, RowSpec] = {row.name: row for row in _ROW_LIST}


def select(names: str) -> list[RowSpec]:
    """The rows of a comma-separated list (``all``: every row), in the order given (see :func:`pick_rows`)."""
    return pick_rows(names, ROWS, "--rows")


def hop_kwargs(batch: Any, trim: bool) -> dict[str, Any]:
    """What a PyG ``BasicGNN`` needs to trim per hop (the batch's counts; as many hops as layers here)."""
    if not trim:
        return {}
    return {"num_sampled_nodes_per_hop": batch.num_sampled_nodes, "num_sampled_edges_per_hop": batch.num_sampled_edges}


class BareModule(pl.LightningModule):
    """The least a LightningModule does: the seed nodes' cross-entropy, returned; no metric, no logging."""

    def __init__(self, net: torch.nn.Module, lr: float, trim: bool) -> None:
        super().__init__()
        self.net, self.lr, self.trim = net, lr, trim

    def _seed_logits(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.net(batch.x, batch.edge_index, **hop_kwargs(batch, self.trim))
        return out[: batch.batch_size], batch.y[: batch.batch_size]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        out, y = self._seed_logits(batch)
        return F.cross_entropy(out, y, ignore_index=-1)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class _Marks:
    """Timestamps at the start of every step (CUDA events on a GPU: no synchronization while training)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []
        self.wall: list[float] = []  # host time after synchronizing, at the end of warm-up and at the end

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def wall_mark(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.wall.append(time.perf_counter())

    def result(self, warmup: int) -> dict[str, Any]:
        """Median ms of the steps after ``warmup`` (start to next start) and their mean from host wall time."""
        if self.cuda:
            torch.cuda.synchronize()
            ms = [a.elapsed_time(b) for a, b in zip(self.marks[warmup:], self.marks[warmup + 1 :])]
        else:
            ms = [1e3 * (b - a) for a, b in zip(self.marks[warmup:], self.marks[warmup + 1 :])]
        steps = len(self.marks) - 1 - warmup
        mean = 1e3 * (self.wall[-1] - self.wall[0]) / steps if len(self.wall) == 2 and steps > 0 else None
        return {"median_ms": statistics.median(ms) if ms else None, "mean_ms": mean, "timed_steps": len(ms),
                "p90_ms": statistics.quantiles(ms, n=10)[-1] if len(ms) >= 2 else None}  # fmt: skip


class StepTimer(Callback):
    """Marks the start of every training step and the end of the last; keeps the last step's loss (on the device:
    read once training has ended)."""

    def __init__(self, device: torch.device, warmup: int) -> None:
        self.marks, self.warmup = _Marks(device), warmup
        self.last_loss: Optional[torch.Tensor] = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup:
            self.marks.wall_mark()
        self.marks.mark()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.last_loss = outputs["loss"].detach() if isinstance(outputs, dict) else outputs.detach()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.marks.mark()
        self.marks.wall_mark()

    def result(self) -> dict[str, Any]:
        loss = None if self.last_loss is None else float(self.last_loss)
        return {**self.marks.result(self.warmup), "final_loss": loss}


def e2e_callbacks(root: str, warmup: int, device: torch.device) -> tuple[Any, list[Callback]]:
    """What ``benchmarks.end_to_end``'s rows add to a Trainer: a ``CSVLogger`` under ``root`` and its ``TrainClock`` (its
    ``BatchCheck`` looks at the first batches only, no steady-state step)."""
    from pytorch_lightning.loggers import CSVLogger

    from benchmarks.common.measure import TrainClock

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    return CSVLogger(root, name="step", version=""), [TrainClock(warmup, 0.0, sync)]


def plain_loop(net: torch.nn.Module, loader: Any, lr: float, bf16: bool, device: torch.device, warmup: int,
               on_step_start: Optional[Callable[[int], None]] = None) -> dict[str, Any]:  # fmt: skip
    """The training step without Lightning: forward on the seeds, cross-entropy, backward, Adam; timed as
    :class:`StepTimer` times a Trainer. ``on_step_start(i)`` is called first at the start of every step and after
    the last (a profiler's marks)."""
    net.to(device).train()
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    marks = _Marks(device)
    loss = None
    i = -1
    for i, batch in enumerate(loader):
        if on_step_start is not None:
            on_step_start(i)
        if i == warmup:
            marks.wall_mark()
        marks.mark()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = net(batch.x, batch.edge_index)[: batch.batch_size]
            loss = F.cross_entropy(out, batch.y[: batch.batch_size], ignore_index=-1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if on_step_start is not None:
        on_step_start(i + 1)
    marks.mark()
    marks.wall_mark()
    return {**marks.result(warmup), "final_loss": None if loss is None else float(loss)}
