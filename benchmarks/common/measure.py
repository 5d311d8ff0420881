"""What the end-to-end benchmarks (e2e, link, step) measure in a row's Trainer: training time, validation accuracy
over it, batches.

``TrainClock`` times training without validation (host timers between device synchronizations), records
validation accuracy over that time and stops a row at its time budget; ``FirstBatchesCheck`` is what a benchmark's
check of its first batches against the dataset shares (``BatchCheck``: node classification's); ``summarize`` turns the
clock, the check and ``DataTelemetry``'s history into a row's figures; ``_sync`` and ``_device_name`` are the device
synchronization around host timers and the device named in a row's result.
"""

from __future__ import annotations

import hashlib
import time
from abc import ABCMeta, abstractmethod
from typing import Any, Callable, Optional

import torch
from pytorch_lightning.callbacks import Callback

__all__ = ["BUILD_STAGES", "BatchCheck", "FirstBatchesCheck", "TrainClock", "summarize"]

#: the stages of the pipeline producer's build, as ``DataTelemetry`` names them (``data/build_<stage>_ms``); spelled
#: out here: importing the pipeline would import PyG, which initializes CUDA before an MPS row joins its daemon
BUILD_STAGES = ("sample", "gather", "assemble", "handover")


class TrainClock(Callback):
    """Training wall time without validation, validation accuracy over it, steady-state steps/s, a time budget.

    Host timers between device synchronizations at the boundaries (train start/end, each validation, the end of
    warm-up), so the GPU's queued work is counted where it ran. ``metric``: the validation metric recorded
    (``val_acc`` for node classification, ``val_auroc`` for link prediction).
    """

    def __init__(self, warmup: int, budget_s: float, sync: Callable[[], None], stop_at: Optional[float] = None,
                 metric: str = "val_acc") -> None:  # fmt: skip
        self.warmup, self.budget_s, self.sync, self.stop_at, self.metric = warmup, budget_s, sync, stop_at, metric
        self.train_started: Optional[float] = None  # host time of on_train_start (after the Trainer's setup)
        self.train_s = 0.0
        self._resume: Optional[float] = None
        self.steady: Optional[tuple[int, float]] = None  # (global step, train seconds) at the end of warm-up
        self.end: Optional[tuple[int, float]] = None
        self.steady_wall: list[float] = []  # wall-clock (time.time) start and end of the steady window
        self.val_curve: list[list[float]] = []  # [global step, train seconds, the validation metric]
        self.stopped_by_budget = False
        self.stopped_at_target = False

    def elapsed(self) -> float:
        return self.train_s + (time.perf_counter() - self._resume if self._resume is not None else 0.0)

    def _pause(self) -> None:
        self.sync()
        self.train_s = self.elapsed()
        self._resume = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.sync()
        self._resume = self.train_started = time.perf_counter()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.steady is None and trainer.global_step >= self.warmup:
            self.sync()
            self.steady = (trainer.global_step, self.elapsed())
            self.steady_wall = [time.time()]

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.budget_s > 0 and self.steady is not None and self.elapsed() > self.budget_s:
            trainer.should_stop = True
            self.stopped_by_budget = True

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking and self._resume is not None:
            self._pause()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        acc = trainer.callback_metrics.get(self.metric)
        if acc is not None:
            self.val_curve.append([trainer.global_step, self.train_s, float(acc)])
            if self.stop_at is not None and float(acc) >= self.stop_at and self.steady is not None:
                trainer.should_stop = True  # --stop-at-target: the target is reached (after warm-up)
                self.stopped_at_target = True
        self.sync()
        self._resume = time.perf_counter()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._resume is not None:
            self._pause()
        self.end = (trainer.global_step, self.train_s)
        if len(self.steady_wall) == 1:
            self.steady_wall.append(time.time())

    def steps_per_s(self) -> Optional[float]:
        if self.steady is None or self.end is None or self.end[0] <= self.steady[0]:
            return None
        return (self.end[0] - self.steady[0]) / max(self.end[1] - self.steady[1], 1e-9)


class FirstBatchesCheck(Callback, metaclass=ABCMeta):
    """Checks the first ``count`` training batches against the dataset (:meth:`check`, which appends what it finds
    wrong to ``result["problems"]``); ``result`` holds ``checked``, ``ok`` and ``problems`` (and what a check adds).

    With ``every`` > 0 it also checks every ``every``-th batch after those, each twice: when its step starts and
    again when it ends (a problem found then names "at the step's end"): a batch that was right when handed over
    and wrong after its step was rewritten while the step ran (a slot reused too early)."""

    def __init__(self, count: int, every: int = 0) -> None:
        self.count, self.every = count, every
        self.result: dict[str, Any] = {"checked": 0, "ok": True, "problems": []}

    @abstractmethod
    def check(self, step: int, batch: Any, pl_module: Any) -> None:
        """Append ``batch``'s problems (each naming ``step``) to ``result["problems"]``."""

    def _sampled(self, step: int) -> bool:
        return self.every > 0 and step >= self.count and step % self.every == 0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step >= self.count and not self._sampled(step):
            return
        self.check(step, batch, pl_module)
        self.result["checked"] += 1
        self.result["ok"] = not self.result["problems"]

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step - 1  # the optimizer step of this batch has counted
        if not self._sampled(step):
            return
        problems = self.result["problems"]
        before = len(problems)
        self.check(step, batch, pl_module)
        problems[before:] = [f"{p} (at the step's end)" for p in problems[before:]]
        self.result["checked_at_end"] = self.result.get("checked_at_end", 0) + 1
        self.result["ok"] = not problems


