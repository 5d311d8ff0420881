"""Deciding a rank's feature cache: one budget per GPU, one layout, one :class:`CachePlan` per featured node type.

The budget is per GPU and covers the cached rows and, for each type that caches any, the row -> (shard, slot)
lookup that a process opening the cache builds over that type's whole table
(:func:`~lightning_zerocopy.cache.plan.lookup_bytes`: 4 or 8 bytes per table row, for ``replicate`` and on each
GPU of a clique alike), charged before the type's first row; a budget that holds no type's lookup and first row
caches nothing. Which rows: :mod:`~lightning_zerocopy.cache.cached_rows` (ranked by expected reads per byte over
every featured type; for a graph without types, its one type's rows by their scores). When the budget holds every
row of every type with the lookups, the tables are cached whole, each in id order. One lookup per GPU is charged: a
pipeline worker that opens the cache on the same GPU builds a second one, which the budget does not count.

The layout is decided once for all types (one group). ``auto`` replicates where one GPU's budget holds the hot rows
of every type (and their lookups); otherwise, with the read rates the ranks measured
(:func:`~lightning_zerocopy.cache.probe.probe_read_rates`: the rates are the hardware's, not the graph's), it prices
both layouts with :func:`~lightning_zerocopy.cache.cost.compare_policies` on the hit rates the ranking expects for
one GPU's budget and for the clique's ``k`` budgets (shares of the bytes read), and takes the cheaper; without rates
(:func:`needs_read_rates` said none were needed, or none were given) it is a clique wherever GPUs have peer access.

Everything here is a function of values every rank exchanges first (:class:`RankFacts`) and of the ranking's
inputs (identical on every rank), so each rank computes the same :class:`CacheDecision` for its cache group without
further communication; the strategy does the exchanging, the placing on the GPU and the releasing.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

import torch

from lightning_zerocopy.cache.budget import format_bytes
from lightning_zerocopy.cache.cached_rows import RankedRows, bytes_per_gpu, fits_a_row, rank_rows
from lightning_zerocopy.cache.cliques import Layout, choose_layout
from lightning_zerocopy.cache.cost import PolicyCosts, compare_policies
from lightning_zerocopy.cache.plan import CachePlan, lookup_bytes
from lightning_zerocopy.cache.ranking import CacheScores, PriorWeightChoice
from lightning_zerocopy.cache.read_rates import ReadRates

__all__ = [
    "CacheDecision",
    "RankFacts",
    "decide_cache",
    "has_peer_pairs",
    "machine_of",
    "needs_read_rates",
    "plans_digest",
]


@dataclass(frozen=True)
class RankFacts:
    """What one rank tells the others before the cache is decided.

    Attributes:
        rank: global rank.
        node_rank: the machine (Lightning's node rank).
        local_rank: rank on the machine (its position in the machine's device list).
        device: CUDA device index, or ``None`` on a CPU trainer.
        budget_bytes: bytes this rank's GPU may cache.
        peer_access: the machine's peer-access matrix over its ranks' devices (sent by local rank 0; ``None`` from
            the others).
    """

    rank: int
    node_rank: int
    local_rank: int
    device: Optional[int]
    budget_bytes: int
    peer_access: Optional[list[list[bool]]] = None


def plans_digest(plans: Mapping[str, CachePlan]) -> str:
    """One hash over every type's plan (type names and plan digests, in the mapping's order)."""
    h = hashlib.sha256()
    for node_type, plan in plans.items():
        h.update(repr((node_type, plan.digest)).encode())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class CacheDecision:
    """A rank's cache: its group, its shard and one plan per featured node type (identical on every rank of the
    group).

    Attributes:
        layout: the machine's placement (policy, groups, note), one for all types.
        group: global ranks sharing this cache, in shard order.
        shard_index: this rank's shard of every type's plan.
        plans: per featured type, its :class:`~lightning_zerocopy.cache.plan.CachePlan` (``len(group)`` shards
            each, maybe no rows): the rows the ranking chose, dealt round-robin to the shards, or, when the group's
            GPUs hold every table whole, every row in id order.
        row_bytes: per featured type, bytes of one row.
        budget_bytes: bytes one GPU may cache (the smallest budget of the job).
        bytes_per_gpu: bytes the fullest GPU of the group holds, its shard's rows and each caching type's lookup
            (0 when nothing is cached: no cache is opened); at most ``budget_bytes``.
        expected_hit_rate: the share of the bytes read (for one width, of the rows read) the group's rows are
            expected to serve: for ``presample`` the held-out hit rate of the chosen ranking (fitted on half of the
            presampled batches, judged on the other half), for ``degree`` the share of the degree scores the rows
            hold; 1 for whole tables (see :class:`~lightning_zerocopy.cache.cached_rows.RankedRows`).
        in_sample_hit_rate: the same over the ranking's own counts (optimistic for ``presample``).
        prior_weight: the presample ranking's choice of the degree prior's weight (``None`` for ``degree``, whole
            tables or nothing cached).
    """

    layout: Layout
    group: tuple[int, ...]
    shard_index: int
    plans: dict[str, CachePlan] = field(repr=False)
    row_bytes: dict[str, int]
    budget_bytes: int
    bytes_per_gpu: int
    expected_hit_rate: float
    in_sample_hit_rate: float = math.nan
    prior_weight: Optional[PriorWeightChoice] = field(default=None, repr=False)

    @property
    def num_shards(self) -> int:
        return len(self.group)

    @property
    def rows_per_type(self) -> dict[str, int]:
        """Cached rows of each featured type, over all shards."""
        return {t: plan.num_cached for t, plan in self.plans.items()}

    @property
    def whole_table(self) -> bool:
        """Whether the group's GPUs hold every row of every featured type (and some row)."""
        plans = self.plans.values()
        return all(p.num_cached == p.num_table_rows for p in plans) and any(p.num_cached for p in plans)

    @property
    def digest(self) -> str:
        """One hash over every type's plan (:func:`plans_digest`; equal on every rank of a cache group)."""
        return plans_digest(self.plans)

    def summary(self) -> str:
        """One line for the log: the layout, what each GPU stores beside the lookups, the expected hit rate."""
        hit = "n/a" if math.isnan(self.expected_hit_rate) else f"{self.expected_hit_rate:.1%}"
        if len(set(self.row_bytes.values())) > 1:
            hit += " of the bytes read"
        note = f" ({self.layout.note})" if self.layout.note else ""
        how = ""
        if self.prior_weight is not None:
            in_sample = "n/a" if math.isnan(self.in_sample_hit_rate) else f"{self.in_sample_hit_rate:.1%}"
            how = (
                f" (held out; presampled counts + {self.prior_weight.final_weight:g} x degree prior, in-sample "
                f"{in_sample})"
            )
        budget = format_bytes(self.budget_bytes)
        cached = {t: p for t, p in self.plans.items() if p.num_cached}
        lookups = sum(lookup_bytes(p.num_table_rows, self.num_shards) for p in (cached or self.plans).values())
        if not cached:
            return (
                f"feature cache: {self.layout.policy}{note}; nothing cached: the row lookup ({format_bytes(lookups)} "
                f"per GPU) leaves no room for a {format_bytes(min(self.row_bytes.values(), default=0))} row in the "
                f"{budget} budget"
            )
        what = "the whole feature table" if self.whole_table else f"{sum(self.rows_per_type.values())} hot rows"
        if len(self.plans) > 1:
            what += " (" + ", ".join(f"{t}: {p.num_cached}/{p.num_table_rows}" for t, p in self.plans.items()) + ")"
        stored = sum(p.max_shard_rows for p in cached.values())
        stored_bytes = sum(p.max_shard_rows * self.row_bytes[t] for t, p in cached.items())
        return (
            f"feature cache: {self.layout.policy}{note}; {what} over {self.num_shards} GPU(s), {stored} rows "
            f"({format_bytes(stored_bytes)}) + {'its lookup' if len(cached) == 1 else 'their lookups'} "
            f"({format_bytes(lookups)}) = {format_bytes(self.bytes_per_gpu)} per GPU of a {budget} budget; expected "
            f"hit rate {hit}{how}"
        )


