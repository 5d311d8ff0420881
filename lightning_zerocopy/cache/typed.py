"""One cache budget over the rows of every featured node type: which ``(node type, row)`` pairs a GPU caches.

The candidates are the rows of every featured type, ranked by *expected reads per byte* (a row's score over its
bytes: a type's rows differ in width and dtype), so a narrow type's hot rows go before a wide type's lukewarm ones.
Each type's lookup (:func:`~lightning_zerocopy.cache.plan.lookup_bytes`, one entry per table row, held by every
GPU that opens the cache) is charged to the budget before the type's first row. The budget is per GPU: with ``k``
shards (a clique of ``k`` GPUs) a type's cached rows are dealt round-robin, so the fullest GPU holds
``ceil(rows / k)`` of them; :func:`allocate_typed` takes the longest prefix of the ranked candidates whose bytes on
that GPU stay within the budget (a type whose lookup and first row do not fit is left out, and the walk goes on
without it).

Scores per type (:func:`typed_degree_scores`): a node of type ``s`` is read as an in-neighbor over every edge type
``(s, r, d)``, so its degree prior is its appearances in all those CSCs' ``indices``. ``presample`` counts per type
come from the heterogeneous builder (:func:`~lightning_zerocopy.strategies.presample.presample_typed_halves`);
:func:`rank_typed` blends them with the prior per type (:func:`~lightning_zerocopy.cache.ranking.blended_scores`, the
prior scaled to that type's counts) and picks the weight that serves the most held-out *bytes* read.

Pure CPU code over tensors and ints: identical on every rank that has the same inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

from lightning_zerocopy.cache.plan import lookup_bytes
from lightning_zerocopy.cache.ranking import (
    PRIOR_WEIGHTS,
    CacheScores,
    PriorWeightChoice,
    blended_scores,
    degree_scores,
    top_rows,
)

__all__ = ["TypedRanking", "allocate_typed", "lookup_bytes", "rank_typed", "typed_bytes_per_gpu", "typed_degree_scores"]


def typed_degree_scores(
    graphs: Mapping[tuple[str, str, str], Any], num_nodes: Mapping[str, int], featured: Sequence[str]
) -> dict[str, torch.Tensor]:
    """Per featured type ``s``: appearances of each of its nodes in the CSC ``indices`` of every edge type
    ``(s, r, d)`` (int64 ``[num_nodes[s]]``, CPU). A type that is no edge type's source scores 0 everywhere.

    Args:
        graphs: per edge type, an object with ``indices`` (its CSC neighbor array, ids of the source type).
        num_nodes: nodes per type.
        featured: the featured node types (the only candidates of the cache).
    """
    scores = {t: torch.zeros(int(num_nodes[t]), dtype=torch.int64) for t in featured}
    for edge_type, graph in graphs.items():
        source = edge_type[0]
        if source in scores:
            scores[source] += degree_scores(graph.indices, int(num_nodes[source])).cpu()
    return scores


def typed_bytes_per_gpu(rows: Mapping[str, int], row_bytes: Mapping[str, int], num_rows: Mapping[str, int],
                        num_shards: int) -> int:  # fmt: skip
    """Bytes the fullest GPU holds for ``rows[t]`` cached rows of each type over ``num_shards`` shards: each type's
    lookup (where it caches any row) plus ``ceil(rows / num_shards)`` of its rows."""
    total = 0
    for t, n in rows.items():
        if n > 0:
            total += lookup_bytes(int(num_rows[t]), num_shards) + -(-int(n) // num_shards) * int(row_bytes[t])
    return total


def allocate_typed(
    scores: Mapping[str, torch.Tensor],
    tiebreak: Mapping[str, torch.Tensor],
    row_bytes: Mapping[str, int],
    budget_bytes: int,
    num_shards: int = 1,
) -> dict[str, torch.Tensor]:
    """The rows of each type a cache of ``budget_bytes`` per GPU holds over ``num_shards`` shards.

    The candidates, every row of every type in ``scores``, are ordered by ``score / row_bytes`` descending, then
    ``tiebreak / row_bytes`` descending, then type (``scores``' order), then within a type as
    :func:`~lightning_zerocopy.cache.ranking.top_rows` orders it (id ascending). The longest prefix whose bytes on
    the fullest GPU (:func:`typed_bytes_per_gpu`) fit the budget is taken; where the first candidate left out is a
    type's first row (its lookup does not fit), that type is dropped and the prefix is extended without it.

    Returns:
        Per type of ``scores`` (every one, maybe empty): int64 CPU row ids, hottest first.
    """
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"`num_shards` must be an int >= 1, got {num_shards!r}")
    out = {t: torch.zeros(0, dtype=torch.int64) for t in scores}
    budget = int(budget_bytes)
    if budget <= 0:
        return out
    excluded: set[str] = set()
    while True:
        types = [t for t in scores if t not in excluded and int(row_bytes[t]) > 0 and scores[t].numel() > 0]
        if not types:
            return out
        ids, values, ties, kinds, positions = [], [], [], [], []
        for i, t in enumerate(types):
            rb = int(row_bytes[t])
            cap = min(scores[t].numel(), num_shards * (budget // rb))  # more rows of t never fit the fullest GPU
            ranked = top_rows(scores[t], tiebreak[t], cap).cpu()
            ids.append(ranked)
            values.append(scores[t].cpu()[ranked].to(torch.float64) / rb)
            ties.append(tiebreak[t].cpu()[ranked].to(torch.float64) / rb)
            kinds.append(torch.full((ranked.numel(),), i, dtype=torch.int64))
            positions.append(torch.arange(ranked.numel(), dtype=torch.int64))
        value, tie, kind, position = (torch.cat(x) for x in (values, ties, kinds, positions))
        order = torch.sort(tie, descending=True, stable=True).indices  # lexicographic: the last key first
        order = order[torch.sort(value[order], descending=True, stable=True).indices]
        kind, position = kind[order], position[order]
        # per-GPU bytes of each prefix: a type's lookup at its first row, a row's bytes every num_shards-th row
        rb_of = torch.tensor([int(row_bytes[t]) for t in types], dtype=torch.int64)
        lookup_of = torch.tensor([lookup_bytes(scores[t].numel(), num_shards) for t in types], dtype=torch.int64)
        step = torch.where(position % num_shards == 0, rb_of[kind], 0) + torch.where(position == 0, lookup_of[kind], 0)
        used = torch.cumsum(step, 0)
        taken = int(torch.searchsorted(used, torch.tensor([budget], dtype=torch.int64), right=True))
        if taken < kind.numel() and int(position[taken]) == 0:
            excluded.add(types[int(kind[taken])])  # its lookup and first row do not fit: go on without it
            continue
        counts = torch.bincount(kind[:taken], minlength=len(types)).tolist()
        for i, t in enumerate(types):
            out[t] = ids[i][: counts[i]].contiguous()
        return out


@dataclass(frozen=True)
class TypedRanking:
    """The rows of each type a typed cache holds, from :func:`rank_typed`.

    Attributes:
        rows: per featured type, int64 CPU row ids, hottest first (maybe empty).
        expected_hit_rate: the share of the bytes read that the rows are expected to serve (presample: held out,
            the chosen weight's; degree: the share of the degree scores times row bytes they hold; ``nan`` without
            any evidence).
        in_sample_hit_rate: the same share over the counts the ranking was built from.
        basis: ``"held-out"`` or ``"in-sample"``.
        choice: the prior weight choice (presample only).
    """

    rows: dict[str, torch.Tensor]
    expected_hit_rate: float
    in_sample_hit_rate: float
    basis: str
    choice: Optional[PriorWeightChoice] = None


def _bytes_hit_rate(reads: Mapping[str, torch.Tensor], rows: Mapping[str, torch.Tensor],
                    row_bytes: Mapping[str, int]) -> float:  # fmt: skip
    """Share of the bytes ``reads`` counts (per type: reads per row times the row's bytes) that ``rows`` serve."""
    total = sum(float(reads[t].sum()) * int(row_bytes[t]) for t in reads)
    if total == 0:
        return math.nan
    served = sum(float(reads[t][rows[t]].sum()) * int(row_bytes[t]) for t in reads if rows[t].numel())
    return served / total


def rank_typed(
    scores: Mapping[str, CacheScores],
    row_bytes: Mapping[str, int],
    budget_bytes: int,
    num_shards: int = 1,
    weights: Sequence[float] = PRIOR_WEIGHTS,
) -> TypedRanking:
    """The rows of each featured type to cache under ``budget_bytes`` per GPU over ``num_shards`` shards.

    Degree (every ``halves`` is ``None``): :func:`allocate_typed` over the priors. Presample (every type has
    ``halves``): for each candidate weight, rank by ``blended_scores(half_a, prior, w)`` per type, allocate, and
    measure the share of ``half_b``'s bytes read that the rows serve, and the other way round; the best mean wins
    (ties to the smaller index), and the final ranking blends both halves with ``weight / 2``
    (:attr:`~lightning_zerocopy.cache.ranking.PriorWeightChoice.final_weight`).

    Raises:
        ValueError: some types with presampled counts and others without.
    """
    presampled = {t: s.halves is not None for t, s in scores.items()}
    if len(set(presampled.values())) > 1:
        raise ValueError("rank_typed: give presampled halves for every type or for none")
    priors = {t: s.prior.cpu() for t, s in scores.items()}
    if not any(presampled.values()):
        rows = allocate_typed(priors, priors, row_bytes, budget_bytes, num_shards)
        rate = _bytes_hit_rate(priors, rows, row_bytes)
        rate = 0.0 if all(r.numel() == 0 for r in rows.values()) else rate
        return TypedRanking(rows, rate, rate, "in-sample")
    halves = {t: s.halves.cpu() for t, s in scores.items()}  # type: ignore[union-attr]
    if not weights:
        raise ValueError("weights must hold at least one candidate")
    rates = []
    for w in weights:
        both = []
        for a, b in ((0, 1), (1, 0)):
            fit = {t: blended_scores(halves[t][a], priors[t], w) for t in scores}
            held = {t: halves[t][b] for t in scores}
            both.append(_bytes_hit_rate(held, allocate_typed(fit, priors, row_bytes, budget_bytes, num_shards),
                                        row_bytes))  # fmt: skip
        defined = [r for r in both if not math.isnan(r)]
        rates.append(sum(defined) / len(defined) if defined else math.nan)
    if all(math.isnan(r) for r in rates):
        index = next((i for i, w in enumerate(weights) if math.isinf(w)), len(weights) - 1)
    else:
        index = max(range(len(rates)), key=lambda i: (-math.inf if math.isnan(rates[i]) else rates[i], -i))
    choice = PriorWeightChoice(tuple(float(w) for w in weights), tuple(rates), index)
    counts = {t: halves[t].sum(0) for t in scores}
    final = {t: blended_scores(counts[t], priors[t], choice.final_weight) for t in scores}
    rows = allocate_typed(final, priors, row_bytes, budget_bytes, num_shards)
    if all(r.numel() == 0 for r in rows.values()):
        return TypedRanking(rows, 0.0, 0.0, "held-out", choice)
    return TypedRanking(rows, choice.heldout_hit_rate, _bytes_hit_rate(counts, rows, row_bytes), "held-out", choice)
