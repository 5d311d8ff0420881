"""Resuming an interrupted epoch under another world size or batch size trains exactly the seeds it had left."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from lightning_zerocopy.data.plan import BatchPlan
from lightning_zerocopy.data.resume import EpochSegment, ResumedPlan, remaining_positions


def _plans(world: int, batch_size: int, **kwargs) -> list[BatchPlan]:
    inputs = torch.arange(1000, 2000 + kwargs.pop("extra", 0))
    return [BatchPlan(inputs, batch_size, rank=r, world_size=world, seed=3, shuffle=True, **kwargs) for r in range(world)]


def _trained(plans, epoch: int, steps: range) -> list[int]:
    return [int(s) for step in steps for p in plans for s in p.item(epoch, step).seed_ids]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("old", "new", "done"), [((1, 40), (2, 40), 13), ((2, 40), (1, 40), 7), ((2, 40), (3, 25), 9),
                                                  ((3, 64), (2, 64), 1), ((1, 40), (4, 40), 24)])  # fmt: skip
def test_every_seed_of_the_epoch_trains_once(drop_last: bool, old, new, done: int) -> None:
    epoch = 2
    before = _plans(*old, drop_last=drop_last, extra=7)
    epoch_seeds = set(_trained(before, epoch, range(len(before[0]))))
    first = _trained(before, epoch, range(done))
    after = [ResumedPlan(p, epoch, [EpochSegment(old[0], old[1], done)]) for p in _plans(*new, drop_last=drop_last, extra=7)]
    start = after[0].start_step
    assert all(p.start_step == start for p in after) and 0 <= start < len(after[0])
    rest = _trained(after, epoch, range(start, len(after[0])))
    counts = Counter(first + rest)
    assert set(counts) == epoch_seeds and max(counts.values()) == 1  # every seed exactly once
    sizes = [p.item(epoch, step).batch_size for p in after for step in range(start, len(p))]
    assert max(sizes) <= new[1] and max(sizes) - min(sizes) <= 1
    # later epochs are the new plan's own
    assert torch.equal(after[0].item(epoch + 1, 0).seed_ids, _plans(*new, drop_last=drop_last, extra=7)[0].item(epoch + 1, 0).seed_ids)


def test_a_resumed_epoch_can_be_resumed_again() -> None:
    """1 rank for 10 steps, then 2 ranks for 3 steps of the remainder, then 3 ranks: still each seed once."""
    epoch, old, mid, new = 0, _plans(1, 50), _plans(2, 50), _plans(3, 50)
    first = _trained(old, epoch, range(10))
    middle_plans = [ResumedPlan(p, epoch, [EpochSegment(1, 50, 10)]) for p in mid]
    s = middle_plans[0].start_step
    middle = _trained(middle_plans, epoch, range(s, s + 3))
    segments = [EpochSegment(1, 50, 10), EpochSegment(2, 50, 3)]
    last_plans = [ResumedPlan(p, epoch, segments) for p in new]
    last = _trained(last_plans, epoch, range(last_plans[0].start_step, len(last_plans[0])))
    counts = Counter(first + middle + last)
    assert set(counts) == set(range(1000, 2000)) and max(counts.values()) == 1
    left = remaining_positions(new[0], epoch, segments)
    assert left.numel() == 1000 - 500 - 300


def test_more_steps_than_the_new_epoch_has_use_larger_batches() -> None:
    """A remainder that needs more steps of batch_size than the new plan's epoch has is dealt into that many steps."""
    before = _plans(1, 100, drop_last=True)
    after = [ResumedPlan(p, 0, [EpochSegment(1, 100, 1)]) for p in _plans(8, 100, drop_last=True)]
    assert after[0].start_step == 0 and len(after[0]) == 1
    counts = Counter(_trained(before, 0, range(1)) + _trained(after, 0, range(1)))
    assert len(counts) == 1000 and max(counts.values()) == 1
