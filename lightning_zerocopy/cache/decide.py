"""Deciding a rank's feature cache: budget -> rows per GPU, ranking -> hot order, topology -> layout -> plan.

The budget is per GPU and covers the cached rows and the row -> (shard, slot) lookup that a process opening the
cache builds over the whole table (:func:`~lightning_zerocopy.cache.plan.lookup_bytes`: 4 or 8 bytes per table row,
for ``replicate`` and on each GPU of a clique alike). The lookup is charged first and the rows get the rest; a
budget that does not hold the lookup caches nothing (as the typed decision,
:mod:`~lightning_zerocopy.cache.typed`, charges each type's lookup before its first row). One lookup per GPU is
charged: a pipeline worker that opens the cache on the same GPU builds a second one, which the budget does not count.

Everything here is a function of values every rank exchanges first (:class:`RankFacts`) and of the ranking's
inputs (identical on every rank), so each rank computes the same :class:`CacheDecision` for its cache group without
further communication; the strategy does the exchanging, the placing on the GPU and the releasing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import torch

from lightning_zerocopy.cache.plan import CachePlan, lookup_bytes
from lightning_zerocopy.cache.read_rates import ReadRates
from lightning_zerocopy.cache.budget import format_bytes
from lightning_zerocopy.cache.cost import compare_policies
from lightning_zerocopy.cache.ranking import CacheScores, PriorWeightChoice
from lightning_zerocopy.cache.cliques import Layout, choose_layout

__all__ = [
    "CacheDecision",
    "RankFacts",
    "decide_cache",
    "has_peer_pairs",
    "machine_of",
    "needs_read_rates",
    "rows_per_gpu_of",
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


@dataclass(frozen=True)
class CacheDecision:
    """A rank's cache: its group, its shard and the plan's rows (identical on every rank of the group).

    Attributes:
        layout: the machine's placement (policy, groups, note).
        group: global ranks sharing this cache, in shard order.
        shard_index: this rank's shard.
        plan: the :class:`~lightning_zerocopy.cache.plan.CachePlan` (rows and their shards): the hottest
            ``rows_per_gpu * len(group)`` rows dealt round-robin to the shards, or, when the group's GPUs hold the
            whole table, every row in id order.
        rows_per_gpu: rows one GPU's budget holds once the lookup is charged (the smallest budget of the job; 0
            when the lookup alone does not fit).
        row_bytes: bytes of one feature row.
        budget_bytes: bytes one GPU may cache (the smallest budget of the job).
        lookup_bytes: bytes of the row lookup charged to each GPU's budget
            (:func:`~lightning_zerocopy.cache.plan.lookup_bytes` over the whole table and ``len(group)`` shards).
        bytes_per_gpu: bytes the fullest GPU of the group holds, its shard's rows and the lookup (0 when nothing is
            cached: no cache is opened); at most ``budget_bytes``.
        expected_hit_rate: the share of accesses the group's rows are expected to serve: for ``presample`` the
            held-out hit rate of the chosen ranking (fitted on half of the presampled batches, judged on the other
            half; see :class:`~lightning_zerocopy.cache.ranking.RankedRows`), for ``degree`` the share of
            the degree scores the rows hold; 1 for the whole table.
        whole_table: whether the group's GPUs hold every row.
        in_sample_hit_rate: the share of the ranking's own counts the rows serve (optimistic for ``presample``).
        prior_weight: the presample ranking's choice of the degree prior's weight (``None`` for ``degree`` or the
            whole table).
    """

    layout: Layout
    group: tuple[int, ...]
    shard_index: int
    plan: CachePlan = field(repr=False)
    rows_per_gpu: int
    row_bytes: int
    budget_bytes: int
    lookup_bytes: int
    bytes_per_gpu: int
    expected_hit_rate: float
    whole_table: bool
    in_sample_hit_rate: float = math.nan
    prior_weight: Optional[PriorWeightChoice] = field(default=None, repr=False)

    @property
    def num_shards(self) -> int:
        return self.plan.num_shards

    def summary(self) -> str:
        """One line for the log."""
        hit = "n/a" if math.isnan(self.expected_hit_rate) else f"{self.expected_hit_rate:.1%}"
        what = "the whole feature table" if self.whole_table else f"{self.plan.num_cached} hot rows"
        note = f" ({self.layout.note})" if self.layout.note else ""
        how = ""
        if self.prior_weight is not None:
            in_sample = "n/a" if math.isnan(self.in_sample_hit_rate) else f"{self.in_sample_hit_rate:.1%}"
            how = (
                f" (held out; presampled counts + {self.prior_weight.final_weight:g} x degree prior, in-sample "
                f"{in_sample})"
            )
        budget = format_bytes(self.budget_bytes)
        if self.plan.num_cached == 0 and self.rows_per_gpu == 0:
            return (
                f"feature cache: {self.layout.policy}{note}; nothing cached: the row lookup "
                f"({format_bytes(self.lookup_bytes)} per GPU) leaves no room for a {format_bytes(self.row_bytes)} row "
                f"in the {budget} budget"
            )
        stored = self.plan.max_shard_rows
        return (
            f"feature cache: {self.layout.policy}{note}; {what} over {self.num_shards} GPU(s), "
            f"{stored} rows ({format_bytes(stored * self.row_bytes)}) + its lookup ({format_bytes(self.lookup_bytes)}) "
            f"= {format_bytes(self.bytes_per_gpu)} per GPU of a {budget} budget; expected hit rate {hit}{how}"
        )


def decide_cache(
    me: int,
    facts: Sequence[RankFacts],
    scores: Union[CacheScores, torch.Tensor],
    num_nodes: int,
    row_bytes: int,
    policy: str,
    key: str = "cache_policy",
    read_rates: Optional[dict[int, ReadRates]] = None,
) -> CacheDecision:
    """The cache of rank ``me`` from every rank's facts and the summed ranking scores.

    Args:
        me: global rank deciding.
        facts: one entry per rank (any order).
        scores: the ranking's inputs (identical on every rank): a
            :class:`~lightning_zerocopy.cache.ranking.CacheScores`, or a ``[num_nodes]`` tensor of scores
            ranked by themselves (ties by id). The number of rows the group caches is decided here and handed
            to :meth:`~lightning_zerocopy.cache.ranking.CacheScores.rank`, whose choice depends on it.
        num_nodes: rows of the feature table.
        row_bytes: bytes per row.
        policy: ``cache_policy``. Each GPU's budget is charged the row lookup first (see the module docstring),
            sized for the group's shard count, and holds rows with the rest.
        key: the option's name, for messages.
        read_rates: the read rates each rank measured (by global rank; see :func:`needs_read_rates`): ``auto``
            then picks the policy with the smaller expected read time on each machine.

    Raises:
        ValueError: an unknown policy, or a machine whose local rank 0 sent no peer-access matrix.
    """
    mine, machine, peer = machine_of(me, facts)
    if isinstance(scores, torch.Tensor):
        scores = CacheScores(scores)
    rows_per_gpu = rows_per_gpu_of(facts, row_bytes, num_nodes)  # one shard; a clique's rows are sized below
    hot = scores.hot_rows
    ranked_by_capacity: dict[int, Any] = {}

    def ranked(capacity: int) -> Any:  # the ranking for `capacity` rows (computed once per capacity)
        if capacity not in ranked_by_capacity:
            ranked_by_capacity[capacity] = scores.rank(capacity)
        return ranked_by_capacity[capacity]

    def hit_rate(capacity: int) -> float:
        return 1.0 if capacity >= num_nodes else ranked(capacity).expected_hit_rate

    price = None
    machine_rates = [read_rates[f.rank] for f in machine if read_rates is not None and f.rank in read_rates]
    if machine_rates:
        rates = ReadRates.mean(machine_rates)
        price = lambda k: compare_policies(  # noqa: E731
            hit_rate(rows_per_gpu), hit_rate(rows_per_gpu_of(facts, row_bytes, num_nodes, k) * k), k, rates, row_bytes
        )
    layout = choose_layout(policy, peer, hot_rows=min(hot, num_nodes), rows_per_gpu=rows_per_gpu, key=key, price=price)
    position = machine.index(mine)
    positions = layout.group_of(position)
    group = tuple(machine[p].rank for p in positions)
    rows_per_gpu = rows_per_gpu_of(facts, row_bytes, num_nodes, len(group))
    capacity = rows_per_gpu * len(group)
    if capacity >= num_nodes:  # the whole table: every read hits, a row's slot is its id
        plan = CachePlan.from_ranking(torch.arange(num_nodes, dtype=torch.int64), num_nodes, len(group))
        expected, in_sample, choice = (1.0 if num_nodes else 0.0), math.nan, None
    else:
        chosen = ranked(capacity)
        plan = CachePlan.from_ranking(chosen.rows, num_nodes, len(group))
        expected, in_sample, choice = chosen.expected_hit_rate, chosen.in_sample_hit_rate, chosen.choice
    if plan.num_cached == 0:
        expected, in_sample = 0.0, 0.0
    lookup = lookup_bytes(num_nodes, len(group))
    used = lookup + plan.max_shard_rows * row_bytes if plan.num_cached else 0
    return CacheDecision(
        layout=layout,
        group=group,
        shard_index=positions.index(position),
        plan=plan,
        rows_per_gpu=rows_per_gpu,
        row_bytes=row_bytes,
        budget_bytes=min(f.budget_bytes for f in facts),
        lookup_bytes=lookup,
        bytes_per_gpu=used,
        expected_hit_rate=expected,
        whole_table=plan.num_cached == num_nodes and num_nodes > 0,
        in_sample_hit_rate=in_sample,
        prior_weight=choice,
    )



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


def rows_per_gpu_of(facts: Sequence[RankFacts], row_bytes: int, num_nodes: int, num_shards: int = 1) -> int:
    """Rows one GPU's budget holds: the smallest budget of the job, less the row lookup every GPU builds over the
    ``num_nodes``-row table for ``num_shards`` shards (:func:`~lightning_zerocopy.cache.plan.lookup_bytes`), over
    the row size; 0 when the lookup alone does not fit."""
    room = min(f.budget_bytes for f in facts) - lookup_bytes(num_nodes, num_shards)
    return max(room, 0) // max(row_bytes, 1)


def needs_read_rates(policy: str, facts: Sequence[RankFacts], hot_rows: int, num_nodes: int, row_bytes: int) -> bool:
    """Whether ``auto`` has to weigh clique against replicate on some machine of the job (the same answer on every
    rank, so that all of them measure, or none): GPUs with peer access, and more hot rows than one GPU holds (and
    room for some: a budget the row lookup fills caches nothing either way)."""
    if policy != "auto" or any(f.device is None for f in facts):
        return False
    rows_per_gpu = rows_per_gpu_of(facts, row_bytes, num_nodes)
    if rows_per_gpu == 0 or min(hot_rows, num_nodes) <= rows_per_gpu:  # nothing fits, or the hot rows fit one GPU
        return False
    return has_peer_pairs(facts)


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
