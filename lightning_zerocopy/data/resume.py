"""Resuming an interrupted epoch on another number of ranks: train exactly the seeds the epoch has left.

A :class:`~lightning_zerocopy.data.plan.BatchPlan` is a pure function of (seed, epoch, rank, world size, step), so
the batches an interrupted epoch already trained are known from its progress alone. Ranks run in lockstep (every
rank of a plan has the same number of steps), so one number per *segment* says how far every rank got: an epoch
starts under one world size and may be resumed, once or more, under others; each resumption is a segment
``(world_size, batch_size, steps)``. A checkpoint stores the epoch's segments (the loader's state), and a resume on
another world size (or batch size) deals the seeds left over the new ranks:

* the epoch's batches under the previous segment, rank by rank within each step, minus those already trained, give
  the remaining seed positions in order (each once: wrap-around padding repeats are dropped);
* they are cut into ``steps * world_size`` batches of near-equal size (at most ``batch_size`` each whenever
  ``steps`` fits the new plan's epoch), batch ``j`` going to rank ``j % world_size`` at step ``j // world_size``;
* those batches are the *last* ``steps`` steps of the new plan's epoch (:class:`ResumedPlan`), so the trainer's
  batch count for the epoch ends where every later epoch does (:func:`align_fit_progress` moves it there).

Later epochs are the new plan's own. Fewer seeds left than ranks is the one case that repeats seeds (each rank needs
a batch): the remaining ones are padded by wrapping around.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from lightning_zerocopy.data.plan import BatchPlan, PlanItem, derive_seed

__all__ = ["EpochSegment", "ResumedPlan", "align_fit_progress", "remaining_positions"]


@dataclass(frozen=True)
class EpochSegment:
    """A stretch of one epoch run under one world size: every rank trained ``steps`` batches of it."""

    world_size: int
    batch_size: int
    steps: int

    def as_list(self) -> list[int]:
        return [self.world_size, self.batch_size, self.steps]


def _plan_like(plan: BatchPlan, world_size: int, batch_size: int, rank: int) -> BatchPlan:
    return BatchPlan(plan.input_nodes, batch_size, shuffle=plan.shuffle, drop_last=plan.drop_last, seed=plan.seed,
                     rank=rank, world_size=world_size, stream=plan.stream)  # fmt: skip


def _normal_batches(plan: BatchPlan, epoch: int, world_size: int, batch_size: int) -> list[list[torch.Tensor]]:
    """Positions of every batch of ``epoch`` under a plan like ``plan`` with this world and batch size: [step][rank]."""
    ranks = [_plan_like(plan, world_size, batch_size, r) for r in range(world_size)]
    return [[p.item(epoch, step).input_id for p in ranks] for step in range(len(ranks[0]))]


def _deal(remaining: torch.Tensor, world_size: int, steps: int) -> list[list[torch.Tensor]]:
    """``remaining`` cut into ``steps * world_size`` near-equal batches: [step][rank] (padded by wrapping around when
    there are fewer positions than batches, the only case that repeats a seed)."""
    count = steps * world_size
    if remaining.numel() < count:
        remaining = remaining.repeat(-(-count // remaining.numel()))[:count]
    chunks = torch.tensor_split(remaining, count)
    return [[chunks[step * world_size + r] for r in range(world_size)] for step in range(steps)]


def _remainder_steps(num_remaining: int, world_size: int, batch_size: int, max_steps: int) -> int:
    """Steps that train ``num_remaining`` seeds on ``world_size`` ranks in batches of at most ``batch_size``, or
    ``max_steps`` (the new plan's epoch; larger batches then) when that is fewer."""
    if num_remaining == 0:
        return 0
    return max(1, min(-(-num_remaining // (world_size * batch_size)), max_steps))


def remaining_positions(plan: BatchPlan, epoch: int, segments: Sequence[EpochSegment]) -> torch.Tensor:
    """Positions (into ``plan.input_nodes``) of the seeds of ``epoch`` not trained by ``segments``, in epoch order.

    ``plan`` gives the epoch's order (shuffle, seed, stream, inputs); the first segment ran its normal batches, each
    later one the remainder batches dealt from what the segments before it left (:class:`ResumedPlan`).
    """
    if not segments:
        raise ValueError("`segments` is empty: give at least the segment the epoch started with")
    first = segments[0]
    batches = _normal_batches(plan, epoch, first.world_size, first.batch_size)
    remaining = torch.empty(0, dtype=torch.int64)
    for index, segment in enumerate(segments):
        if index > 0:
            steps = _remainder_steps(remaining.numel(), segment.world_size, segment.batch_size,
                                     len(_plan_like(plan, segment.world_size, segment.batch_size, 0)))  # fmt: skip
            batches = _deal(remaining, segment.world_size, steps) if steps else []
        done = [b for step in batches[: segment.steps] for b in step]
        left = [b for step in batches[segment.steps :] for b in step]
        remaining = _unique_in_order(torch.cat(left) if left else torch.empty(0, dtype=torch.int64))
        if done:
            remaining = remaining[~torch.isin(remaining, torch.cat(done))]
    return remaining


def _unique_in_order(positions: torch.Tensor) -> torch.Tensor:
    """``positions`` with every repeat after the first occurrence dropped, order kept."""
    if positions.numel() == 0:
        return positions
    values, inverse = torch.unique(positions, return_inverse=True)
    first = torch.full((values.numel(),), positions.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(positions.numel()), reduce="amin")
    return positions[first.sort().values]


class ResumedPlan:
    """``plan`` whose epoch ``epoch`` deals only the seeds ``segments`` left, over ``plan``'s ranks, in its last steps.

    Every other epoch is ``plan``'s own. Steps before :attr:`start_step` of the resumed epoch are not part of it. What
    is dealt are the positions of ``plan.positions_plan`` (a node plan's seeds, a link plan's positive edges), and
    ``plan.expand`` makes each dealt batch the plan's item (a link plan's: endpoints, negatives, link fields).

    Args:
        plan: this rank's plan under the new world size and batch size (a ``BatchPlan`` or ``LinkBatchPlan``).
        epoch: the interrupted epoch.
        segments: how the epoch ran so far (see :func:`remaining_positions`).
    """

    def __init__(self, plan: BatchPlan, epoch: int, segments: Sequence[EpochSegment]) -> None:
        self.base = plan
        self.epoch = int(epoch)
        self.segments = tuple(segments)
        positions_plan = plan.positions_plan
        remaining = remaining_positions(positions_plan, epoch, self.segments)
        steps = _remainder_steps(remaining.numel(), plan.world_size, plan.batch_size, len(positions_plan))
        self._batches = [step[plan.rank] for step in _deal(remaining, plan.world_size, steps)] if steps else []
        #: first step of the resumed epoch (its batches are steps start_step .. len(plan) - 1)
        self.start_step = len(plan) - steps

    def __len__(self) -> int:
        return len(self.base)

    def __getattr__(self, name: str) -> Any:  # batch_size, rank, world_size, input_nodes, ... of the base plan
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def item(self, epoch: int, step: int) -> PlanItem:
        """Batch ``step`` of ``epoch`` on this rank; in the resumed epoch, one of the remainder batches."""
        if epoch != self.epoch:
            return self.base.item(epoch, step)
        if not self.start_step <= step < len(self.base):
            raise IndexError(f"step {step} of resumed epoch {epoch} is outside its steps [{self.start_step}, {len(self)})")
        positions = self._batches[step - self.start_step]
        p = self.base.positions_plan
        batch_seed = derive_seed(p.seed, p.stream, epoch, p.world_size, p.rank, step, len(self.segments))
        return self.base.expand(p.item_of(positions, batch_seed, epoch, step))

    def __repr__(self) -> str:
        return f"ResumedPlan({self.base!r}, epoch={self.epoch}, start_step={self.start_step}, segments={self.segments})"


def align_fit_progress(trainer: Any, step: int) -> None:
    """Set the fit loop's batch count of the current (restored, interrupted) epoch to ``step``.

    A resumed epoch on another world size runs its remainder in the new plan's last steps; Lightning restored the
    interrupted run's count, which belongs to the old plan. Moving it keeps the epoch's end, validation and the
    progress bar where the new plan's epochs have them (the global step, which counts optimizer steps, is untouched).
    """
    progress: Optional[Any] = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "batch_progress", None)
    if progress is None:
        return
    delta = int(step) - int(progress.current.ready)  # ready: the batches the checkpoint had fetched = its loader step
    for counts in (progress.current, progress.total):
        counts.ready += delta
        counts.started += delta
        counts.processed += delta
        counts.completed += delta
