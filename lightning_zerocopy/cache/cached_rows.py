"""Which rows of every featured node type a GPU's cache budget holds: one budget, one ranking over the types.

The candidates are the rows of every featured type, ranked by *expected reads per byte* (a row's score over its
bytes: types differ in width and dtype), so a narrow type's hot rows go before a wide type's lukewarm ones; where
every type has the same width (a graph without types has one) that is the order of the scores themselves. Each
type's lookup (:func:`~lightning_zerocopy.cache.plan.lookup_bytes`, one entry per table row, held by every GPU that
opens the cache) is charged to the budget before the type's first row. The budget is per GPU: with ``k`` shards (a
clique of ``k`` GPUs) a type's cached rows are dealt round-robin, so the fullest GPU holds ``ceil(rows / k)`` of
them; :func:`allocate` takes the longest prefix of the ranked candidates whose bytes on that GPU stay within the
budget (a type whose lookup and first row do not fit is left out, and the walk goes on without it).

:func:`rank_rows` ranks by the degree priors alone, or blends each type's presampled counts with its prior
(:func:`~lightning_zerocopy.cache.ranking.blended_scores`) and picks the weight that serves the most held-out
*bytes* read (:class:`~lightning_zerocopy.cache.ranking.PriorWeightChoice`; for one width, the most held-out rows).

Pure CPU code over tensors and ints: identical on every rank that has the same inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from typing import Mapping, Optional, Sequence

import torch

from lightning_zerocopy.cache.plan import lookup_bytes
from lightning_zerocopy.cache.ranking import (
    PRIOR_WEIGHTS,
    CacheScores,
    PriorWeightChoice,
    _top_set,
    blended_scores,
    top_rows,
)

__all__ = ["RankedRows", "allocate", "bytes_per_gpu", "fits_a_row", "rank_rows"]


def bytes_per_gpu(rows: Mapping[str, int], row_bytes: Mapping[str, int], num_rows: Mapping[str, int],
                  num_shards: int) -> int:  # fmt: skip
    """Bytes the fullest GPU holds for ``rows[t]`` cached rows of each type over ``num_shards`` shards: each type's
    lookup (where it caches any row) plus ``ceil(rows / num_shards)`` of its rows."""
    total = 0
    for t, n in rows.items():
        if n > 0:
            total += lookup_bytes(int(num_rows[t]), num_shards) + -(-int(n) // num_shards) * int(row_bytes[t])
    return total


def fits_a_row(budget_bytes: int, num_rows: Mapping[str, int], row_bytes: Mapping[str, int],
               num_shards: int = 1) -> bool:  # fmt: skip
    """Whether a budget of ``budget_bytes`` per GPU holds some type's lookup and one of its rows (else it caches
    nothing; a clique's lookup is never smaller than one GPU's, so ``num_shards=1`` answers for every layout)."""
    return any(
        int(num_rows[t]) > 0 and 0 < int(b) <= budget_bytes - lookup_bytes(int(num_rows[t]), num_shards)
        for t, b in row_bytes.items()
    )


def allocate(
    scores: Mapping[str, torch.Tensor],
    tiebreak: Mapping[str, torch.Tensor],
    row_bytes: Mapping[str, int],
    budget_bytes: int,
    num_shards: int = 1,
    ordered: bool = True,
) -> dict[str, torch.Tensor]:
    """The rows of each type a cache of ``budget_bytes`` per GPU holds over ``num_shards`` shards.

    The candidates, every row of every type in ``scores``, are ordered by ``score / row_bytes`` descending, then
    ``tiebreak / row_bytes`` descending, then type (``scores``' order), then within a type as
    :func:`~lightning_zerocopy.cache.ranking.top_rows` orders it (id ascending). The longest prefix whose bytes on
    the fullest GPU (:func:`bytes_per_gpu`) fit the budget is taken; where the first candidate left out is a type's
    first row (its lookup does not fit), that type is dropped and the prefix is extended without it.

    Args:
        ordered: return each type's rows hottest first (``False``: in no particular order, which is cheaper for one
            type; what a hit rate needs).

    Returns:
        Per type of ``scores`` (every one, maybe empty): int64 CPU row ids.
    """
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"`num_shards` must be an int >= 1, got {num_shards!r}")
    out = {t: torch.zeros(0, dtype=torch.int64) for t in scores}
    types = [t for t in scores if int(row_bytes[t]) > 0 and scores[t].numel() > 0]
    if len(types) == 1:  # one type: its rows in order, as many as fit beside its lookup (no merge, no sort unasked)
        t = types[0]
        rows = scores[t].numel()
        room = int(budget_bytes) - lookup_bytes(rows, num_shards)
        count = min(rows, num_shards * (max(room, 0) // int(row_bytes[t])))
        out[t] = (top_rows if ordered else _top_set)(scores[t], tiebreak[t].to(scores[t].device), count).cpu()
        return out
    return _allocate_merged(scores, tiebreak, row_bytes, int(budget_bytes), num_shards, types, out)


def _allocate_merged(scores: Mapping[str, torch.Tensor], tiebreak: Mapping[str, torch.Tensor],
                     row_bytes: Mapping[str, int], budget: int, num_shards: int, types: list[str],
                     out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:  # fmt: skip
    """:func:`allocate` over the candidates of ``types`` merged by reads per byte (scores over row bytes divided by
    their greatest common divisor: exact for equal widths)."""
    if budget <= 0:
        return out
    unit = reduce(math.gcd, (int(row_bytes[t]) for t in types))
    while types:
        ids, values, ties, kinds, positions = [], [], [], [], []
        for i, t in enumerate(types):
            rb = int(row_bytes[t])
            cap = min(scores[t].numel(), num_shards * (budget // rb))  # more rows of t never fit the fullest GPU
            ranked = top_rows(scores[t], tiebreak[t], cap).cpu()
            ids.append(ranked)
            values.append(scores[t].cpu()[ranked].to(torch.float64) / (rb // unit))
            ties.append(tiebreak[t].cpu()[ranked].to(torch.float64) / (rb // unit))
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
            types = [t for i, t in enumerate(types) if i != int(kind[taken])]  # its lookup and first row do not fit
            continue
        counts = torch.bincount(kind[:taken], minlength=len(types)).tolist()
        for i, t in enumerate(types):
            out[t] = ids[i][: counts[i]].contiguous()
        break
    return out


@dataclass(frozen=True)
class RankedRows:
    """The rows of each type a cache holds, from :func:`rank_rows`.

    Attributes:
        rows: per featured type, int64 CPU row ids, hottest first (maybe empty).
        expected_hit_rate: the share of the bytes read that the rows are expected to serve (for one width, of the
            rows read). Presample: the chosen weight's held-out rate (a ranking fitted on half the batches judged
            on the other half: if anything slightly below what the ranking of all batches reaches). Degree: the
            share of the degree scores (times row bytes) they hold. ``nan`` without any evidence, 0 without rows.
        in_sample_hit_rate: the same share over the counts the ranking was built from (presample: optimistic).
        basis: ``"held-out"``, ``"in-sample"`` or (every table cached, by the decision) ``"whole"``: what
            ``expected_hit_rate`` is.
        choice: the prior weight choice (presample only).
    """

    rows: dict[str, torch.Tensor]
    expected_hit_rate: float
    in_sample_hit_rate: float
    basis: str
    choice: Optional[PriorWeightChoice] = None


def _hit_rate(reads: Mapping[str, torch.Tensor], rows: Mapping[str, torch.Tensor], weight: Mapping[str, int]) -> float:
    """Share of what ``reads`` counts (per type: reads per row times the type's ``weight``, its row bytes over the
    widths' common divisor) that ``rows`` serve; ``nan`` when nothing was read."""
    total = sum(float(reads[t].sum()) * weight[t] for t in reads)
    if total == 0:
        return math.nan
    served = sum(float(reads[t][rows[t]].sum()) * weight[t] for t in reads if rows[t].numel())
    return served / total


def rank_rows(
    scores: Mapping[str, CacheScores],
    row_bytes: Mapping[str, int],
    budget_bytes: int,
    num_shards: int = 1,
    weights: Sequence[float] = PRIOR_WEIGHTS,
) -> RankedRows:
    """The rows of each featured type to cache under ``budget_bytes`` per GPU over ``num_shards`` shards.

    Degree (every ``halves`` is ``None``): :func:`allocate` over the priors. Presample (every type has ``halves``):
    for each candidate weight, rank by ``blended_scores(half_a, prior, w)`` per type, allocate, and measure the
    share of ``half_b``'s bytes read that the rows serve, and the other way round; the best mean wins (ties to the
    smaller index; without any counts, the degree ranking), and the final ranking blends both halves with
    :attr:`~lightning_zerocopy.cache.ranking.PriorWeightChoice.final_weight`. Ties go to the larger prior, then the
    smaller id. A budget that holds no type's lookup and first row caches nothing (rates 0, no choice).

    Raises:
        ValueError: some types with presampled counts and others without, or no candidate weight.
    """
    presampled = {s.halves is not None for s in scores.values()}
    if len(presampled) > 1:
        raise ValueError("rank_rows: give presampled halves for every type or for none")
    if not weights:
        raise ValueError("weights must hold at least one candidate")
    basis = "held-out" if True in presampled else "in-sample"
    num_rows = {t: s.prior.numel() for t, s in scores.items()}
    if not fits_a_row(int(budget_bytes), num_rows, row_bytes, num_shards):
        return RankedRows({t: torch.zeros(0, dtype=torch.int64) for t in scores}, 0.0, 0.0, basis)
    unit = reduce(math.gcd, (int(row_bytes[t]) for t in scores), 0) or 1
    weight = {t: int(row_bytes[t]) // unit for t in scores}
    priors = {t: s.prior.cpu() for t, s in scores.items()}
    if basis == "in-sample":
        rows = allocate(priors, priors, row_bytes, budget_bytes, num_shards)
        rate = _hit_rate(priors, rows, weight)
        return RankedRows(rows, rate, rate, basis)
    halves = {t: s.halves.cpu() for t, s in scores.items()}  # type: ignore[union-attr]
    rates = []
    for w in weights:
        both = []
        for a, b in ((0, 1), (1, 0)):
            fit = {t: blended_scores(halves[t][a], priors[t], w) for t in scores}
            rows = allocate(fit, priors, row_bytes, budget_bytes, num_shards, ordered=False)
            both.append(_hit_rate({t: halves[t][b] for t in scores}, rows, weight))
        defined = [r for r in both if not math.isnan(r)]
        rates.append(sum(defined) / len(defined) if defined else math.nan)
    if all(math.isnan(r) for r in rates):
        index = next((i for i, w in enumerate(weights) if math.isinf(w)), len(weights) - 1)
    else:
        index = max(range(len(rates)), key=lambda i: (-math.inf if math.isnan(rates[i]) else rates[i], -i))
    choice = PriorWeightChoice(tuple(float(w) for w in weights), tuple(rates), index)
    counts = {t: halves[t][0] + halves[t][1] for t in scores}
    final = {t: blended_scores(counts[t], priors[t], choice.final_weight) for t in scores}
    rows = allocate(final, priors, row_bytes, budget_bytes, num_shards)
    return RankedRows(rows, choice.heldout_hit_rate, _hit_rate(counts, rows, weight), basis, choice)
