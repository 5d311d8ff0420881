"""BatchPlan: a pure, deterministic (seed, epoch, rank, world_size, step) -> batch assignment."""

from __future__ import annotations

import pickle

import pytest
import torch

from lightning_zerocopy.data.plan import BatchPlan, derive_seed


def _nodes(n: int = 103) -> torch.Tensor:
    return torch.randperm(10 * n, generator=torch.Generator().manual_seed(7))[:n]


def _epoch_seeds(plan: BatchPlan, epoch: int) -> torch.Tensor:
    return torch.cat([plan.item(epoch, s).seed_ids for s in range(len(plan))])


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ranks_get_disjoint_equal_shares(world_size: int, drop_last: bool) -> None:
    nodes = _nodes()
    plans = [
        BatchPlan(nodes, 8, shuffle=True, drop_last=drop_last, seed=3, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    lengths = {len(p) for p in plans}
    assert len(lengths) == 1, "every rank must run the same number of steps"
    shares = [_epoch_seeds(p, epoch=2) for p in plans]
    assert len({s.numel() for s in shares}) == 1
    everything = torch.cat(shares)
    n = nodes.numel()
    if drop_last:
        assert everything.unique().numel() == everything.numel()  # fully disjoint
        assert everything.numel() == (n // world_size) // 8 * 8 * world_size
    else:
        # every input node is seen; only the wrap-around padding (< world_size nodes) repeats
        assert set(everything.tolist()) == set(nodes.tolist())
        assert everything.numel() - n == (-n) % world_size
    assert torch.isin(everything, nodes).all()


def test_input_id_points_into_input_nodes() -> None:
    nodes = _nodes()
    plan = BatchPlan(nodes, 10, shuffle=True, seed=1)
    item = plan.item(epoch=0, step=3)
    assert torch.equal(nodes[item.input_id], item.seed_ids)
    assert item.batch_size == 10


def test_deterministic_and_pure() -> None:
    nodes = _nodes()
    a = BatchPlan(nodes, 16, shuffle=True, seed=5, rank=1, world_size=2)
    b = pickle.loads(pickle.dumps(BatchPlan(nodes, 16, shuffle=True, seed=5, rank=1, world_size=2)))
    for epoch in (0, 1, 7):
        for step in reversed(range(len(a))):  # order of calls does not matter
            ia, ib = a.item(epoch, step), b.item(epoch, step)
            assert torch.equal(ia.seed_ids, ib.seed_ids)
            assert ia.batch_seed == ib.batch_seed


def test_shuffle_changes_with_epoch_and_seed() -> None:
    nodes = _nodes()
    plan = BatchPlan(nodes, 16, shuffle=True, seed=5)
    assert not torch.equal(_epoch_seeds(plan, 0), _epoch_seeds(plan, 1))
    other = BatchPlan(nodes, 16, shuffle=True, seed=6)
    assert not torch.equal(_epoch_seeds(plan, 0), _epoch_seeds(other, 0))
    # each epoch is a permutation of the inputs
    assert torch.equal(_epoch_seeds(plan, 1).sort().values, nodes.sort().values)


def test_no_shuffle_keeps_input_order() -> None:
    nodes = _nodes()
    plan = BatchPlan(nodes, 16, shuffle=False)
    assert torch.equal(_epoch_seeds(plan, 0), nodes)
    assert torch.equal(_epoch_seeds(plan, 4), nodes)


def test_batch_seeds_are_distinct_per_batch() -> None:
    plans = [BatchPlan(_nodes(), 4, seed=9, rank=r, world_size=2) for r in range(2)]
    seeds = {p.item(e, s).batch_seed for p in plans for e in range(3) for s in range(len(p))}
    assert len(seeds) == 3 * sum(len(p) for p in plans)
    assert all(0 <= s < 2**63 for s in seeds)


def test_len_and_last_batch() -> None:
    nodes = _nodes(103)
    assert len(BatchPlan(nodes, 10)) == 11
    assert BatchPlan(nodes, 10).item(0, 10).batch_size == 3
    assert len(BatchPlan(nodes, 10, drop_last=True)) == 10
    with pytest.raises(IndexError, match="out of range"):
        BatchPlan(nodes, 10).item(0, 11)


def test_fewer_inputs_than_ranks_still_gives_every_rank_a_batch() -> None:
    nodes = torch.tensor([5, 9])
    plans = [BatchPlan(nodes, 4, rank=r, world_size=3) for r in range(3)]
    assert [len(p) for p in plans] == [1, 1, 1]
    assert all(p.item(0, 0).batch_size == 1 for p in plans)


def test_bad_arguments_name_the_parameter() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        BatchPlan(_nodes(), 0)
    with pytest.raises(ValueError, match="rank"):
        BatchPlan(_nodes(), 4, rank=2, world_size=2)


def test_derive_seed_mixes_every_part() -> None:
    assert derive_seed(1, 2, 3) != derive_seed(1, 3, 2)
    assert derive_seed(0) != derive_seed(1)
    assert derive_seed(4, 5) == derive_seed(4, 5)


def test_split_sampler_seed_is_one_seed_for_every_batch_rank_and_epoch() -> None:
    """Node-keyed evaluation needs one sampler seed for the whole split, whatever the rank, world size or step."""
    nodes = torch.arange(100)
    plans = [BatchPlan(nodes, 10, rank=r, world_size=w, seed=5, stream=2, sampler_seed="split") for w in (1, 3)
             for r in range(w)]  # fmt: skip
    seeds = {p.item(epoch, step).batch_seed for p in plans for epoch in (0, 4) for step in range(len(p))}
    assert len(seeds) == 1
    assert seeds != {BatchPlan(nodes, 10, seed=5, stream=1, sampler_seed="split").item(0, 0).batch_seed}  # per split
    per_batch = BatchPlan(nodes, 10, seed=5, stream=2)
    assert len({per_batch.item(0, step).batch_seed for step in range(len(per_batch))}) == len(per_batch)
    with pytest.raises(ValueError, match="sampler_seed"):
        BatchPlan(nodes, 10, sampler_seed="epoch")  # type: ignore[arg-type]
