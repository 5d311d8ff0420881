"""The cache over typed rows on CPU: degree scores per type over every edge type out of it, one ranking of
``(type, row)`` candidates by expected reads per byte under one budget, each type's lookup charged before its first
row, presampled counts blended per type, one plan per featured type with the same shard count, the log line."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from lightning_zerocopy.cache.decide import RankFacts
from lightning_zerocopy.cache.plan import location_bytes
from lightning_zerocopy.cache.ranking import CacheScores
from lightning_zerocopy.cache.typed import (
    allocate_typed,
    lookup_bytes,
    rank_typed,
    typed_bytes_per_gpu,
    typed_degree_scores,
)
from lightning_zerocopy.cache.typed_decide import decide_typed_cache


def _facts(budget: int, n: int = 1, peer: bool = False) -> list[RankFacts]:
    matrix = [[peer or i == j for j in range(n)] for i in range(n)]
    return [RankFacts(r, 0, r, r, budget, matrix if r == 0 else None) for r in range(n)]


def test_degree_scores_count_a_type_over_every_edge_type_out_of_it() -> None:
    graphs = {
        ("author", "writes", "paper"): SimpleNamespace(indices=torch.tensor([0, 2, 2])),
        ("author", "cites", "author"): SimpleNamespace(indices=torch.tensor([2, 1])),
        ("paper", "rev", "author"): SimpleNamespace(indices=torch.tensor([1, 1, 0])),
        ("inst", "employs", "author"): SimpleNamespace(indices=torch.tensor([0])),
    }
    scores = typed_degree_scores(graphs, {"author": 3, "paper": 2, "inst": 1}, ["author", "paper"])
    assert set(scores) == {"author", "paper"}  # inst has no features: never a candidate
    assert scores["author"].tolist() == [1, 1, 3] and scores["paper"].tolist() == [1, 2]


def test_a_narrow_types_hot_rows_go_before_a_wide_types_lukewarm_ones() -> None:
    # narrow: 4-byte rows read 10 times (2.5 reads/byte); wide: 100-byte rows read 50 times (0.5 reads/byte)
    scores = {"wide": torch.tensor([50, 50, 1]), "narrow": torch.tensor([10, 10, 10, 0])}
    row_bytes = {"wide": 100, "narrow": 4}
    look = lookup_bytes(3, 1) + lookup_bytes(4, 1)
    rows = allocate_typed(scores, scores, row_bytes, look + 3 * 4 + 100)
    assert rows["narrow"].tolist() == [0, 1, 2] and rows["wide"].tolist() == [0]
    # ranked by reads alone the wide rows would have come first: one byte less and no wide row fits (with its
    # lookup), so the wide type is left out and the narrow type's cold row takes the room
    rows = allocate_typed(scores, scores, row_bytes, look + 3 * 4 + 99)
    assert rows["narrow"].tolist() == [0, 1, 2, 3] and rows["wide"].numel() == 0


def test_each_types_lookup_is_charged_before_its_first_row() -> None:
    scores = {"a": torch.tensor([9, 8, 7, 6]), "b": torch.tensor([5, 4])}
    row_bytes = {"a": 8, "b": 8}
    assert lookup_bytes(4, 1) == 16 and lookup_bytes(2, 1) == 8
    assert allocate_typed(scores, scores, row_bytes, 16 + 7)["a"].numel() == 0  # the lookup and no whole row
    rows = allocate_typed(scores, scores, row_bytes, 16 + 4 * 8 + 8 + 7)  # every row of a, b's lookup, no b row
    assert rows["a"].numel() == 4 and rows["b"].numel() == 0
    rows = allocate_typed(scores, scores, row_bytes, 16 + 4 * 8 + 8 + 8)
    assert rows["b"].tolist() == [0]


def test_a_type_whose_lookup_does_not_fit_is_skipped_and_the_walk_goes_on() -> None:
    # a: one hot row but a long table (a 400-byte lookup); b: a short table of cooler rows
    scores = {"a": torch.cat([torch.tensor([100]), torch.zeros(99, dtype=torch.int64)]), "b": torch.tensor([3, 2])}
    rows = allocate_typed(scores, scores, {"a": 4, "b": 4}, 100)
    assert rows["a"].numel() == 0 and rows["b"].tolist() == [0, 1]


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_the_budget_is_never_exceeded(shards: int) -> None:
    g = torch.Generator().manual_seed(0)
    num_rows = {"a": 300, "b": 50, "c": 1000}
    row_bytes = {"a": 64, "b": 8, "c": 256}
    scores = {t: torch.randint(0, 20, (n,), generator=g) for t, n in num_rows.items()}
    last = -1
    for budget in (0, 100, 1000, 5000, 20_000, 100_000, 1_000_000):
        rows = allocate_typed(scores, scores, row_bytes, budget, shards)
        cached = {t: r.numel() for t, r in rows.items()}
        used = typed_bytes_per_gpu(cached, row_bytes, num_rows, shards)
        assert used <= budget
        for t, r in rows.items():
            assert r.unique().numel() == r.numel() and (r.numel() == 0 or int(r.max()) < num_rows[t])
        assert sum(cached.values()) >= last  # a larger budget caches at least as many rows here
        last = sum(cached.values())
    assert all(rows[t].numel() == n for t, n in num_rows.items())  # the last budget holds everything


def test_zero_budget_caches_nothing() -> None:
    scores = {"a": torch.tensor([5, 1]), "b": torch.tensor([3])}
    rows = allocate_typed(scores, scores, {"a": 4, "b": 4}, 0)
    assert {t: r.numel() for t, r in rows.items()} == {"a": 0, "b": 0}
    decision = decide_typed_cache(0, _facts(0), {t: CacheScores(s) for t, s in scores.items()}, {"a": 2, "b": 1},
                                  {"a": 4, "b": 4}, "auto")  # fmt: skip
    assert decision.rows_per_type == {"a": 0, "b": 0} and decision.bytes_per_gpu == 0


def test_hottest_first_within_a_type_and_ties_by_id() -> None:
    scores = {"a": torch.tensor([1, 5, 5, 0, 3])}
    rows = allocate_typed(scores, scores, {"a": 1}, 10**6)
    assert rows["a"].tolist() == [1, 2, 4, 0, 3]


def test_a_decision_holds_one_plan_per_featured_type_with_the_same_shard_count() -> None:
    g = torch.Generator().manual_seed(1)
    num_rows = {"paper": 200, "institution": 30}
    row_bytes = {"paper": 32, "institution": 16}
    scores = {t: CacheScores(torch.randint(0, 9, (n,), generator=g)) for t, n in num_rows.items()}
    budget = 2000
    facts = _facts(budget, n=2, peer=True)
    d0 = decide_typed_cache(0, facts, scores, num_rows, row_bytes, "clique")
    d1 = decide_typed_cache(1, facts, scores, num_rows, row_bytes, "clique")
    assert d0.group == d1.group == (0, 1) and (d0.shard_index, d1.shard_index) == (0, 1)
    assert set(d0.plans) == set(num_rows) and all(p.num_shards == 2 for p in d0.plans.values())
    assert d0.digest == d1.digest and d0.bytes_per_gpu <= budget
    assert all(p.num_table_rows == num_rows[t] for t, p in d0.plans.items())
    # a clique caches more than one GPU would
    single = decide_typed_cache(0, _facts(budget), scores, num_rows, row_bytes, "auto")
    assert single.layout.policy == "replicate" and sum(d0.rows_per_type.values()) > sum(single.rows_per_type.values())
    line = d0.summary()
    assert "paper: " in line and "institution: " in line and "clique" in line and "\n" not in line


def test_auto_replicates_when_every_types_hot_rows_fit_one_gpu() -> None:
    scores = {"a": CacheScores(torch.tensor([3, 0, 1, 0])), "b": CacheScores(torch.tensor([2, 2]))}
    num_rows, row_bytes = {"a": 4, "b": 2}, {"a": 4, "b": 4}
    need = location_bytes(4, 1, 4) + location_bytes(2, 1, 2) + 4 * 4
    fits = decide_typed_cache(0, _facts(need, n=2, peer=True), scores, num_rows, row_bytes, "auto")
    assert fits.layout.policy == "replicate" and "fit one GPU" in fits.layout.note
    overflow = decide_typed_cache(0, _facts(need - 1, n=2, peer=True), scores, num_rows, row_bytes, "auto")
    assert overflow.layout.policy == "clique"


def test_presampled_counts_are_blended_per_type_and_judged_on_bytes_held_out() -> None:
    g = torch.Generator().manual_seed(2)
    num_rows, row_bytes = {"a": 500, "b": 200}, {"a": 16, "b": 64}
    weights_a = torch.rand(num_rows["a"], generator=g) ** 4
    weights_b = torch.rand(num_rows["b"], generator=g) ** 4
    scores = {}
    for t, w in (("a", weights_a), ("b", weights_b)):
        halves = torch.stack([torch.bincount(torch.multinomial(w, 300, replacement=True, generator=g),
                                             minlength=num_rows[t]) for _ in range(2)])  # fmt: skip
        prior = torch.round(w * 100).to(torch.int64)
        scores[t] = CacheScores(prior, halves)
    ranked = rank_typed(scores, row_bytes, 3000)
    assert ranked.basis == "held-out" and ranked.choice is not None
    assert 0 < ranked.expected_hit_rate <= 1 and not math.isnan(ranked.in_sample_hit_rate)
    assert typed_bytes_per_gpu({t: r.numel() for t, r in ranked.rows.items()}, row_bytes, num_rows, 1) <= 3000
    again = rank_typed(scores, row_bytes, 3000)
    assert all(torch.equal(ranked.rows[t], again.rows[t]) for t in num_rows)  # deterministic
    with pytest.raises(ValueError, match="every type or for none"):
        rank_typed({"a": scores["a"], "b": CacheScores(scores["b"].prior)}, row_bytes, 3000)


def test_the_types_named_must_agree() -> None:
    with pytest.raises(ValueError, match="same featured types"):
        decide_typed_cache(0, _facts(100), {"a": CacheScores(torch.ones(2))}, {"b": 2}, {"a": 4}, "auto")
