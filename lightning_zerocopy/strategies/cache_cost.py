"""``cache_policy: auto``: replicate or clique by the expected time to read a batch's feature rows.

A row of a batch is read from this GPU's memory, a peer GPU's (clique), or host memory (a miss). With ``C`` rows of
budget per GPU and a clique of ``k`` GPUs:

* replicate caches the ``C`` hottest rows on every GPU: a hit rate ``h(C)``, every hit local;
* clique caches the ``k * C`` hottest rows, one shard per GPU: a hit rate ``h(k * C) >= h(C)``, a ``1 / k`` share of
  the hits local and the rest read from peers (the rows are dealt round-robin by rank, so each shard is about as
  hot as the others).

The expected seconds per row are ``row_bytes * (misses / host + local hits / local + peer hits / peer)`` with the
rates each source delivers (:class:`~lightning_zerocopy.gather.read_rates.ReadRates`, measured on the machine at
setup); the policy with the smaller figure wins. Peer reads over NVLink are several times faster than host reads,
so clique usually wins once the hot rows exceed one GPU's budget; over PCIe peers, or when the extra rows add few
hits, replicate can win.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lightning_zerocopy.gather.read_rates import ReadRates

__all__ = ["PolicyCosts", "compare_policies", "row_read_seconds"]


def row_read_seconds(hit_rate: float, local_share: float, rates: ReadRates, row_bytes: int) -> float:
    """Expected seconds to read one row: a ``hit_rate`` share from GPU memory, ``local_share`` of it local and the
    rest from peers, the misses from host memory."""
    hits_local = hit_rate * local_share
    hits_peer = hit_rate - hits_local
    misses = 1.0 - hit_rate

    def term(share: float, gbps: float) -> float:
        if share <= 0:
            return 0.0
        return math.inf if not gbps > 0 else share / (gbps * 1e9)

    return row_bytes * (term(misses, rates.host) + term(hits_local, rates.local) + term(hits_peer, rates.peer))


@dataclass(frozen=True)
class PolicyCosts:
    """The two policies' expected read time for one machine, and what they rest on.

    Attributes:
        replicate_s, clique_s: expected seconds per row read.
        replicate_hit, clique_hit: the hit rates the two layouts are expected to give.
        group_size: GPUs in the clique.
        rates: the measured read rates.
    """

    replicate_s: float
    clique_s: float
    replicate_hit: float
    clique_hit: float
    group_size: int
    rates: ReadRates

    @property
    def clique_wins(self) -> bool:
        return self.clique_s < self.replicate_s

    def note(self) -> str:
        """One line: the choice, both estimates and the figures behind them."""
        per_mrow = 1e6 * 1e3  # seconds per row -> ms per million rows
        winner, loser = ("clique", "replicate") if self.clique_wins else ("replicate", "clique")
        ms = {"clique": self.clique_s * per_mrow, "replicate": self.replicate_s * per_mrow}
        return (
            f"auto: {winner} reads a million rows in an expected {ms[winner]:.2f} ms, {loser} in {ms[loser]:.2f} ms "
            f"(hit rate {self.replicate_hit:.1%} replicated vs {self.clique_hit:.1%} over {self.group_size} GPUs; "
            f"{self.rates})"
        )


def compare_policies(
    replicate_hit: float, clique_hit: float, group_size: int, rates: ReadRates, row_bytes: int
) -> PolicyCosts:
    """Expected read cost of replicate (every hit local) and clique (``1 / group_size`` of the hits local)."""
    return PolicyCosts(
        replicate_s=row_read_seconds(replicate_hit, 1.0, rates, row_bytes),
        clique_s=row_read_seconds(clique_hit, 1.0 / max(group_size, 1), rates, row_bytes),
        replicate_hit=replicate_hit,
        clique_hit=clique_hit,
        group_size=group_size,
        rates=rates,
    )
