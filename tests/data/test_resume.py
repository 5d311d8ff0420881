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


def test_plan_loader_state_records_segments_and_resumes_them() -> None:
    from lightning_zerocopy.data.loader import PlanLoader

    two = [PlanLoader(p, builder=None) for p in _plans(2, 40)]
    state = two[0].state_dict_at(1, 3)
    assert state["segments"] == [[2, 40, 3]]
    calls: list[int] = []
    one = PlanLoader(_plans(1, 40)[0], builder=None, on_resume=calls.append)
    one.load_state_dict(state)
    assert isinstance(one.plan, ResumedPlan) and calls == [one.start_step] and one.start_step > 0
    # interrupted again two steps into the remainder: the same world resumes the same remainder, where it stopped
    again_state = one.state_dict_at(1, one.start_step + 2)
    assert again_state["segments"] == [[2, 40, 3], [1, 40, 2]]
    again = PlanLoader(_plans(1, 40)[0], builder=None, on_resume=calls.append)
    again.load_state_dict(again_state)
    assert again.start_step == one.start_step + 2 and len(calls) == 1
    for step in range(again.start_step, len(again)):
        assert torch.equal(again.plan.item(1, step).seed_ids, one.plan.item(1, step).seed_ids)
    # ... and another world deals what is left
    three = [PlanLoader(p, builder=None) for p in _plans(3, 40)]
    for loader in three:
        loader.load_state_dict(again_state)
    trained = (_trained([l.plan for l in two], 1, range(3)) + _trained([one.plan], 1, range(one.start_step, one.start_step + 2))
               + _trained([l.plan for l in three], 1, range(three[0].start_step, len(three[0]))))  # fmt: skip
    counts = Counter(trained)
    assert set(counts) == set(range(1000, 2000)) and max(counts.values()) == 1


def test_plan_loader_reads_checkpoints_without_segments_and_warns_on_another_order() -> None:
    from lightning_zerocopy.data.loader import PlanLoader

    state = PlanLoader(_plans(2, 40)[0], builder=None).state_dict_at(0, 5)
    del state["segments"]  # a checkpoint of an earlier version: its fingerprint gives the world size
    loader = PlanLoader(_plans(1, 40)[0], builder=None)
    loader.load_state_dict(state)
    assert isinstance(loader.plan, ResumedPlan) and loader.plan.segments == (EpochSegment(2, 40, 5),)
    state["plan"]["seed"] = 99
    with pytest.warns(UserWarning, match="batch plan changed"):
        loader.load_state_dict(state)
    assert loader.plan is loader.base_plan and loader.start_step == 5


@pytest.mark.parametrize("typed", [False, True])
def test_a_link_plan_resumed_on_another_world_size_deals_the_positive_edges_left(typed: bool) -> None:
    """A link plan deals its positive edges' positions (``positions_plan``): the resumed epoch trains each edge it had
    left once, as link items (endpoints, negatives, labels), homogeneous or on a typed edge type. Before, the
    remainder was dealt over the split's distinct endpoints as node items, without link fields."""
    from lightning_zerocopy.data.link_plan import LinkBatchPlan, LinkPlanItem
    from lightning_zerocopy.data.negatives import NegativeDraws, parse_neg_sampling

    gen = torch.Generator().manual_seed(0)
    pos = torch.stack([torch.randint(0, 50, (333,), generator=gen), torch.randint(0, 30, (333,), generator=gen)])
    typed_args = dict(edge_type=("user", "rates", "item"), num_dst_nodes=30) if typed else {}

    def plans(world: int) -> list[LinkBatchPlan]:
        config = parse_neg_sampling("binary", 1.0, "")
        negatives = NegativeDraws(config, 50, None, "", num_dst_nodes=30 if typed else None)
        return [LinkBatchPlan(pos, 20, num_nodes=50, negatives=negatives, shuffle=True, seed=3, rank=r,
                              world_size=world, **typed_args) for r in range(world)]  # fmt: skip

    epoch, done = 1, 4
    before = plans(2)
    first = [int(i) for step in range(done) for p in before for i in p.item(epoch, step).input_id]
    after = [ResumedPlan(p, epoch, [EpochSegment(2, 20, done)]) for p in plans(3)]
    rest = []
    for plan in after:
        for step in range(plan.start_step, len(plan)):
            item = plan.item(epoch, step)
            assert isinstance(item, LinkPlanItem) and item.num_positives == item.input_id.numel() > 0
            label_index, label = item.link_fields["edge_label_index"], item.link_fields["edge_label"]
            seeds = item.seed_dict if typed else {"user": item.seed_ids, "item": item.seed_ids}
            pairs = torch.stack([seeds["user"][label_index[0]], seeds["item"][label_index[1]]])
            b = item.num_positives
            assert torch.equal(pairs[:, :b], pos[:, item.input_id])  # the dealt edges' endpoints, then negatives
            assert torch.equal(label, torch.cat([torch.ones(b), torch.zeros(b)]))
            rest += item.input_id.tolist()
    counts = Counter(first + rest)
    assert set(counts) == set(range(333)) and max(counts.values()) == 1  # every positive edge of the epoch once
