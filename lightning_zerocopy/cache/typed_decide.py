"""Deciding a rank's feature cache over typed rows: one budget, one layout, one :class:`CachePlan` per featured type.

The typed counterpart of :func:`~lightning_zerocopy.cache.decide.decide_cache`, from the same exchanged
:class:`~lightning_zerocopy.cache.decide.RankFacts` and the per-type ranking inputs (identical on every rank), so
each rank of a group computes the same :class:`TypedCacheDecision` without further communication. The layout is
decided once for all types (one group). ``auto`` replicates where one GPU's budget holds the hot rows of every type
(and their lookups); otherwise, with the read rates the ranks measured (the same probe as for one table,
:func:`~lightning_zerocopy.cache.probe.probe_read_rates`: the rates are the hardware's, not the graph's), it prices
both layouts with :func:`~lightning_zerocopy.cache.cost.compare_policies` on the typed ranking's expected hit rates
(shares of the *bytes* read) for one GPU's budget and for the clique's ``k`` budgets, and takes the cheaper; without
rates (:func:`needs_typed_read_rates` said none were needed, or none were given) it is a clique wherever GPUs have
peer access.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from lightning_zerocopy.cache.budget import format_bytes
from lightning_zerocopy.cache.cliques import CACHE_POLICIES, Layout, choose_layout
from lightning_zerocopy.cache.cost import PolicyCosts, compare_policies
from lightning_zerocopy.cache.decide import RankFacts, has_peer_pairs, machine_of
from lightning_zerocopy.cache.plan import CachePlan
from lightning_zerocopy.cache.ranking import CacheScores, PriorWeightChoice
from lightning_zerocopy.cache.read_rates import ReadRates
from lightning_zerocopy.cache.typed import TypedRanking, rank_typed, typed_bytes_per_gpu

__all__ = ["TypedCacheDecision", "decide_typed_cache", "needs_typed_read_rates", "typed_plans_digest"]


def typed_plans_digest(plans: Mapping[str, CachePlan]) -> str:
    """One hash over every type's plan (type names and plan digests, in the mapping's order)."""
    h = hashlib.sha256()
    for node_type, plan in plans.items():
        h.update(repr((node_type, plan.digest)).encode())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class TypedCacheDecision:
    """A rank's cache over typed rows: its group, its shard and one plan per featured type (identical on every rank
    of the group).

    Attributes:
        layout: the machine's placement (policy, groups, note), one for all types.
        group: global ranks sharing this cache, in shard order.
        shard_index: this rank's shard of every type's plan.
        plans: per featured type, its :class:`CachePlan` (``len(group)`` shards each; maybe no rows).
        row_bytes: per featured type, bytes of one row.
        budget_bytes: bytes one GPU may cache (the smallest budget of the job).
        bytes_per_gpu: bytes the fullest GPU of the group holds (rows and lookups); at most ``budget_bytes``.
        expected_hit_rate: the share of the bytes read the cached rows are expected to serve (see
            :class:`~lightning_zerocopy.cache.typed.TypedRanking`).
        in_sample_hit_rate: the same over the ranking's own counts.
        prior_weight: the presample ranking's prior weight choice (``None`` for ``degree``).
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
        """Whether every row of every featured type is cached."""
        return all(plan.num_cached == plan.num_table_rows for plan in self.plans.values())

    @property
    def digest(self) -> str:
        """One hash over every type's plan (:func:`typed_plans_digest`)."""
        return typed_plans_digest(self.plans)

    def summary(self) -> str:
        """One line for the log: the layout, the rows of each type, the bytes per GPU, the expected hit rate."""
        hit = "n/a" if math.isnan(self.expected_hit_rate) else f"{self.expected_hit_rate:.1%}"
        note = f" ({self.layout.note})" if self.layout.note else ""
        per_type = ", ".join(f"{t}: {p.num_cached}/{p.num_table_rows}" for t, p in self.plans.items())
        how = ""
        if self.prior_weight is not None:
            in_sample = "n/a" if math.isnan(self.in_sample_hit_rate) else f"{self.in_sample_hit_rate:.1%}"
            how = (
                f" (held out; presampled counts + {self.prior_weight.final_weight:g} x degree prior, in-sample "
                f"{in_sample})"
            )
        return (
            f"feature cache over typed rows: {self.layout.policy}{note}; rows cached per type ({per_type}) over "
            f"{self.num_shards} GPU(s), {format_bytes(self.bytes_per_gpu)} per GPU with the lookups of a "
            f"{format_bytes(self.budget_bytes)} budget; expected hit rate {hit} of the bytes read{how}"
        )


