"""Deciding a rank's feature cache: budget -> rows per GPU, ranking -> hot order, topology -> layout -> plan.

Everything here is a function of values every rank exchanges first (:class:`RankFacts`), so each rank computes the
same :class:`CacheDecision` for its cache group without further communication; the strategy does the exchanging,
the placing on the GPU and the releasing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from lightning_zerocopy.gather.cache_plan import CachePlan
from lightning_zerocopy.strategies.budget import format_bytes
from lightning_zerocopy.strategies.ranking import expected_hit_rate, order_by_score
from lightning_zerocopy.strategies.topology import Layout, choose_layout

__all__ = ["CacheDecision", "RankFacts", "decide_cache"]


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
        plan: the :class:`~lightning_zerocopy.gather.cache_plan.CachePlan` (rows and their shards): the hottest
            ``rows_per_gpu * len(group)`` rows dealt round-robin to the shards, or, when the group's GPUs hold the
            whole table, every row in id order.
        rows_per_gpu: rows one GPU's budget holds (the smallest budget of the job).
        row_bytes: bytes of one feature row.
        expected_hit_rate: share of the ranking's counted accesses the group's rows serve.
        whole_table: whether the group's GPUs hold every row.
    """

    layout: Layout
    group: tuple[int, ...]
    shard_index: int
    plan: CachePlan = field(repr=False)
    rows_per_gpu: int
    row_bytes: int
    expected_hit_rate: float
    whole_table: bool

    @property
    def num_shards(self) -> int:
        return self.plan.num_shards

    def summary(self) -> str:
        """One line for the log."""
        hit = "n/a" if math.isnan(self.expected_hit_rate) else f"{self.expected_hit_rate:.1%}"
        what = "the whole feature table" if self.whole_table else f"{self.plan.num_cached} hot rows"
        note = f" ({self.layout.note})" if self.layout.note else ""
        return (
            f"feature cache: {self.layout.policy}{note}; {what} over {self.num_shards} GPU(s), "
            f"{self.rows_per_gpu} rows ({format_bytes(self.rows_per_gpu * self.row_bytes)}) per GPU; "
            f"expected hit rate {hit}"
        )


def decide_cache(
    me: int,
    facts: Sequence[RankFacts],
    scores: torch.Tensor,
    num_nodes: int,
    row_bytes: int,
    policy: str,
    key: str = "cache_policy",
) -> CacheDecision:
    """The cache of rank ``me`` from every rank's facts and the summed ranking scores.

    Args:
        me: global rank deciding.
        facts: one entry per rank (any order).
        scores: int64 ``[num_nodes]`` access scores (identical on every rank).
        num_nodes: rows of the feature table.
        row_bytes: bytes per row.
        policy: ``cache_policy``.
        key: the option's name, for messages.

    Raises:
        ValueError: an unknown policy, or a machine whose local rank 0 sent no peer-access matrix.
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
    rows_per_gpu = min(f.budget_bytes for f in facts) // max(row_bytes, 1)
    hot = int((scores > 0).sum())
    layout = choose_layout(policy, peer, hot_rows=min(hot, num_nodes), rows_per_gpu=rows_per_gpu, key=key)
    position = machine.index(mine)
    positions = layout.group_of(position)
    group = tuple(machine[p].rank for p in positions)
    capacity = rows_per_gpu * len(group)
    if capacity >= num_nodes:  # the whole table: every read hits, a row's slot is its id
        plan = CachePlan.from_ranking(torch.arange(num_nodes, dtype=torch.int64), num_nodes, len(group))
    else:
        plan = CachePlan.from_ranking(order_by_score(scores), num_nodes, len(group), num_rows=capacity)
    return CacheDecision(
        layout=layout,
        group=group,
        shard_index=positions.index(position),
        plan=plan,
        rows_per_gpu=rows_per_gpu,
        row_bytes=row_bytes,
        expected_hit_rate=expected_hit_rate(scores, plan.rows) if plan.num_cached else 0.0,
        whole_table=plan.num_cached == num_nodes and num_nodes > 0,
    )

