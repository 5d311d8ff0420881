"""Sums of :class:`~lightning_zerocopy.callbacks.DataTelemetry`'s per-step figures, and how they reach the logger.

A run of steps (the steps since the last hand-over, or a whole epoch) is kept as sums on the host
(:class:`StepSums`), and every figure is a :class:`Ratio` of two sums: the stall share is the stalled time over the
step time, SEPS the sampled edges over the time they took, a mean in ms a total over the steps. Across DDP ranks
the same ratios hold when numerator and denominator are summed over the ranks first: :func:`log_epoch_figures`
sums them in one collective and logs the ratios of the sums (exact; a plain mean of the ranks' ratios would not be).
Rates (SEPS, GB/s) are therefore per rank: the ranks' edges or bytes over the ranks' time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

__all__ = ["Ratio", "StepSums", "log_epoch_figures", "reduce_over_ranks"]


@dataclass
class StepSums:
    """Totals of a run of training steps (host numbers; adding a step touches no tensor)."""

    steps: int = 0
    stall_s: float = 0.0
    interval_s: float = 0.0
    wait_s: float = 0.0
    edges: float = 0.0
    edges_s: float = 0.0  # the step time of the steps whose batch had an edge_index
    x_bytes: float = 0.0
    x_s: float = 0.0  # the step time of the steps whose batch had features
    build_gather_bytes: float = 0.0  # the producer's gathered feature bytes (steps whose batch had a stage split)
    build_gather_s: float = 0.0  # ... and the time its gather stage took for them
    #: per-step values averaged as they come (build and stage times, the gather's bound, sampling times, device
    #: shares, a heterogeneous batch's sampled nodes and host bytes per type): key -> (sum, count)
    means: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def of(cls, step: dict[str, float]) -> "StepSums":
        """The sums of one step (its figures are that step's)."""
        sums = cls()
        sums.add(step)
        return sums

    def add(self, step: dict[str, float]) -> None:
        """Count one step's figures (:meth:`DataTelemetry`'s per-step record: seconds, edges, bytes, ms)."""
        interval = step["interval_s"]
        self.steps += 1
        self.stall_s += step["stall_s"]
        self.interval_s += interval
        self.wait_s += step["wait_s"]
        if step["edges"] >= 0:
            self.edges += step["edges"]
            self.edges_s += interval
        if step["x_bytes"] >= 0:
            self.x_bytes += step["x_bytes"]
            self.x_s += interval
        if "stage_gather_s" in step:
            self.build_gather_bytes += step["stage_gather_bytes"]
            self.build_gather_s += step["stage_gather_s"]
        for key, value in step.items():
            if key.startswith(("build_", "sample_", "share_", "rows_", "host_bytes")) or key == "gather_bound_ms":
                acc = self.means.setdefault(key, [0.0, 0])
                acc[0] += value
                acc[1] += 1

    def figures(self) -> dict[str, "Ratio"]:
        """``data/<name>`` -> its ratio (empty without steps)."""
        if self.steps == 0:
            return {}
        out = {
            "data/stall_ms": Ratio(self.stall_s, self.steps, 1e3),
            "data/stall_frac": Ratio(self.stall_s, self.interval_s),
            "data/step_ms": Ratio(self.interval_s, self.steps, 1e3),
            "data/wait_ms": Ratio(self.wait_s, self.steps, 1e3),
        }
        if self.edges_s > 0:
            out["data/seps"] = Ratio(self.edges, self.edges_s)
        if self.x_s > 0:
            out["data/gather_GBps"] = Ratio(self.x_bytes, self.x_s, 1e-9)
        if self.build_gather_s > 0:
            out["data/gather_build_GBps"] = Ratio(self.build_gather_bytes, self.build_gather_s, 1e-9)
        for key, (total, count) in sorted(self.means.items()):
            out[f"data/{key}"] = Ratio(total, count)
        return out


@dataclass(frozen=True)
class Ratio:
    """``scale * numerator / denominator`` (0 when the denominator is); ``denominator=None``: a plain total."""

    numerator: float
    denominator: Optional[float] = None
    scale: float = 1.0

    @property
    def value(self) -> float:
        if self.denominator is None:
            return self.scale * self.numerator
        return self.scale * self.numerator / self.denominator if self.denominator else 0.0


def reduce_over_ranks(trainer: Any, pl_module: Any, figures: dict[str, Ratio]) -> dict[str, float]:
    """Each figure over every DDP rank: numerators and denominators summed over the ranks (one collective, on
    the module's device as NCCL wants; it waits for the GPU, so call it at an epoch's end), then divided. A figure
    some rank lacks (e.g. a sampling device it never used) counts as nothing there."""
    figures = _on_every_rank(figures)
    if not figures:
        return {}
    parts = [(r.numerator, r.denominator or 0.0) for r in figures.values()]
    sums = torch.tensor(parts, dtype=torch.float64, device=getattr(pl_module, "device", None))
    reduce = getattr(getattr(trainer, "strategy", None), "reduce", None)
    if reduce is not None:
        sums = reduce(sums, reduce_op="sum")
    out = {}
    for (name, ratio), (num, den) in zip(figures.items(), sums.tolist()):
        out[name] = Ratio(num, None if ratio.denominator is None else den, ratio.scale).value
    return out


def _on_every_rank(figures: dict[str, Ratio]) -> dict[str, Ratio]:
    """``figures`` with the names of every rank's figures (one small collective when a process group runs), so
    that every rank reduces, and logs, the same figures in the same order."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return figures
    kinds = [(name, r.denominator is None, r.scale) for name, r in figures.items()]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, kinds)
    out: dict[str, Ratio] = {}
    for name, total, scale in sorted({kind for rank in everyone for kind in rank}):
        out[name] = figures.get(name, Ratio(0.0, None if total else 0.0, scale))
    return out


def log_epoch_figures(trainer: Any, pl_module: Any, figures: dict[str, Ratio], suffix: str = "") -> dict[str, float]:
    """Log each figure once at an epoch's end, over every DDP rank (:func:`reduce_over_ranks`); returns them.

    Every rank must call it (it runs collectives under DDP); a figure only some ranks have is logged by all.
    """
    reduced = reduce_over_ranks(trainer, pl_module, figures)
    device = getattr(pl_module, "device", None)
    for name, value in reduced.items():
        # the value is already the same on every rank: `max` over the ranks leaves it as it is, and with
        # sync_dist Lightning knows the figure is meant for the whole job (it warns about unsynced epoch figures)
        pl_module.log(name + suffix, torch.tensor(value, dtype=torch.float64, device=device), on_step=False,
                      on_epoch=True, sync_dist=True, reduce_fx="max")  # fmt: skip
    return reduced