def decide_cache(
    me: int,
    facts: Sequence[RankFacts],
    scores: Mapping[str, CacheScores],
    num_rows: Mapping[str, int],
    row_bytes: Mapping[str, int],
    policy: str,
    key: str = "cache_policy",
    read_rates: Optional[Mapping[int, ReadRates]] = None,
) -> CacheDecision:
    """The cache of rank ``me`` from every rank's facts and the ranking's inputs per featured type.

    Args:
        me: global rank deciding.
        facts: one entry per rank (any order).
        scores: per featured type, its ranking inputs (identical on every rank; presampled halves for every type or
            none). A type without features is not a key: it is never a candidate. A graph without types has one.
        num_rows: rows of each featured type's table.
        row_bytes: bytes of one row of each featured type.
        policy: ``cache_policy``.
        key: the option's name, for messages.
        read_rates: the read rates each rank measured (by global rank; see :func:`needs_read_rates`): ``auto`` then
            picks, on each machine, the layout with the smaller expected read time.

    Raises:
        ValueError: an unknown policy, a machine whose local rank 0 sent no peer-access matrix, or ``scores``,
            ``num_rows`` and ``row_bytes`` naming different types or sizes.
    """
    if set(scores) != set(num_rows) or set(scores) - set(row_bytes) or any(
        s.prior.numel() != int(num_rows[t]) for t, s in scores.items()
    ):
        raise ValueError(f"decide_cache: scores {sorted(scores)}, num_rows {dict(num_rows)} and row_bytes "
                         f"{sorted(row_bytes)} must name the same featured types, with one score per row")  # fmt: skip
    mine, machine, peer = machine_of(me, facts)
    budget = min(f.budget_bytes for f in facts)
    ranked_by_shards: dict[int, RankedRows] = {}

    def ranked_for(num_shards: int) -> RankedRows:  # the ranking over `num_shards` GPUs (computed once each)
        if num_shards not in ranked_by_shards:
            ranked_by_shards[num_shards] = _ranked(scores, num_rows, row_bytes, budget, num_shards)
        return ranked_by_shards[num_shards]

    price = None
    machine_rates = [read_rates[f.rank] for f in machine if read_rates is not None and f.rank in read_rates]
    if machine_rates:
        rates = ReadRates.mean(machine_rates)
        mean_row = _mean_read_row_bytes(scores, row_bytes)
        price = lambda k: compare_policies(  # noqa: E731
            ranked_for(1).expected_hit_rate, ranked_for(k).expected_hit_rate, k, rates, mean_row
        )
    layout = _layout(policy, peer, scores, num_rows, row_bytes, budget, key, price)
    position = machine.index(mine)
    positions = layout.group_of(position)
    group = tuple(machine[p].rank for p in positions)
    ranked = ranked_for(len(group))
    plans = {t: CachePlan.from_ranking(ranked.rows[t], int(num_rows[t]), len(group)) for t in scores}
    return CacheDecision(
        layout=layout,
        group=group,
        shard_index=positions.index(position),
        plans=plans,
        row_bytes={t: int(row_bytes[t]) for t in scores},
        budget_bytes=int(budget),
        bytes_per_gpu=bytes_per_gpu({t: p.num_cached for t, p in plans.items()}, row_bytes, num_rows, len(group)),
        expected_hit_rate=ranked.expected_hit_rate,
        in_sample_hit_rate=ranked.in_sample_hit_rate,
        prior_weight=ranked.choice,
    )


