"""CachePlan, the row -> location lookup, and the picklable spec/handle types (CPU only)."""

from __future__ import annotations

import pickle

import pytest
import torch

from lightning_zerocopy.cache.plan import (
    MAX_SHARDS,
    CachePlan,
    decode_location,
    location_bytes,
    location_layout,
)
from lightning_zerocopy.cache.segmented import CacheCounts, SegmentedCacheSpec, ShardHandle


def _ranking(num_rows: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(num_rows, generator=g)


def _handle(plan: CachePlan, s: int, dim: int = 8, dtype: torch.dtype = torch.float32) -> ShardHandle:
    return ShardHandle(
        shard_index=s, num_rows=plan.shard_sizes[s], dim=dim, dtype=dtype, device_index=s,
        device_uuid=f"GPU-{s}", owner_pid=1, key=f"k{s}", plan_digest=plan.digest, ipc=None,
    )  # fmt: skip


@pytest.mark.parametrize("num_shards", [1, 2, 3, 4])
def test_from_ranking_deals_rows_round_robin(num_shards: int) -> None:
    ranking = _ranking(1000)
    plan = CachePlan.from_ranking(ranking, 1000, num_shards, num_rows=101)
    assert plan.num_cached == 101 and plan.num_shards == num_shards
    sizes = plan.shard_sizes
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 101
    for s in range(num_shards):
        assert torch.equal(plan.shard_rows(s), ranking[:101][s::num_shards])
    # the shards together are exactly the hottest 101 rows
    assert torch.equal(plan.rows.sort().values, ranking[:101].sort().values)


def test_plan_is_deterministic_and_pickles() -> None:
    a = CachePlan.from_ranking(_ranking(500, seed=3), 500, 2, num_rows=60)
    b = CachePlan.from_ranking(_ranking(500, seed=3), 500, 2, num_rows=60)
    c = CachePlan.from_ranking(_ranking(500, seed=4), 500, 2, num_rows=60)
    assert a == b and a.digest == b.digest
    assert a != c
    restored = pickle.loads(pickle.dumps(a))
    assert restored == a and torch.equal(restored.rows, a.rows) and restored.bounds == a.bounds


def test_plan_rejects_bad_input() -> None:
    with pytest.raises(IndexError, match="row id 10"):
        CachePlan(rows=torch.tensor([1, 10]), num_shards=1, bounds=(0, 2), num_table_rows=10)
    with pytest.raises(ValueError, match="repeat"):
        CachePlan(rows=torch.tensor([1, 1]), num_shards=1, bounds=(0, 2), num_table_rows=10)
    with pytest.raises(ValueError, match="bounds"):
        CachePlan(rows=torch.tensor([1, 2]), num_shards=2, bounds=(0, 2), num_table_rows=10)
    with pytest.raises(ValueError, match="non-decreasing"):
        CachePlan(rows=torch.tensor([1, 2]), num_shards=2, bounds=(0, 3, 2), num_table_rows=10)
    with pytest.raises(ValueError, match="num_shards"):
        CachePlan.from_ranking(torch.arange(4), 4, MAX_SHARDS + 1)
    with pytest.raises(ValueError, match="num_rows"):
        CachePlan.from_ranking(torch.arange(4), 4, 1, num_rows=5)


def test_location_layout() -> None:
    assert location_layout(1, 100) == (torch.int32, 31)
    assert location_layout(2, 100) == (torch.int32, 30)
    assert location_layout(8, 1 << 28) == (torch.int32, 28)
    assert location_layout(8, (1 << 28) + 1) == (torch.int64, 32)
    assert location_layout(5, 10) == (torch.int32, 28)
    assert location_bytes(100_000_000, 2, 10**6) == 400_000_000  # 100M nodes: 400 MB per process
    assert location_bytes(10, 8, (1 << 28) + 1) == 80


@pytest.mark.parametrize("num_shards", [1, 3, 8])
def test_build_location_matches_plan(num_shards: int) -> None:
    plan = CachePlan.from_ranking(_ranking(300, seed=num_shards), 300, num_shards, num_rows=120)
    location = plan.build_location()
    assert location.dtype == plan.location_dtype and location.shape == (300,)
    assert plan.location_bytes == location.numel() * location.element_size()
    shard, slot = decode_location(location, plan.slot_bits)
    cached = torch.zeros(300, dtype=torch.bool)
    cached[plan.rows] = True
    assert torch.equal(shard < 0, ~cached)
    for s in range(num_shards):
        rows = plan.shard_rows(s)
        assert torch.equal(shard[rows], torch.full_like(rows, s))
        assert torch.equal(slot[rows], torch.arange(rows.numel()))


def test_spec_pickles_and_checks_handles() -> None:
    plan = CachePlan.from_ranking(_ranking(50), 50, 2, num_rows=11)
    spec = SegmentedCacheSpec(plan, (_handle(plan, 0), _handle(plan, 1)), policy="clique")
    restored = pickle.loads(pickle.dumps(spec))
    assert restored.plan == plan and restored.handles == spec.handles and restored.policy == "clique"
    with pytest.raises(ValueError, match="one handle per shard"):
        SegmentedCacheSpec(plan, (_handle(plan, 0),))
    with pytest.raises(ValueError, match="order them by shard"):
        SegmentedCacheSpec(plan, (_handle(plan, 1), _handle(plan, 0)))
    other = CachePlan.from_ranking(_ranking(50, seed=9), 50, 2, num_rows=11)
    with pytest.raises(ValueError, match="another plan"):
        SegmentedCacheSpec(plan, (_handle(other, 0), _handle(plan, 1)))


def test_cache_counts_hit_rate() -> None:
    assert CacheCounts(3, 1, 4).hit_rate == pytest.approx(0.5)
    assert CacheCounts(0, 0, 0).hit_rate == 0.0
