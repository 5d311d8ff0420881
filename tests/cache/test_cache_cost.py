"""``cache_policy: auto`` by expected read time: the cost model, the layout it picks and why it says so, and when the
ranks measure read rates at all; over one table and over the rows of several node types (the read rates the ranks
measure are injected here; the ranking's expected hit rates, of the bytes read, are what the price weighs)."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_zerocopy.cache.cached_rows import rank_rows
from lightning_zerocopy.cache.cliques import choose_layout
from lightning_zerocopy.cache.cost import compare_policies, row_read_seconds
from lightning_zerocopy.cache.decide import RankFacts, decide_cache, needs_read_rates
from lightning_zerocopy.cache.plan import lookup_bytes
from lightning_zerocopy.cache.ranking import CacheScores
from lightning_zerocopy.cache.read_rates import ReadRates
from lightning_zerocopy.graph.schema import NODE

NVLINK = ReadRates(local=1500.0, peer=200.0, host=20.0)
SLOW_PEER = ReadRates(local=1500.0, peer=8.0, host=20.0)
NO_PEER_RATE = ReadRates(local=1500.0, peer=math.nan, host=20.0)  # the probe found no peer to read


def test_row_read_seconds_weighs_each_source_by_its_share() -> None:
    rates = ReadRates(local=100.0, peer=50.0, host=10.0)
    # half the rows from host, a quarter local, a quarter from peers; 1000-byte rows
    expected = 1000 * (0.5 / 10e9 + 0.25 / 100e9 + 0.25 / 50e9)
    assert row_read_seconds(0.5, 0.5, rates, 1000) == pytest.approx(expected)
    assert row_read_seconds(1.0, 1.0, rates, 1000) == pytest.approx(1000 / 100e9)
    assert row_read_seconds(0.5, 0.0, ReadRates(100.0, math.nan, 10.0), 1000) == math.inf  # unmeasured peers


def test_clique_wins_over_nvlink_when_it_adds_hits_and_loses_over_slow_peers() -> None:
    fast = compare_policies(replicate_hit=0.5, clique_hit=0.8, group_size=2, rates=NVLINK, row_bytes=512)
    assert fast.clique_wins and fast.clique_s < fast.replicate_s
    slow = compare_policies(replicate_hit=0.5, clique_hit=0.55, group_size=2, rates=SLOW_PEER, row_bytes=512)
    assert not slow.clique_wins
    note = fast.note()
    assert note.startswith("auto: clique") and "50.0% replicated vs 80.0% over 2 GPUs" in note and "200 peer" in note


def test_auto_layout_follows_the_price_and_says_why() -> None:
    peer = [[True, True], [True, True]]
    cheap = lambda k: compare_policies(0.5, 0.8, k, NVLINK, 512)  # noqa: E731
    dear = lambda k: compare_policies(0.5, 0.55, k, SLOW_PEER, 512)  # noqa: E731
    clique = choose_layout("auto", peer, hot_rows=100, rows_per_gpu=10, price=cheap)
    assert clique.policy == "clique" and clique.groups == ((0, 1),) and "expected" in clique.note
    replicate = choose_layout("auto", peer, hot_rows=100, rows_per_gpu=10, price=dear)
    assert replicate.policy == "replicate" and replicate.note.startswith("auto: replicate reads")
    # the hot rows fit one GPU: replicate, without asking the price
    fits = choose_layout("auto", peer, hot_rows=5, rows_per_gpu=10, price=lambda k: pytest.fail("priced"))
    assert fits.policy == "replicate"


def _facts(budget: int, peer: bool = True, device: bool = True) -> list[RankFacts]:
    matrix = [[True, peer], [peer, True]]
    return [RankFacts(0, 0, 0, 0 if device else None, budget, matrix),
            RankFacts(1, 0, 1, 1 if device else None, budget, None)]  # fmt: skip


def _one_table():
    """100 rows of 4 B, a steep ranking (the 10 hottest hold most of the accesses, 20 nearly all); a budget of 10
    rows beside the lookup (4 B per table row)."""
    scores = torch.cat([torch.full((10,), 100.0), torch.full((10,), 50.0), torch.ones(80)])
    return {NODE: CacheScores(scores)}, {NODE: 100}, {NODE: 4}, 10 * 4 + 100 * 4


def _two_types():
    """Steep, random (seeded) priors over two types of different widths: every row is read, the first rows of each
    type most; one GPU holds a small part of the hot rows, two about twice as much."""
    g = torch.Generator().manual_seed(3)
    num_rows, row_bytes = {"paper": 400, "institution": 40}, {"paper": 16, "institution": 64}
    scores = {}
    for t, n in num_rows.items():
        steep = (1000.0 / (1 + torch.arange(n, dtype=torch.float64))).round().to(torch.int64)
        scores[t] = CacheScores(steep[torch.randperm(n, generator=g)] + 1)
    return scores, num_rows, row_bytes, 1600


CASES = {"one-table": _one_table, "two-types": _two_types}


@pytest.mark.parametrize("case", CASES)
def test_fast_peer_reads_pick_clique_and_the_note_prices_both(case: str) -> None:
    scores, num_rows, row_bytes, budget = CASES[case]()
    rates = {0: NVLINK, 1: NVLINK}
    decisions = [decide_cache(r, _facts(budget), scores, num_rows, row_bytes, "auto", read_rates=rates)
                 for r in range(2)]  # fmt: skip
    assert all(d.layout.policy == "clique" for d in decisions) and decisions[0].digest == decisions[1].digest
    one, two = rank_rows(scores, row_bytes, budget, 1), rank_rows(scores, row_bytes, budget, 2)
    assert two.expected_hit_rate > one.expected_hit_rate  # the clique adds hits, which the price weighs
    note = decisions[0].layout.note
    assert note.startswith("auto: clique reads") and "200 peer" in note and "\n" not in note
    assert f"hit rate {one.expected_hit_rate:.1%} replicated vs {two.expected_hit_rate:.1%} over 2 GPUs" in note
    if case == "one-table":
        assert "hit rate 63.3% replicated vs 94.9% over 2 GPUs" in note  # 1000 / 1580, 1500 / 1580


@pytest.mark.parametrize("rates", [SLOW_PEER, NO_PEER_RATE], ids=["slow-peer", "no-peer-rate"])
@pytest.mark.parametrize("case", CASES)
def test_slow_or_unmeasured_peer_reads_pick_replicate(case: str, rates: ReadRates) -> None:
    scores, num_rows, row_bytes, budget = CASES[case]()
    decision = decide_cache(0, _facts(budget), scores, num_rows, row_bytes, "auto", read_rates={0: rates, 1: rates})
    assert decision.layout.policy == "replicate" and decision.group == (0,)
    assert decision.layout.note.startswith("auto: replicate reads") and decision.bytes_per_gpu <= budget
    if case == "one-table":
        assert decision.plans[NODE].num_cached == 10


@pytest.mark.parametrize("case", CASES)
def test_without_rates_auto_keeps_its_rule_and_the_rates_of_other_machines_are_not_used(case: str) -> None:
    scores, num_rows, row_bytes, budget = CASES[case]()
    assert decide_cache(0, _facts(budget), scores, num_rows, row_bytes, "auto").layout.policy == "clique"
    elsewhere = {5: SLOW_PEER}  # a rank of another machine: not this machine's rates
    assert decide_cache(0, _facts(budget), scores, num_rows, row_bytes, "auto",
                        read_rates=elsewhere).layout.policy == "clique"  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_explicit_policies_and_hot_rows_that_fit_ignore_the_rates(case: str) -> None:
    scores, num_rows, row_bytes, budget = CASES[case]()
    slow = {0: SLOW_PEER, 1: SLOW_PEER}
    assert decide_cache(0, _facts(budget), scores, num_rows, row_bytes, "clique",
                        read_rates=slow).layout.policy == "clique"  # fmt: skip
    roomy = decide_cache(0, _facts(10**6), scores, num_rows, row_bytes, "auto", read_rates={0: NVLINK, 1: NVLINK})
    assert roomy.layout.policy == "replicate" and "fit one GPU" in roomy.layout.note


@pytest.mark.parametrize("case", CASES)
def test_rates_are_measured_only_where_auto_has_a_choice(case: str) -> None:
    scores, num_rows, row_bytes, budget = CASES[case]()
    assert needs_read_rates("auto", _facts(budget), scores, num_rows, row_bytes)
    assert not needs_read_rates("clique", _facts(budget), scores, num_rows, row_bytes)  # asked for explicitly
    assert not needs_read_rates("auto", _facts(10**6), scores, num_rows, row_bytes)  # the hot rows fit one GPU
    assert not needs_read_rates("auto", _facts(budget, peer=False), scores, num_rows, row_bytes)  # no peers
    assert not needs_read_rates("auto", _facts(budget, device=False), scores, num_rows, row_bytes)  # CPU ranks
    full = min(lookup_bytes(num_rows[t], 1) + row_bytes[t] for t in num_rows) - 1  # no lookup leaves room for a row
    assert not needs_read_rates("auto", _facts(full), scores, num_rows, row_bytes)


def test_the_hot_rows_that_fit_one_gpu_need_no_rates() -> None:
    scores, num_rows, row_bytes, budget = _one_table()
    few = {NODE: CacheScores(torch.cat([torch.ones(8), torch.zeros(92)]))}  # 8 hot rows: they fit one GPU
    assert not needs_read_rates("auto", _facts(budget), few, num_rows, row_bytes)


def test_the_summary_says_what_each_gpu_stores_and_the_budget_apart() -> None:
    # a 30-row table and a budget of 1000 rows: the whole table is stored, 30 rows, not the budget's 1000
    whole = decide_cache(0, _facts(1000 * 4), {NODE: CacheScores(torch.ones(30))}, {NODE: 30},
                         {NODE: 4}, "replicate")  # fmt: skip
    assert whole.whole_table
    assert ("the whole feature table over 1 GPU(s), 30 rows (120 B) + its lookup (120 B) = 240 B per GPU of a "
            "3.91 KiB budget") in whole.summary()