def _ranked(scores: Mapping[str, CacheScores], num_rows: Mapping[str, int], row_bytes: Mapping[str, int],
            budget: int, num_shards: int) -> RankedRows:  # fmt: skip
    """:func:`~lightning_zerocopy.cache.cached_rows.rank_rows`, or every table whole (in id order: a row's slot is
    its id, every read hits) where the budget holds them with their lookups."""
    if bytes_per_gpu(num_rows, row_bytes, num_rows, num_shards) > budget:
        return rank_rows(scores, row_bytes, budget, num_shards)
    rows = {t: torch.arange(int(num_rows[t]), dtype=torch.int64) for t in scores}
    cached = any(r.numel() for r in rows.values())
    return RankedRows(rows, 1.0 if cached else 0.0, math.nan if cached else 0.0, "whole")


def hot_bytes_per_gpu(scores: Mapping[str, CacheScores], num_rows: Mapping[str, int],
                      row_bytes: Mapping[str, int]) -> int:  # fmt: skip
    """Bytes one GPU needs to hold the hot rows of every type (rows sampling ever reads) and their lookups."""
    hot = {t: min(s.hot_rows, int(num_rows[t])) for t, s in scores.items()}
    return bytes_per_gpu(hot, row_bytes, num_rows, 1)


def needs_read_rates(
    policy: str,
    facts: Sequence[RankFacts],
    scores: Mapping[str, CacheScores],
    num_rows: Mapping[str, int],
    row_bytes: Mapping[str, int],
) -> bool:
    """Whether ``auto`` has to weigh clique against replicate on some machine of the job (the same answer on every
    rank, so that all of them measure, or none): GPU ranks, GPUs with peer access, and more hot bytes (rows and
    lookups of every type) than one GPU's budget holds (and room for some row: a budget the lookups fill caches
    nothing either way)."""
    if policy != "auto" or any(f.device is None for f in facts):
        return False
    budget = min(f.budget_bytes for f in facts)
    if not fits_a_row(budget, num_rows, row_bytes) or hot_bytes_per_gpu(scores, num_rows, row_bytes) <= budget:
        return False
    return has_peer_pairs(facts)


