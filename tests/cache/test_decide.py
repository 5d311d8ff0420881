"""The decided cache: one plan per featured node type (a graph without types has one), the same on every rank of a
group; hottest rows first, a clique's rows dealt round-robin to disjoint shards, the smallest budget of the job, each
machine its own groups, the row lookups charged before any row, whole tables in id order, the log line (bit for bit
against the one-table decision: test_one_type_decision.py)."""

from __future__ import annotations

from typing import Optional

import pytest
import torch

from lightning_zerocopy.cache.decide import CacheDecision, RankFacts, decide_cache
from lightning_zerocopy.cache.plan import CachePlan, location_bytes, lookup_bytes
from lightning_zerocopy.cache.ranking import CacheScores
from lightning_zerocopy.graph.schema import NODE


def _facts(n: int, budget: int, peer=None, node: int = 0, first_rank: int = 0) -> list[RankFacts]:
    peer = peer if peer is not None else [[True] * n for _ in range(n)]
    return [RankFacts(first_rank + i, node, i, i, budget, peer if i == 0 else None) for i in range(n)]


def _decide(rank: int, facts: list[RankFacts], scores: torch.Tensor, row_bytes: int, policy: str) -> CacheDecision:
    """The decision over one table ranked by ``scores``."""
    n = scores.numel()
    return decide_cache(rank, facts, {NODE: CacheScores(scores)}, {NODE: n}, {NODE: row_bytes}, policy)


def _plan(decision: CacheDecision) -> CachePlan:
    (plan,) = decision.plans.values()
    return plan


def test_replicate_plan_holds_the_hottest_rows_and_is_the_same_on_every_rank() -> None:
    scores = torch.tensor([0, 9, 3, 9, 1, 7, 0, 2])
    facts = _facts(2, budget=3 * 16 + 8 * 4)  # 3 rows of 16 B beside the lookup (4 B per table row)
    decisions = [_decide(r, facts, scores, 16, "replicate") for r in range(2)]
    assert _plan(decisions[0]) == _plan(decisions[1]) and decisions[0].digest == decisions[1].digest
    assert _plan(decisions[0]).rows.tolist() == [1, 3, 5]
    assert decisions[0].group == (0,) and decisions[1].group == (1,)
    assert decisions[0].expected_hit_rate == pytest.approx(25 / 31)
    assert not decisions[0].whole_table


