"""cache_ranking: degree and presample scores, hottest-first order, expected hit rate; the decided cache plan."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_zerocopy.data.plan import BatchPlan
from lightning_zerocopy.strategies.cache_setup import RankFacts, decide_cache
from lightning_zerocopy.strategies.ranking import (
    check_ranking,
    degree_scores,
    expected_hit_rate,
    order_by_score,
    presample_items,
    presample_scores,
)


def test_degree_scores_count_in_neighbor_appearances() -> None:
    indices = torch.tensor([3, 1, 3, 0, 3, 1], dtype=torch.int32)
    assert degree_scores(indices, 5).tolist() == [1, 2, 0, 3, 0]
    with pytest.raises(IndexError):
        degree_scores(torch.tensor([5]), 5)


def test_order_breaks_ties_by_id() -> None:
    scores = torch.tensor([2, 5, 2, 5, 0, 2])
    assert order_by_score(scores).tolist() == [1, 3, 0, 2, 5, 4]


def test_expected_hit_rate() -> None:
    scores = torch.tensor([6, 3, 1, 0])
    assert expected_hit_rate(scores, torch.tensor([0])) == pytest.approx(0.6)
    assert expected_hit_rate(scores, torch.tensor([0, 1, 2])) == pytest.approx(1.0)
    assert math.isnan(expected_hit_rate(torch.zeros(3), torch.tensor([0])))


def test_unknown_ranking_names_the_key() -> None:
    with pytest.raises(ValueError, match="cache_ranking"):
        check_ranking("pagerank")


def test_presample_items_split_over_ranks_cover_the_same_batches() -> None:
    plan = BatchPlan(torch.arange(100), 16, shuffle=True, seed=3)
    one = [(i.epoch, i.step, i.batch_seed) for i in presample_items(plan, 15)]
    split = [(i.epoch, i.step, i.batch_seed) for r in range(4) for i in presample_items(plan, 15, r, 4)]
    assert len(one) == 15 and sorted(one) == sorted(split)
    assert {e for e, _, _ in one} == {0, 1, 2}  # 7 steps per epoch: epochs run back to back


def test_presample_counts_are_deterministic_and_rank_independent() -> None:
    plan = BatchPlan(torch.arange(50), 8, shuffle=True, seed=1)
    gen_table = torch.randint(0, 200, (50, 5), generator=torch.Generator().manual_seed(0))

    def sample(item):  # a stand-in sampler: seeds plus fixed neighbors per seed
        return torch.cat([item.seed_ids, gen_table[item.seed_ids].reshape(-1)]).unique()

    whole = presample_scores(sample, presample_items(plan, 20), 200)
    parts = sum(presample_scores(sample, presample_items(plan, 20, r, 3), 200) for r in range(3))
    assert torch.equal(whole, parts)
    assert torch.equal(whole, presample_scores(sample, presample_items(plan, 20), 200))
    assert int(whole.sum()) > 0


def _facts(n: int, budget: int, peer=None, node: int = 0, first_rank: int = 0) -> list[RankFacts]:
    peer = peer if peer is not None else [[True] * n for _ in range(n)]
    return [
        RankFacts(first_rank + i, node, i, i, budget, peer if i == 0 else None) for i in range(n)
    ]


def test_replicate_plan_holds_the_hottest_rows_and_is_the_same_on_every_rank() -> None:
    scores = torch.tensor([0, 9, 3, 9, 1, 7, 0, 2])
    facts = _facts(2, budget=3 * 16)
    plans = [decide_cache(r, facts, scores, 8, 16, "replicate") for r in range(2)]
    assert plans[0].plan == plans[1].plan
    assert plans[0].plan.rows.tolist() == [1, 3, 5]
    assert plans[0].group == (0,) and plans[1].group == (1,)
    assert plans[0].expected_hit_rate == pytest.approx(25 / 31)
    assert not plans[0].whole_table


def test_clique_plan_splits_k_times_the_rows_into_disjoint_shards() -> None:
    scores = torch.arange(20, 0, -1)  # row 0 hottest
    facts = _facts(4, budget=3 * 8, peer=[[i // 2 == j // 2 for j in range(4)] for i in range(4)])
    decisions = [decide_cache(r, facts, scores, 20, 8, "clique") for r in range(4)]
    assert [d.group for d in decisions] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [d.shard_index for d in decisions] == [0, 1, 0, 1]
    plan = decisions[0].plan
    assert all(d.plan == plan for d in decisions)
    assert plan.num_shards == 2 and plan.num_cached == 6
    shard0, shard1 = plan.shard_rows(0).tolist(), plan.shard_rows(1).tolist()
    assert shard0 == [0, 2, 4] and shard1 == [1, 3, 5]  # dealt round-robin, hottest first within a shard


def test_the_smallest_budget_applies_and_the_whole_table_is_cached_when_it_fits() -> None:
    facts = _facts(2, budget=10**6)
    facts[1] = RankFacts(1, 0, 1, 1, 10 * 4)
    d = decide_cache(0, facts, torch.ones(30), 30, 4, "replicate")
    assert d.rows_per_gpu == 10 and d.plan.num_cached == 10
    whole = decide_cache(0, _facts(2, budget=10**6), torch.ones(30), 30, 4, "auto")
    assert whole.whole_table and whole.layout.policy == "replicate"
    assert whole.plan.rows.tolist() == list(range(30)) and whole.expected_hit_rate == 1.0


def test_each_node_groups_its_own_ranks() -> None:
    facts = _facts(2, 64, node=0) + _facts(2, 64, node=1, first_rank=2)
    decisions = [decide_cache(r, facts, torch.arange(100), 100, 4, "clique") for r in range(4)]
    assert [d.group for d in decisions] == [(0, 1), (0, 1), (2, 3), (2, 3)]  # never across machines