def _mean_read_row_bytes(scores: Mapping[str, CacheScores], row_bytes: Mapping[str, int]) -> int:
    """Bytes of the mean row read, by the ranking's evidence (presampled counts, else the degree priors): what the
    cost note counts a row as (the choice does not depend on it: both policies' times scale with it)."""
    reads = {t: float((s.halves.sum() if s.halves is not None else s.prior.sum())) for t, s in scores.items()}
    total = sum(reads.values())
    if total <= 0:
        return max((int(b) for b in row_bytes.values()), default=0)
    return max(1, round(sum(reads[t] * int(row_bytes[t]) for t in reads) / total))


def _layout(policy: str, peer: list[list[bool]], scores: Mapping[str, CacheScores], num_rows: Mapping[str, int],
            row_bytes: Mapping[str, int], budget: int, key: str,
            price: Optional[Callable[[int], PolicyCosts]] = None) -> Layout:  # fmt: skip
    if policy != "auto" or len(peer) == 1:  # choose_layout refuses an unknown policy
        return choose_layout(policy, peer, hot_rows=0, rows_per_gpu=0, key=key)
    need = hot_bytes_per_gpu(scores, num_rows, row_bytes)
    if need <= budget:
        replicate = tuple((i,) for i in range(len(peer)))
        note = (f"auto: the hot rows ({format_bytes(need)} with their lookups) fit one GPU's {format_bytes(budget)} "
                "budget, replicate")  # fmt: skip
        return Layout("replicate", replicate, note=note)
    # in bytes: the hot bytes exceed one GPU's budget; the price (when rates were measured) weighs the two layouts
    return choose_layout("auto", peer, hot_rows=need, rows_per_gpu=budget, key=key, price=price)


def machine_of(me: int, facts: Sequence[RankFacts]) -> tuple[RankFacts, list[RankFacts], list[list[bool]]]:
    """Rank ``me``'s facts, its machine's ranks (by local rank) and the machine's peer-access matrix.

    Raises:
        ValueError: a machine whose local rank 0 sent no peer-access matrix, or one of the wrong size.
    """
    by_rank = {f.rank: f for f in facts}
    mine = by_rank[me]
    machine = sorted((f for f in facts if f.node_rank == mine.node_rank), key=lambda f: f.local_rank)
    peer = next((f.peer_access for f in machine if f.local_rank == 0 and f.peer_access is not None), None)
    if peer is None:
        raise ValueError(f"node {mine.node_rank}: local rank 0 sent no peer-access matrix")
    if len(peer) != len(machine):
        raise ValueError(
            f"node {mine.node_rank} has {len(machine)} ranks but a {len(peer)}x{len(peer)} peer-access matrix"
        )
    return mine, machine, peer


def has_peer_pairs(facts: Sequence[RankFacts]) -> bool:
    """Whether some machine of the job has two GPUs that can read each other's memory (peer access both ways)."""
    for f in facts:
        if f.peer_access is not None and any(
            f.peer_access[i][j] and f.peer_access[j][i]
            for i in range(len(f.peer_access))
            for j in range(len(f.peer_access))
            if i != j
        ):
            return True
    return False
