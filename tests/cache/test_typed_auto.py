"""``cache_policy: auto`` over typed rows by expected read time: the read rates the ranks measure (injected here, as
the homogeneous tests of ``auto`` do) price replicate against clique on the typed ranking's expected byte hit rates;
rates are measured only where ``auto`` has a choice."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_zerocopy.cache.decide import RankFacts
from lightning_zerocopy.cache.ranking import CacheScores
from lightning_zerocopy.cache.read_rates import ReadRates
from lightning_zerocopy.cache.typed import rank_typed
from lightning_zerocopy.cache.typed_decide import decide_typed_cache, needs_typed_read_rates

NVLINK = ReadRates(local=1500.0, peer=200.0, host=20.0)
SLOW_PEER = ReadRates(local=1500.0, peer=8.0, host=20.0)
NO_PEER_RATE = ReadRates(local=1500.0, peer=math.nan, host=20.0)  # the probe found no peer to read

NUM_ROWS = {"paper": 400, "institution": 40}
ROW_BYTES = {"paper": 16, "institution": 64}
BUDGET = 1600  # one GPU holds a small part of the hot rows; two hold about twice as much


def _facts(budget: int = BUDGET, peer: bool = True, device: bool = True) -> list[RankFacts]:
    matrix = [[True, peer], [peer, True]]
    return [RankFacts(0, 0, 0, 0 if device else None, budget, matrix),
            RankFacts(1, 0, 1, 1 if device else None, budget, None)]  # fmt: skip


def _scores() -> dict[str, CacheScores]:
    """Steep, random (seeded) priors: every row is read, the first rows of each type most."""
    g = torch.Generator().manual_seed(3)
    out = {}
    for t, n in NUM_ROWS.items():
        steep = (1000.0 / (1 + torch.arange(n, dtype=torch.float64))).round().to(torch.int64)
        out[t] = CacheScores(steep[torch.randperm(n, generator=g)] + 1)
    return out


def test_fast_peer_reads_pick_clique_and_the_note_prices_both() -> None:
    scores = _scores()
    rates = {0: NVLINK, 1: NVLINK}
    decisions = [decide_typed_cache(r, _facts(), scores, NUM_ROWS, ROW_BYTES, "auto", read_rates=rates)
                 for r in range(2)]  # fmt: skip
    assert all(d.layout.policy == "clique" for d in decisions) and decisions[0].digest == decisions[1].digest
    one, two = rank_typed(scores, ROW_BYTES, BUDGET, 1), rank_typed(scores, ROW_BYTES, BUDGET, 2)
    assert two.expected_hit_rate > one.expected_hit_rate  # the clique adds hits, which the price weighs
    note = decisions[0].layout.note
    assert note.startswith("auto: clique reads")
    assert f"{one.expected_hit_rate:.1%} replicated vs {two.expected_hit_rate:.1%} over 2 GPUs" in note
    assert "200 peer" in note and "\n" not in note


@pytest.mark.parametrize("rates", [SLOW_PEER, NO_PEER_RATE], ids=["slow-peer", "no-peer-rate"])
def test_slow_or_unmeasured_peer_reads_pick_replicate(rates: ReadRates) -> None:
    decision = decide_typed_cache(0, _facts(), _scores(), NUM_ROWS, ROW_BYTES, "auto", read_rates={0: rates, 1: rates})
    assert decision.layout.policy == "replicate" and decision.group == (0,)
    assert decision.layout.note.startswith("auto: replicate reads")
    assert decision.bytes_per_gpu <= BUDGET


def test_without_rates_auto_keeps_its_rule_and_the_rates_of_other_machines_are_not_used() -> None:
    scores = _scores()
    assert decide_typed_cache(0, _facts(), scores, NUM_ROWS, ROW_BYTES, "auto").layout.policy == "clique"
    elsewhere = {5: SLOW_PEER}  # a rank of another machine: not this machine's rates
    assert decide_typed_cache(0, _facts(), scores, NUM_ROWS, ROW_BYTES, "auto",
                              read_rates=elsewhere).layout.policy == "clique"  # fmt: skip


def test_explicit_policies_and_hot_rows_that_fit_ignore_the_rates() -> None:
    scores = _scores()
    slow = {0: SLOW_PEER, 1: SLOW_PEER}
    assert decide_typed_cache(0, _facts(), scores, NUM_ROWS, ROW_BYTES, "clique",
                              read_rates=slow).layout.policy == "clique"  # fmt: skip
    roomy = decide_typed_cache(0, _facts(budget=10**6), scores, NUM_ROWS, ROW_BYTES, "auto",
                               read_rates={0: NVLINK, 1: NVLINK})  # fmt: skip
    assert roomy.layout.policy == "replicate" and "fit one GPU" in roomy.layout.note


def test_rates_are_measured_only_where_typed_auto_has_a_choice() -> None:
    scores = _scores()
    assert needs_typed_read_rates("auto", _facts(), scores, NUM_ROWS, ROW_BYTES)
    assert not needs_typed_read_rates("clique", _facts(), scores, NUM_ROWS, ROW_BYTES)  # asked for explicitly
    assert not needs_typed_read_rates("auto", _facts(budget=10**6), scores, NUM_ROWS, ROW_BYTES)  # fits one GPU
    assert not needs_typed_read_rates("auto", _facts(peer=False), scores, NUM_ROWS, ROW_BYTES)  # no peers
    assert not needs_typed_read_rates("auto", _facts(device=False), scores, NUM_ROWS, ROW_BYTES)  # CPU ranks
