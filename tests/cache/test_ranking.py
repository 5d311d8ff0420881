"""cache_ranking: degree scores (per node type, over every edge type out of it), hottest-first order, expected hit
rate; the presample ranking's blend with the degree prior, its weight chosen and its hit rate estimated on held-out
batches (the presampling itself: tests/strategies/test_presample.py; the rows a budget holds over several types:
test_cached_rows.py; the decided plans: test_decide.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from lightning_zerocopy.cache.cached_rows import RankedRows, rank_rows
from lightning_zerocopy.cache.decide import RankFacts, decide_cache
from lightning_zerocopy.cache.plan import lookup_bytes
from lightning_zerocopy.cache.ranking import (
    PRIOR_WEIGHTS,
    CacheScores,
    blended_scores,
    check_ranking,
    degree_scores,
    degree_scores_by_type,
    expected_hit_rate,
    top_rows,
)
from lightning_zerocopy.graph.schema import NODE


def rank_first(scores: CacheScores, num_rows: int, weights=PRIOR_WEIGHTS) -> RankedRows:
    """The ranking of one table for ``num_rows`` cached rows: a budget of its lookup and ``num_rows`` 1-byte rows."""
    n = scores.prior.numel()
    return rank_rows({NODE: scores}, {NODE: 1}, lookup_bytes(n, 1) + num_rows, weights=weights)


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


def test_degree_scores_count_a_type_over_every_edge_type_out_of_it() -> None:
    graphs = {
        ("author", "writes", "paper"): SimpleNamespace(indices=torch.tensor([0, 2, 2])),
        ("author", "cites", "author"): SimpleNamespace(indices=torch.tensor([2, 1])),
        ("paper", "rev", "author"): SimpleNamespace(indices=torch.tensor([1, 1, 0])),
        ("inst", "employs", "author"): SimpleNamespace(indices=torch.tensor([0])),
    }
    scores = degree_scores_by_type(graphs, {"author": 3, "paper": 2, "inst": 1}, ["author", "paper"])
    assert set(scores) == {"author", "paper"}  # inst has no features: never a candidate
    assert scores["author"].tolist() == [1, 1, 3] and scores["paper"].tolist() == [1, 2]
    one = degree_scores_by_type({("node", "to", "node"): SimpleNamespace(indices=torch.tensor([3, 1, 3]))},
                                {"node": 4}, ["node"])  # fmt: skip
    assert one["node"].tolist() == degree_scores(torch.tensor([3, 1, 3]), 4).tolist() == [0, 1, 0, 2]


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
        ranked = rank_first(CacheScores(degree, halves), cached)
        rows = ranked.rows[NODE]
        raw_rows = top_rows(counts.double(), degree, cached)
        blend, raw, deg = _share(p, rows), _share(p, raw_rows), _share(p, top_rows(degree, degree, cached))
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
    first = rank_first(CacheScores(degree, torch.stack([a, b])), 4000)
    again = rank_first(CacheScores(degree.clone(), torch.stack([a.clone(), b.clone()])), 4000)
    choice = first.choice
    assert choice == again.choice and torch.equal(first.rows[NODE], again.rows[NODE])
    assert choice.weights == PRIOR_WEIGHTS and len(choice.heldout_hit_rates) == len(PRIOR_WEIGHTS)
    assert choice.heldout_hit_rate == max(choice.heldout_hit_rates) and choice.final_weight == choice.weight / 2
    # counts proportional to the prior: every weight ranks alike, the first candidate wins
    prior = torch.tensor([8, 4, 2, 1, 0, 0])
    tie = rank_first(CacheScores(prior, torch.stack([prior * 3, prior * 3])), 2).choice
    assert tie.index == 0 and len(set(tie.heldout_hit_rates)) == 1
    # nothing counted: nothing to judge by, degree alone
    none = rank_first(CacheScores(prior, torch.zeros(2, 6, dtype=torch.long)), 2).choice
    assert none.weight == math.inf and all(math.isnan(r) for r in none.heldout_hit_rates)
    with pytest.raises(ValueError, match="at least one candidate"):
        rank_first(CacheScores(prior, torch.zeros(2, 6, dtype=torch.long)), 2, weights=())


def test_decided_presample_cache_reports_the_heldout_rate() -> None:
    p, degree, g = _access_model(4_000, 3)
    scores = CacheScores(degree, torch.stack([_batches(p, 16, g), _batches(p, 16, g)]))
    budget = 400 * 16 + 4_000 * 4  # 400 rows beside the lookup
    facts = [RankFacts(r, 0, r, r, budget, [[True] * 2] * 2 if r == 0 else None) for r in range(2)]
    decisions = [decide_cache(r, facts, {NODE: scores}, {NODE: 4_000}, {NODE: 16}, "replicate")
                 for r in range(2)]  # fmt: skip
    plan = decisions[0].plans[NODE]
    assert plan == decisions[1].plans[NODE] and plan.num_cached == 400
    ranked = rank_first(scores, 400)
    assert torch.equal(plan.rows, ranked.rows[NODE])  # one shard: the hot order itself
    assert decisions[0].expected_hit_rate == ranked.expected_hit_rate == decisions[0].prior_weight.heldout_hit_rate
    assert decisions[0].in_sample_hit_rate > decisions[0].expected_hit_rate
    assert "held out" in decisions[0].summary()
    degree_only = decide_cache(0, facts, {NODE: CacheScores(degree)}, {NODE: 4_000}, {NODE: 16},
                               "replicate")  # fmt: skip
    assert degree_only.prior_weight is None
