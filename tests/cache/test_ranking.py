"""cache_ranking: degree and presample scores, hottest-first order, expected hit rate; the decided cache plan; the
presample ranking's blend with the degree prior, its weight chosen and its hit rate estimated on held-out batches
(the presampling itself: tests/strategies/test_presample.py)."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_zerocopy.cache.decide import RankFacts, decide_cache
from lightning_zerocopy.cache.typed import lookup_bytes
from lightning_zerocopy.cache.ranking import (
    PRIOR_WEIGHTS,
    CacheScores,
    blended_scores,
    check_ranking,
    choose_prior_weight,
    degree_scores,
    expected_hit_rate,
    top_rows,
)


def test_degree_scores_count_in_neighbor_appearances() -> None:
    indices = torch.tensor([3, 1, 3, 0, 3, 1], dtype=torch.int32)
    assert degree_scores(indices, 5).tolist() == [1, 2, 0, 3, 0]
    with pytest.raises(IndexError):
        degree_scores(torch.tensor([5]), 5)


def test_order_breaks_ties_by_id() -> None:
    scores = torch.tensor([2, 5, 2, 5, 0, 2])
    assert top_rows(scores, torch.zeros_like(scores), 6).tolist() == [1, 3, 0, 2, 5, 4]


def test_expected_hit_rate() -> None:
    scores = torch.tensor([6, 3, 1, 0])
    assert expected_hit_rate(scores, torch.tensor([0])) == pytest.approx(0.6)
    assert expected_hit_rate(scores, torch.tensor([0, 1, 2])) == pytest.approx(1.0)
    assert math.isnan(expected_hit_rate(torch.zeros(3), torch.tensor([0])))


def test_unknown_ranking_names_the_key() -> None:
    with pytest.raises(ValueError, match="cache_ranking"):
        check_ranking("pagerank")


def _facts(n: int, budget: int, peer=None, node: int = 0, first_rank: int = 0) -> list[RankFacts]:
    peer = peer if peer is not None else [[True] * n for _ in range(n)]
    return [
        RankFacts(first_rank + i, node, i, i, budget, peer if i == 0 else None) for i in range(n)
    ]


def test_replicate_plan_holds_the_hottest_rows_and_is_the_same_on_every_rank() -> None:
    scores = torch.tensor([0, 9, 3, 9, 1, 7, 0, 2])
    facts = _facts(2, budget=3 * 16 + 8 * 4)  # 3 rows of 16 B beside the lookup (4 B per table row)
    plans = [decide_cache(r, facts, scores, 8, 16, "replicate") for r in range(2)]
    assert plans[0].plan == plans[1].plan
    assert plans[0].plan.rows.tolist() == [1, 3, 5]
    assert plans[0].group == (0,) and plans[1].group == (1,)
    assert plans[0].expected_hit_rate == pytest.approx(25 / 31)
    assert not plans[0].whole_table


def test_clique_plan_splits_k_times_the_rows_into_disjoint_shards() -> None:
    scores = torch.arange(20, 0, -1)  # row 0 hottest
    facts = _facts(4, budget=3 * 8 + 20 * 4, peer=[[i // 2 == j // 2 for j in range(4)] for i in range(4)])
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
    facts[1] = RankFacts(1, 0, 1, 1, 10 * 4 + 30 * 4)  # 10 rows beside the 30-row table's lookup
    d = decide_cache(0, facts, torch.ones(30), 30, 4, "replicate")
    assert d.rows_per_gpu == 10 and d.plan.num_cached == 10
    whole = decide_cache(0, _facts(2, budget=10**6), torch.ones(30), 30, 4, "auto")
    assert whole.whole_table and whole.layout.policy == "replicate"
    assert whole.plan.rows.tolist() == list(range(30)) and whole.expected_hit_rate == 1.0


def test_each_node_groups_its_own_ranks() -> None:
    facts = _facts(2, 64, node=0) + _facts(2, 64, node=1, first_rank=2)
    decisions = [decide_cache(r, facts, torch.arange(100), 100, 4, "clique") for r in range(4)]
    assert [d.group for d in decisions] == [(0, 1), (0, 1), (2, 3), (2, 3)]  # never across machines


def test_the_row_lookup_is_charged_to_the_budget_before_any_row() -> None:
    # 1000 rows of 16 B; every GPU that opens the cache builds a lookup of 4 B per table row (4000 B): with a
    # 6000 B budget the rows get 2000 B (125 rows), not 6000 B (375 rows + 4000 B of lookup = 10000 B per GPU)
    num_nodes, row_bytes, budget = 1000, 16, 6000
    lookup = lookup_bytes(num_nodes, 1)
    assert lookup == 4000
    d = decide_cache(0, _facts(2, budget=budget), torch.arange(num_nodes, 0, -1), num_nodes, row_bytes, "replicate")
    assert d.plan.location_bytes <= lookup  # what segmented.py allocates (plan.build_location) is what is charged
    assert d.plan.max_shard_rows * row_bytes + lookup <= budget
    assert d.rows_per_gpu == d.plan.num_cached == (budget - lookup) // row_bytes == 125
    assert (d.budget_bytes, d.bytes_per_gpu) == (budget, 125 * row_bytes + lookup)
    assert "125 rows (1.95 KiB) + its lookup (3.91 KiB) = 5.86 KiB per GPU of a 5.86 KiB budget" in d.summary()
    # a clique: each GPU holds its shard and the lookup over the whole table (one entry per table row)
    peer = [[i // 2 == j // 2 for j in range(4)] for i in range(4)]
    clique = [decide_cache(r, _facts(4, budget=budget, peer=peer), torch.arange(num_nodes, 0, -1), num_nodes,
                           row_bytes, "clique") for r in range(4)]  # fmt: skip
    assert all(c.plan == clique[0].plan for c in clique[:2]) and clique[0].plan.num_shards == 2
    assert clique[0].plan.location_bytes <= lookup_bytes(num_nodes, 2) == lookup
    assert clique[0].plan.max_shard_rows == 125 and clique[0].plan.num_cached == 250
    assert clique[0].bytes_per_gpu == 125 * row_bytes + lookup <= budget
    # the whole table needs its rows and the lookup: 1000 * 16 + 4000 B
    assert not decide_cache(0, _facts(1, budget=num_nodes * row_bytes), torch.ones(num_nodes), num_nodes, row_bytes,
                            "replicate").whole_table  # fmt: skip
    whole = decide_cache(0, _facts(1, budget=num_nodes * row_bytes + lookup), torch.ones(num_nodes), num_nodes,
                         row_bytes, "replicate")  # fmt: skip
    assert whole.whole_table and whole.bytes_per_gpu == num_nodes * row_bytes + lookup


def test_a_budget_below_the_lookup_caches_nothing() -> None:
    num_nodes, row_bytes = 1000, 16
    for budget, policy in ((3999, "replicate"), (4000 + 15, "auto"), (100, "clique"), (0, "replicate")):
        decisions = [decide_cache(r, _facts(2, budget=budget), torch.arange(num_nodes), num_nodes, row_bytes, policy)
                     for r in range(2)]  # fmt: skip
        d = decisions[0]
        assert d.plan == decisions[1].plan and d.plan.num_cached == 0 and d.rows_per_gpu == 0
        assert d.bytes_per_gpu == 0 and not d.whole_table and d.expected_hit_rate == 0.0
        assert "nothing cached: the row lookup (3.91 KiB per GPU) leaves no room for a" in d.summary()


# ---- the presample ranking: counts blended with the degree prior, weight and hit rate judged on held-out batches --


def _access_model(num_rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    """A synthetic access distribution: per-batch read probabilities ``p`` (heavy-tailed, about 1 % of the rows per
    batch) and degree scores that predict them only roughly (Poisson around ``p`` times log-normal noise)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.exp(1.5 * torch.randn(num_rows, generator=g, dtype=torch.float64))
    p = (p / p.sum() * 0.01 * num_rows).clamp(max=1.0)
    noise = torch.exp(0.8 * torch.randn(num_rows, generator=g, dtype=torch.float64))
    degree = torch.poisson(10 * p / p.mean() * noise, generator=g).long()
    return p, degree, g


