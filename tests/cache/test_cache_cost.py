"""``cache_policy: auto`` by expected read time: the cost model, the layout it picks and why it says so, and when the
ranks measure read rates at all."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_zerocopy.cache.read_rates import ReadRates
from lightning_zerocopy.cache.cost import compare_policies, row_read_seconds
from lightning_zerocopy.cache.decide import RankFacts, decide_cache, needs_read_rates
from lightning_zerocopy.cache.cliques import choose_layout

NVLINK = ReadRates(local=1500.0, peer=200.0, host=20.0)
SLOW_PEER = ReadRates(local=1500.0, peer=8.0, host=20.0)


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


def _facts(budget: int, peer: bool = True) -> list[RankFacts]:
    matrix = [[True, peer], [peer, True]]
    return [RankFacts(0, 0, 0, 0, budget, matrix), RankFacts(1, 0, 1, 1, budget, None)]


def test_decide_cache_prices_both_capacities_from_the_ranking() -> None:
    # 100 rows, a steep ranking: the 10 hottest hold most of the accesses, 20 nearly all
    scores = torch.cat([torch.full((10,), 100.0), torch.full((10,), 50.0), torch.ones(80)])
    facts = _facts(budget=10 * 4 + 100 * 4)  # 10 rows of 4 B beside the lookup (4 B per table row)
    rates = {0: NVLINK, 1: NVLINK}
    decisions = [decide_cache(r, facts, scores, 100, 4, "auto", read_rates=rates) for r in range(2)]
    assert all(d.layout.policy == "clique" for d in decisions) and decisions[0].plan == decisions[1].plan
    assert "hit rate 63.3% replicated vs 94.9% over 2 GPUs" in decisions[0].layout.note  # 1000 / 1580, 1500 / 1580
    slow = decide_cache(0, facts, scores, 100, 4, "auto", read_rates={0: SLOW_PEER, 1: SLOW_PEER})
    assert slow.layout.policy == "replicate" and slow.plan.num_cached == 10


def test_rates_are_measured_only_where_auto_has_a_choice() -> None:
    facts = _facts(budget=10 * 4 + 100 * 4)
    assert needs_read_rates("auto", facts, hot_rows=100, num_nodes=100, row_bytes=4)
    assert not needs_read_rates("clique", facts, 100, 100, 4)  # asked for explicitly
    assert not needs_read_rates("auto", facts, 8, 100, 4)  # the hot rows fit one GPU
    assert not needs_read_rates("auto", _facts(budget=10 * 4 + 100 * 4, peer=False), 100, 100, 4)  # no peers
    assert not needs_read_rates("auto", _facts(budget=100 * 4 + 3), 100, 100, 4)  # the lookup leaves no room
    cpu = [RankFacts(0, 0, 0, None, 40, [[True, True], [True, True]]), RankFacts(1, 0, 1, None, 40, None)]
    assert not needs_read_rates("auto", cpu, 100, 100, 4)  # CPU ranks


def test_the_summary_says_what_each_gpu_stores_and_the_budget_apart() -> None:
    # a 30-row table and a budget of 1000 rows: the whole table is stored, 30 rows, not the budget's 1000
    whole = decide_cache(0, _facts(budget=1000 * 4), torch.ones(30), 30, 4, "replicate")
    assert whole.whole_table
    assert ("the whole feature table over 1 GPU(s), 30 rows (120 B) + its lookup (120 B) = 240 B per GPU of a "
            "3.91 KiB budget") in whole.summary()
