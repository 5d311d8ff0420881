"""The rows one budget per GPU holds over the featured node types: one ranking of ``(type, row)`` candidates by
expected reads per byte, each type's lookup charged before its first row, presampled counts blended per type and
judged on the bytes held out; one type is its own order, whatever the merge."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_zerocopy.cache.cached_rows import _allocate_merged, allocate, bytes_per_gpu, fits_a_row, rank_rows
from lightning_zerocopy.cache.plan import lookup_bytes
from lightning_zerocopy.cache.ranking import CacheScores


def test_a_narrow_types_hot_rows_go_before_a_wide_types_lukewarm_ones() -> None:
    # narrow: 4-byte rows read 10 times (2.5 reads/byte); wide: 100-byte rows read 50 times (0.5 reads/byte)
    scores = {"wide": torch.tensor([50, 50, 1]), "narrow": torch.tensor([10, 10, 10, 0])}
    row_bytes = {"wide": 100, "narrow": 4}
    look = lookup_bytes(3, 1) + lookup_bytes(4, 1)
    rows = allocate(scores, scores, row_bytes, look + 3 * 4 + 100)
    assert rows["narrow"].tolist() == [0, 1, 2] and rows["wide"].tolist() == [0]
    # ranked by reads alone the wide rows would have come first: one byte less and no wide row fits (with its
    # lookup), so the wide type is left out and the narrow type's cold row takes the room
    rows = allocate(scores, scores, row_bytes, look + 3 * 4 + 99)
    assert rows["narrow"].tolist() == [0, 1, 2, 3] and rows["wide"].numel() == 0


def test_each_types_lookup_is_charged_before_its_first_row() -> None:
    scores = {"a": torch.tensor([9, 8, 7, 6]), "b": torch.tensor([5, 4])}
    row_bytes = {"a": 8, "b": 8}
    assert lookup_bytes(4, 1) == 16 and lookup_bytes(2, 1) == 8
    assert allocate(scores, scores, row_bytes, 16 + 7)["a"].numel() == 0  # the lookup and no whole row
    rows = allocate(scores, scores, row_bytes, 16 + 4 * 8 + 8 + 7)  # every row of a, b's lookup, no b row
    assert rows["a"].numel() == 4 and rows["b"].numel() == 0
    rows = allocate(scores, scores, row_bytes, 16 + 4 * 8 + 8 + 8)
    assert rows["b"].tolist() == [0]
    assert not fits_a_row(8 + 7, {"a": 4, "b": 2}, row_bytes) and fits_a_row(8 + 8, {"a": 4, "b": 2}, row_bytes)


def test_a_type_whose_lookup_does_not_fit_is_skipped_and_the_walk_goes_on() -> None:
    # a: one hot row but a long table (a 400-byte lookup); b: a short table of cooler rows
    scores = {"a": torch.cat([torch.tensor([100]), torch.zeros(99, dtype=torch.int64)]), "b": torch.tensor([3, 2])}
    rows = allocate(scores, scores, {"a": 4, "b": 4}, 100)
    assert rows["a"].numel() == 0 and rows["b"].tolist() == [0, 1]


@pytest.mark.parametrize("num_rows", [{"a": 300, "b": 50, "c": 1000}, {"c": 1000}], ids=["three-types", "one-type"])
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_the_budget_is_never_exceeded(num_rows: dict, shards: int) -> None:
    g = torch.Generator().manual_seed(0)
    row_bytes = {"a": 64, "b": 8, "c": 256}
    scores = {t: torch.randint(0, 20, (n,), generator=g) for t, n in num_rows.items()}
    last = -1
    for budget in (0, 100, 1000, 5000, 20_000, 100_000, 1_000_000):
        rows = allocate(scores, scores, row_bytes, budget, shards)
        cached = {t: r.numel() for t, r in rows.items()}
        used = bytes_per_gpu(cached, row_bytes, num_rows, shards)
        assert used <= budget
        for t, r in rows.items():
            assert r.unique().numel() == r.numel() and (r.numel() == 0 or int(r.max()) < num_rows[t])
        assert sum(cached.values()) >= last  # a larger budget caches at least as many rows here
        last = sum(cached.values())
    assert all(rows[t].numel() == n for t, n in num_rows.items())  # the last budget holds everything


def test_zero_budget_caches_nothing() -> None:
    scores = {"a": torch.tensor([5, 1]), "b": torch.tensor([3])}
    rows = allocate(scores, scores, {"a": 4, "b": 4}, 0)
    assert {t: r.numel() for t, r in rows.items()} == {"a": 0, "b": 0}
    ranked = rank_rows({t: CacheScores(s) for t, s in scores.items()}, {"a": 4, "b": 4}, 0)
    assert all(r.numel() == 0 for r in ranked.rows.values()) and ranked.expected_hit_rate == 0.0


def test_hottest_first_within_a_type_and_ties_by_id() -> None:
    scores = {"a": torch.tensor([1, 5, 5, 0, 3])}
    rows = allocate(scores, scores, {"a": 1}, 10**6)
    assert rows["a"].tolist() == [1, 2, 4, 0, 3]


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_one_type_is_taken_in_its_own_order_as_the_merge_takes_it(shards: int) -> None:
    """The general walk over merged candidates, run on one type, takes what the one-type path takes: the prefix of
    the type's own order (ties, floats one ulp apart, widths that are no power of two)."""
    g = torch.Generator().manual_seed(4)
    n = 500
    ulps = torch.full((n,), 1.9, dtype=torch.float64) + torch.randint(0, 3, (n,), generator=g) * 2.0**-52
    for scores, tiebreak in ((torch.randint(0, 5, (n,), generator=g), torch.randint(0, 3, (n,), generator=g)),
                             (ulps, torch.randint(0, 9, (n,), generator=g))):  # fmt: skip
        for width in (1, 12, 400):
            for budget in (0, lookup_bytes(n, shards) - 1, lookup_bytes(n, shards) + 7 * width, 30_000, 10**7):
                one = allocate({"t": scores}, {"t": tiebreak}, {"t": width}, budget, shards)["t"]
                merged = _allocate_merged({"t": scores}, {"t": tiebreak}, {"t": width}, budget, shards, ["t"],
                                          {"t": torch.zeros(0, dtype=torch.int64)})["t"]  # fmt: skip
                assert torch.equal(one, merged), (width, budget)
                unordered = allocate({"t": scores}, {"t": tiebreak}, {"t": width}, budget, shards, ordered=False)["t"]
                assert torch.equal(unordered.sort().values, one.sort().values)


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
    ranked = rank_rows(scores, row_bytes, 3000)
    assert ranked.basis == "held-out" and ranked.choice is not None
    assert 0 < ranked.expected_hit_rate <= 1 and not math.isnan(ranked.in_sample_hit_rate)
    assert bytes_per_gpu({t: r.numel() for t, r in ranked.rows.items()}, row_bytes, num_rows, 1) <= 3000
    again = rank_rows(scores, row_bytes, 3000)
    assert all(torch.equal(ranked.rows[t], again.rows[t]) for t in num_rows)  # deterministic
    with pytest.raises(ValueError, match="every type or for none"):
        rank_rows({"a": scores["a"], "b": CacheScores(scores["b"].prior)}, row_bytes, 3000)