def _batches(p: torch.Tensor, num_batches: int, g: torch.Generator) -> torch.Tensor:
    """Counts of ``num_batches`` batches that read each row with probability ``p``."""
    return torch.binomial(torch.full_like(p, float(num_batches)), p, generator=g).long()


def _share(p: torch.Tensor, rows: torch.Tensor) -> float:
    return float(p[rows].sum() / p.sum())


def test_top_rows_orders_by_score_then_tiebreak_then_id() -> None:
    g = torch.Generator().manual_seed(5)
    scores = torch.randint(0, 4, (300,), generator=g).double() / 2
    tiebreak = torch.randint(0, 3, (300,), generator=g)
    reference = sorted(range(300), key=lambda i: (-float(scores[i]), -int(tiebreak[i]), i))
    for k in (0, 1, 37, 150, 299, 300, 400):
        assert top_rows(scores, tiebreak, k).tolist() == reference[: min(k, 300)]
    assert top_rows(torch.tensor([2, 5, 2, 5, 0, 2]), torch.tensor([0, 0, 1, 0, 0, 1]), 4).tolist() == [1, 3, 2, 5]


def test_top_rows_of_a_large_table_match_a_full_sort() -> None:
    """Large enough for the sampled bracket of the threshold (with many ties, and ids sorted by score)."""
    g = torch.Generator().manual_seed(6)
    n = 600_000
    tiebreak = torch.randint(0, 50, (n,), generator=g)
    for scores in (torch.randint(0, 6, (n,), generator=g).double(), torch.rand(n, generator=g, dtype=torch.float64),
                   torch.linspace(1, 0, n, dtype=torch.float64)):  # fmt: skip
        order = torch.sort(tiebreak, descending=True, stable=True).indices
        order = order[torch.sort(scores[order], descending=True, stable=True).indices]
        for k in (1, 1_000, n // 5, n // 2, n - 1):
            assert torch.equal(top_rows(scores, tiebreak, k), order[:k]), k


def test_blended_scores_scale_the_prior_to_the_counts_total() -> None:
    counts, prior = torch.tensor([3, 1, 0, 0]), torch.tensor([0, 1, 1, 2])
    assert blended_scores(counts, prior, 0.0).tolist() == [3.0, 1.0, 0.0, 0.0]
    blend = blended_scores(counts, prior, 1.0)  # the prior adds as much mass as was counted
    assert blend.tolist() == [3.0, 2.0, 1.0, 2.0] and float(blend.sum()) == 2 * 4
    assert blended_scores(counts, prior, math.inf).tolist() == [0.0, 1.0, 1.0, 2.0]
    assert blended_scores(counts, torch.zeros(4, dtype=torch.long), 2.0).tolist() == [3.0, 1.0, 0.0, 0.0]


def test_blend_beats_raw_counts_and_degree_out_of_sample() -> None:
    """Few presampled batches count most rows 0-2 times: ranked by themselves they overfit (a high in-sample rate,
    a low true one); the degree prior is unbiased but coarse. The cross-validated blend beats both on the true
    access probabilities, and its reported rate is the held-out one, close to the truth."""
    num_rows, cached = 50_000, 10_000
    for seed in range(3):
        p, degree, g = _access_model(num_rows, seed)
        halves = torch.stack([_batches(p, 32, g), _batches(p, 32, g)])
        counts = halves.sum(0)
        ranked = CacheScores(degree, halves).rank(cached)
        raw_rows = top_rows(counts.double(), degree, cached)
        blend, raw, deg = _share(p, ranked.rows), _share(p, raw_rows), _share(p, top_rows(degree, degree, cached))
        assert blend > raw + 0.005 and blend > deg + 0.005, (seed, blend, raw, deg)
        assert 0 < ranked.choice.weight < math.inf and ranked.choice.index not in (0, len(PRIOR_WEIGHTS) - 1)
        assert ranked.basis == "held-out" and ranked.expected_hit_rate == ranked.choice.heldout_hit_rate
        assert abs(ranked.expected_hit_rate - blend) < 0.015, (seed, ranked.expected_hit_rate, blend)
        # what the in-sample estimate said: far too optimistic, for the raw counts (the old ranking) and the blend
        assert expected_hit_rate(counts, raw_rows) > raw + 0.1
        assert ranked.in_sample_hit_rate > blend + 0.04


def test_prior_weight_choice_is_deterministic_and_ties_go_to_the_smaller_index() -> None:
    p, degree, g = _access_model(20_000, 7)
    a, b = _batches(p, 16, g), _batches(p, 16, g)
    first, again = choose_prior_weight(a, b, degree, 4000), choose_prior_weight(a.clone(), b.clone(), degree, 4000)
    assert first == again and first.weights == PRIOR_WEIGHTS and len(first.heldout_hit_rates) == len(PRIOR_WEIGHTS)
    assert first.heldout_hit_rate == max(first.heldout_hit_rates) and first.final_weight == first.weight / 2
    assert torch.equal(CacheScores(degree, torch.stack([a, b])).rank(4000).rows,
                       CacheScores(degree, torch.stack([a, b])).rank(4000).rows)  # fmt: skip
    # counts proportional to the prior: every weight ranks alike, the first candidate wins
    prior = torch.tensor([8, 4, 2, 1, 0, 0])
    tie = choose_prior_weight(prior * 3, prior * 3, prior, 2)
    assert tie.index == 0 and len(set(tie.heldout_hit_rates)) == 1
    # nothing counted: nothing to judge by, degree alone
    none = choose_prior_weight(torch.zeros(6, dtype=torch.long), torch.zeros(6, dtype=torch.long), prior, 2)
    assert none.weight == math.inf and all(math.isnan(r) for r in none.heldout_hit_rates)


def test_decided_presample_cache_reports_the_heldout_rate() -> None:
    p, degree, g = _access_model(4_000, 3)
    scores = CacheScores(degree, torch.stack([_batches(p, 16, g), _batches(p, 16, g)]))
    facts = _facts(2, budget=400 * 16 + 4_000 * 4)  # 400 rows beside the lookup
    decisions = [decide_cache(r, facts, scores, 4_000, 16, "replicate") for r in range(2)]
    assert decisions[0].plan == decisions[1].plan and decisions[0].plan.num_cached == 400
    ranked = scores.rank(400)
    assert torch.equal(decisions[0].plan.rows, ranked.rows)  # one shard: the hot order itself
    assert decisions[0].expected_hit_rate == ranked.expected_hit_rate == decisions[0].prior_weight.heldout_hit_rate
    assert decisions[0].in_sample_hit_rate > decisions[0].expected_hit_rate
    assert "held out" in decisions[0].summary()
    assert decide_cache(0, facts, CacheScores(degree), 4_000, 16, "replicate").prior_weight is None