class BatchCheck(FirstBatchesCheck):
    """Compares the first ``count`` training batches with the dataset: seeds in plan order, ``x``, ``y`` and
    ``edge_index`` bounds, per-hop counts that add up to the batch (``x``: the dataset's rows cast to ``stored_dtype``
    when the host table stores another dtype, then to the batch's); keeps a fingerprint of the first batch's sample
    (``n_id``, ``edge_index``), its per-hop counts and whether the module trimmed it (``trimmed``: the module's
    ``trim`` is on and the batch has the counts). Speed must not come from wrong batches."""

    def __init__(self, expected_seeds: Callable[[int], torch.Tensor], x: torch.Tensor, y: torch.Tensor, count: int,
                 stored_dtype: Optional[torch.dtype] = None, every: int = 0) -> None:  # fmt: skip
        super().__init__(count, every)
        self.expected_seeds, self.x, self.y = expected_seeds, x, y
        self.stored_dtype = stored_dtype  # the host table's dtype (feature_dtype): x is the dataset's rows cast to it

    def check(self, step: int, batch: Any, pl_module: Any) -> None:
        problems = self.result["problems"]
        bs = int(batch.batch_size)
        n_id = batch.n_id.cpu()
        if not torch.equal(n_id[:bs], self.expected_seeds(step)):
            problems.append(f"step {step}: seeds differ from the plan")
        want_x = self.x[n_id] if self.stored_dtype is None else self.x[n_id].to(self.stored_dtype)
        if not torch.equal(batch.x.cpu(), want_x.to(batch.x.dtype)):
            problems.append(f"step {step}: x differs from the dataset's rows at n_id")
        if not torch.equal(batch.y[:bs].cpu(), self.y[n_id[:bs]].to(batch.y.dtype)):
            problems.append(f"step {step}: y differs from the dataset's labels")
        ei = batch.edge_index
        if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n_id.numel()):
            problems.append(f"step {step}: edge_index out of range")
        nodes, edges = getattr(batch, "num_sampled_nodes", None), getattr(batch, "num_sampled_edges", None)
        if nodes is not None and edges is not None:
            nodes, edges = [int(n) for n in nodes], [int(e) for e in edges]
            if sum(nodes) != n_id.numel() or sum(edges) != ei.size(1):
                problems.append(f"step {step}: num_sampled_nodes / num_sampled_edges do not add up to the batch")
        if step == 0:  # our rows sample bitwise alike on every placement: the report compares these
            self.result["num_sampled_nodes"], self.result["num_sampled_edges"] = nodes, edges
            self.result["x_dtype"] = str(batch.x.dtype).removeprefix("torch.")  # what the model was handed
            self.result["trimmed"] = bool(getattr(pl_module, "trim", False)) and nodes is not None and edges is not None
            ids = torch.cat([n_id.long(), batch.edge_index.cpu().long().flatten()])  # dtype-independent
            self.result["first_sample"] = hashlib.sha1(ids.numpy().tobytes()).hexdigest()[:12]


def summarize(clock: TrainClock, telemetry: Any, warmup: int) -> dict[str, Any]:
    """Steady-state figures of a row: steps/s, stall share, feature GB/s, per-batch latency (after ``warmup``
    steps), validation accuracy over training time, the producer's build split (``build_stages_ms``, each ``None``
    without a pipeline); ``telemetry`` is the row's ``DataTelemetry``."""
    hist = telemetry.history[warmup:] or telemetry.history
    mean = lambda key: (sum(h[key] for h in hist if key in h) / n) if (n := sum(key in h for h in hist)) else None  # noqa: E731
    step_ms = [h["data/step_ms"] for h in hist]
    return {
        "steps": clock.end[0] if clock.end else 0,
        "train_s": clock.end[1] if clock.end else None,
        "steps_per_s": clock.steps_per_s(),
        "stopped_by_budget": clock.stopped_by_budget,
        "stopped_at_target": clock.stopped_at_target,
        "val_curve": clock.val_curve,
        "steady_wall": clock.steady_wall if len(clock.steady_wall) == 2 else None,
        "final_val_acc": clock.val_curve[-1][2] if clock.val_curve else None,
        "best_val_acc": max((v[2] for v in clock.val_curve), default=None),
        "stall_frac": mean("data/stall_frac"),
        "wait_ms": mean("data/wait_ms"),
        "gather_GBps": mean("data/gather_GBps"),
        "seps": mean("data/seps"),
        "build_ms": mean("data/build_ms"),
        # the producer's build split (a pipeline row): ms per stage, the gather's rate and its PCIe bound
        "build_stages_ms": {stage: mean(f"data/build_{stage}_ms") for stage in BUILD_STAGES},
        "gather_build_GBps": mean("data/gather_build_GBps"),
        "gather_bound_ms": mean("data/gather_bound_ms"),
        "step_ms": step_ms[:: max(1, len(step_ms) // 2000)],
        # every DataTelemetry key's mean, including those of features added later (hybrid shares, cache hits)
        "telemetry": {key[len("data/") :]: mean(key) for key in dict.fromkeys(k for h in hist for k in h)},
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_name(cuda: bool) -> str:
    return torch.cuda.get_device_name(0) if cuda else "cpu"