def test_clique_plan_splits_k_times_the_rows_into_disjoint_shards() -> None:
    scores = torch.arange(20, 0, -1)  # row 0 hottest
    facts = _facts(4, budget=3 * 8 + 20 * 4, peer=[[i // 2 == j // 2 for j in range(4)] for i in range(4)])
    decisions = [_decide(r, facts, scores, 8, "clique") for r in range(4)]
    assert [d.group for d in decisions] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [d.shard_index for d in decisions] == [0, 1, 0, 1]
    plan = _plan(decisions[0])
    assert all(_plan(d) == plan for d in decisions)
    assert plan.num_shards == 2 and plan.num_cached == 6
    shard0, shard1 = plan.shard_rows(0).tolist(), plan.shard_rows(1).tolist()
    assert shard0 == [0, 2, 4] and shard1 == [1, 3, 5]  # dealt round-robin, hottest first within a shard


def test_the_smallest_budget_applies_and_the_whole_table_is_cached_when_it_fits() -> None:
    facts = _facts(2, budget=10**6)
    facts[1] = RankFacts(1, 0, 1, 1, 10 * 4 + 30 * 4)  # 10 rows beside the 30-row table's lookup
    d = _decide(0, facts, torch.ones(30), 4, "replicate")
    assert _plan(d).num_cached == 10 and d.budget_bytes == 10 * 4 + 30 * 4
    whole = _decide(0, _facts(2, budget=10**6), torch.ones(30), 4, "auto")
    assert whole.whole_table and whole.layout.policy == "replicate"
    assert _plan(whole).rows.tolist() == list(range(30)) and whole.expected_hit_rate == 1.0


def test_each_node_groups_its_own_ranks() -> None:
    facts = _facts(2, 64, node=0) + _facts(2, 64, node=1, first_rank=2)
    decisions = [_decide(r, facts, torch.arange(100), 4, "clique") for r in range(4)]
    assert [d.group for d in decisions] == [(0, 1), (0, 1), (2, 3), (2, 3)]  # never across machines


def test_the_row_lookup_is_charged_to_the_budget_before_any_row() -> None:
    # 1000 rows of 16 B; every GPU that opens the cache builds a lookup of 4 B per table row (4000 B): with a
    # 6000 B budget the rows get 2000 B (125 rows), not 6000 B (375 rows + 4000 B of lookup = 10000 B per GPU)
    num_nodes, row_bytes, budget = 1000, 16, 6000
    lookup = lookup_bytes(num_nodes, 1)
    assert lookup == 4000
    d = _decide(0, _facts(2, budget=budget), torch.arange(num_nodes, 0, -1), row_bytes, "replicate")
    assert _plan(d).location_bytes <= lookup  # what segmented.py allocates (plan.build_location) is what is charged
    assert _plan(d).max_shard_rows * row_bytes + lookup <= budget
    assert _plan(d).num_cached == (budget - lookup) // row_bytes == 125
    assert (d.budget_bytes, d.bytes_per_gpu) == (budget, 125 * row_bytes + lookup)
    assert "125 rows (1.95 KiB) + its lookup (3.91 KiB) = 5.86 KiB per GPU of a 5.86 KiB budget" in d.summary()
    # a clique: each GPU holds its shard and the lookup over the whole table (one entry per table row)
    peer = [[i // 2 == j // 2 for j in range(4)] for i in range(4)]
    clique = [_decide(r, _facts(4, budget=budget, peer=peer), torch.arange(num_nodes, 0, -1), row_bytes, "clique")
              for r in range(4)]  # fmt: skip
    assert all(_plan(c) == _plan(clique[0]) for c in clique[:2]) and _plan(clique[0]).num_shards == 2
    assert _plan(clique[0]).location_bytes <= lookup_bytes(num_nodes, 2) == lookup
    assert _plan(clique[0]).max_shard_rows == 125 and _plan(clique[0]).num_cached == 250
    assert clique[0].bytes_per_gpu == 125 * row_bytes + lookup <= budget
    # the whole table needs its rows and the lookup: 1000 * 16 + 4000 B
    assert not _decide(0, _facts(1, budget=num_nodes * row_bytes), torch.ones(num_nodes), row_bytes,
                       "replicate").whole_table  # fmt: skip
    whole = _decide(0, _facts(1, budget=num_nodes * row_bytes + lookup), torch.ones(num_nodes), row_bytes, "replicate")
    assert whole.whole_table and whole.bytes_per_gpu == num_nodes * row_bytes + lookup
    assert ("the whole feature table over 1 GPU(s), 1000 rows (15.62 KiB) + its lookup (3.91 KiB) = 19.53 KiB per "
            "GPU of a 19.53 KiB budget") in whole.summary()


def test_a_budget_below_the_lookup_caches_nothing() -> None:
    num_nodes, row_bytes = 1000, 16
    for budget, policy in ((3999, "replicate"), (4000 + 15, "auto"), (100, "clique"), (0, "replicate")):
        decisions = [_decide(r, _facts(2, budget=budget), torch.arange(num_nodes), row_bytes, policy)
                     for r in range(2)]  # fmt: skip
        d = decisions[0]
        assert _plan(d) == _plan(decisions[1]) and _plan(d).num_cached == 0
        assert d.bytes_per_gpu == 0 and not d.whole_table and d.expected_hit_rate == 0.0
        assert "nothing cached: the row lookup (3.91 KiB per GPU) leaves no room for a" in d.summary()


# ---- several featured types: one budget, one layout, one plan per type ----------------------------------------


def test_a_decision_holds_one_plan_per_featured_type_with_the_same_shard_count() -> None:
    g = torch.Generator().manual_seed(1)
    num_rows = {"paper": 200, "institution": 30}
    row_bytes = {"paper": 32, "institution": 16}
    scores = {t: CacheScores(torch.randint(0, 9, (n,), generator=g)) for t, n in num_rows.items()}
    budget = 2000
    facts = _facts(2, budget)
    d0 = decide_cache(0, facts, scores, num_rows, row_bytes, "clique")
    d1 = decide_cache(1, facts, scores, num_rows, row_bytes, "clique")
    assert d0.group == d1.group == (0, 1) and (d0.shard_index, d1.shard_index) == (0, 1)
    assert set(d0.plans) == set(num_rows) and all(p.num_shards == 2 for p in d0.plans.values())
    assert d0.digest == d1.digest and d0.bytes_per_gpu <= budget
    assert all(p.num_table_rows == num_rows[t] for t, p in d0.plans.items())
    # a clique caches more than one GPU would
    single = decide_cache(0, _facts(1, budget), scores, num_rows, row_bytes, "auto")
    assert single.layout.policy == "replicate" and sum(d0.rows_per_type.values()) > sum(single.rows_per_type.values())
    line = d0.summary()
    assert "paper: " in line and "institution: " in line and "clique" in line and "of the bytes read" in line
    assert "their lookups" in line and "\n" not in line


def test_every_table_that_fits_whole_is_cached_in_id_order() -> None:
    scores = {"a": CacheScores(torch.tensor([1, 9, 5])), "b": CacheScores(torch.tensor([4, 0]))}
    num_rows, row_bytes = {"a": 3, "b": 2}, {"a": 8, "b": 4}
    need = lookup_bytes(3, 1) + 3 * 8 + lookup_bytes(2, 1) + 2 * 4
    whole = decide_cache(0, _facts(1, need), scores, num_rows, row_bytes, "replicate")
    assert whole.whole_table and whole.expected_hit_rate == 1.0 and whole.prior_weight is None
    assert {t: p.rows.tolist() for t, p in whole.plans.items()} == {"a": [0, 1, 2], "b": [0, 1]}
    ranked = decide_cache(0, _facts(1, need - 1), scores, num_rows, row_bytes, "replicate")
    assert not ranked.whole_table and ranked.plans["a"].rows.tolist()[:2] == [1, 2]  # hottest first


@pytest.mark.parametrize("types", [("a",), ("a", "b")], ids=["one-type", "two-types"])
def test_auto_replicates_when_every_types_hot_rows_fit_one_gpu(types: tuple[str, ...]) -> None:
    given = {"a": CacheScores(torch.tensor([3, 0, 1, 0])), "b": CacheScores(torch.tensor([2, 2]))}
    scores = {t: given[t] for t in types}
    num_rows, row_bytes = {t: given[t].prior.numel() for t in types}, {t: 4 for t in types}
    need = sum(location_bytes(num_rows[t], 1, num_rows[t]) + given[t].hot_rows * 4 for t in types)
    fits = decide_cache(0, _facts(2, need), scores, num_rows, row_bytes, "auto")
    assert fits.layout.policy == "replicate" and "fit one GPU" in fits.layout.note
    overflow = decide_cache(0, _facts(2, need - 1), scores, num_rows, row_bytes, "auto")
    assert overflow.layout.policy == "clique"


@pytest.mark.parametrize("num_rows,row_bytes", [({"b": 2}, {"a": 4}), ({"a": 3}, {"a": 4}), ({"a": 2}, {})])
def test_the_types_named_must_agree(num_rows: dict, row_bytes: Optional[dict]) -> None:
    with pytest.raises(ValueError, match="same featured types"):
        decide_cache(0, _facts(1, 100), {"a": CacheScores(torch.ones(2))}, num_rows, row_bytes, "auto")


def test_a_budget_below_every_types_lookup_caches_no_type() -> None:
    scores = {"a": CacheScores(torch.tensor([5, 1])), "b": CacheScores(torch.tensor([3]))}
    for budget in (0, 7):  # a: a lookup of 8 B; b: a lookup of 4 B, and no room for its 4 B row
        d = decide_cache(0, _facts(1, budget), scores, {"a": 2, "b": 1}, {"a": 4, "b": 4}, "auto")
        assert d.rows_per_type == {"a": 0, "b": 0} and d.bytes_per_gpu == 0 and d.expected_hit_rate == 0.0
        assert "nothing cached: the row lookup (12 B per GPU) leaves no room for a 4 B row" in d.summary()