def hot_bytes_per_gpu(scores: Mapping[str, CacheScores], num_rows: Mapping[str, int],
                      row_bytes: Mapping[str, int]) -> int:  # fmt: skip
    """Bytes one GPU needs to hold the hot rows of every type (rows sampling ever reads) and their lookups."""
    hot = {t: min(s.hot_rows, int(num_rows[t])) for t, s in scores.items()}
    return typed_bytes_per_gpu(hot, row_bytes, num_rows, 1)


def needs_typed_read_rates(
    policy: str,
    facts: Sequence[RankFacts],
    scores: Mapping[str, CacheScores],
    num_rows: Mapping[str, int],
    row_bytes: Mapping[str, int],
) -> bool:
    """:func:`~lightning_zerocopy.cache.decide.needs_read_rates` for typed rows: whether ``auto`` has to weigh clique
    against replicate on some machine (the same answer on every rank, so that all of them measure, or none): GPU
    ranks, GPUs with peer access, and more hot bytes (rows and lookups of every type) than one GPU's budget holds."""
    if policy != "auto" or any(f.device is None for f in facts):
        return False
    if hot_bytes_per_gpu(scores, num_rows, row_bytes) <= min(f.budget_bytes for f in facts):
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
    if policy not in CACHE_POLICIES:
        raise ValueError(f"{key} must be one of {', '.join(map(repr, CACHE_POLICIES))}, got {policy!r}")
    if policy != "auto" or len(peer) == 1:
        return choose_layout(policy, peer, hot_rows=0, rows_per_gpu=0, key=key)
    need = hot_bytes_per_gpu(scores, num_rows, row_bytes)
    if need <= budget:
        replicate = tuple((i,) for i in range(len(peer)))
        note = (f"auto: the hot rows of every type ({format_bytes(need)}) fit one GPU's {format_bytes(budget)} "
                "budget, replicate")  # fmt: skip
        return Layout("replicate", replicate, note=note)
    # in bytes: the hot bytes exceed one GPU's budget; the price (when rates were measured) weighs the two layouts
    return choose_layout("auto", peer, hot_rows=need, rows_per_gpu=budget, key=key, price=price)


def decide_typed_cache(
    me: int,
    facts: Sequence[RankFacts],
    scores: Mapping[str, CacheScores],
    num_rows: Mapping[str, int],
    row_bytes: Mapping[str, int],
    policy: str,
    key: str = "cache_policy",
    read_rates: Optional[Mapping[int, ReadRates]] = None,
) -> TypedCacheDecision:
    """The typed cache of rank ``me`` from every rank's facts and the per-type ranking inputs.

    Args:
        me: global rank deciding.
        facts: one entry per rank (any order).
        scores: per featured type, its ranking inputs (identical on every rank; presampled halves for every type or
            none). A type without features is not a key: it is never a candidate.
        num_rows: rows of each featured type's table.
        row_bytes: bytes of one row of each featured type.
        policy: ``cache_policy``.
        key: the option's name, for messages.
        read_rates: the read rates each rank measured (by global rank; see :func:`needs_typed_read_rates`): ``auto``
            then picks, on each machine, the layout with the smaller expected read time
            (:func:`~lightning_zerocopy.cache.cost.compare_policies` of the byte hit rates :func:`rank_typed`
            expects for one GPU's budget and for ``k`` of them), as
            :func:`~lightning_zerocopy.cache.decide.decide_cache` does for one table.

    Raises:
        ValueError: an unknown policy, a machine whose local rank 0 sent no peer-access matrix, or ``scores`` and
            ``num_rows`` naming different types.
    """
    if set(scores) != set(num_rows) or set(scores) - set(row_bytes):
        raise ValueError(f"decide_typed_cache: scores {sorted(scores)}, num_rows {sorted(num_rows)} and row_bytes "
                         f"{sorted(row_bytes)} must name the same featured types")  # fmt: skip
    mine, machine, peer = machine_of(me, facts)
    budget = min(f.budget_bytes for f in facts)
    ranked_by_shards: dict[int, TypedRanking] = {}

    def ranked_for(num_shards: int) -> TypedRanking:  # the ranking over `num_shards` GPUs (computed once each)
        if num_shards not in ranked_by_shards:
            ranked_by_shards[num_shards] = rank_typed(scores, row_bytes, budget, num_shards)
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
    used = typed_bytes_per_gpu({t: p.num_cached for t, p in plans.items()}, row_bytes, num_rows, len(group))
    return TypedCacheDecision(
        layout=layout,
        group=group,
        shard_index=positions.index(position),
        plans=plans,
        row_bytes={t: int(row_bytes[t]) for t in scores},
        budget_bytes=int(budget),
        bytes_per_gpu=used,
        expected_hit_rate=ranked.expected_hit_rate,
        in_sample_hit_rate=ranked.in_sample_hit_rate,
        prior_weight=ranked.choice,
    )
