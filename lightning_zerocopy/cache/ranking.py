"""``cache_ranking``: which feature rows are hot, by node type.

* ``degree``: a node enters a sampled batch as a neighbor in proportion to how often it is some node's
  in-neighbor, so its score is its number of out-edges in the sampled graph: its appearances in the CSC ``indices``
  of every edge type whose source is its type (:func:`degree_scores_by_type`; one CSC for a graph without types).
* ``presample``: run the configured sampler over the training seeds for a number of batches and count how often
  each node appears in a batch's ``n_id`` (an estimate of its access probability, seeds included), in two halves
  (even and odd presampling batches; the sampling itself, which needs the DataModule, is
  :mod:`lightning_zerocopy.strategies.presample`).

A few presampled batches count most rows 0, 1 or 2 times, so the raw counts overfit: ranked by themselves they
serve far more of their own accesses than of the training batches'. The presample ranking therefore blends them
with the degree prior (:func:`blended_scores`: counts plus ``w`` times the degree scores scaled to the counts'
total) and picks ``w`` out of sample (:class:`PriorWeightChoice`: rank by one half, measure the hit rate of the
cached rows on the other half, both ways). Its expected hit rate is that held-out rate, not the in-sample one.

:class:`CacheScores` bundles one type's inputs of either ranking; :func:`top_rows` orders rows (hottest first, ties
by degree, then by the smaller id). Which rows a GPU's budget holds, over every featured type, is
:mod:`~lightning_zerocopy.cache.cached_rows`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional, Sequence

import torch


__all__ = [
    "CACHE_RANKINGS",
    "PRIOR_WEIGHTS",
    "CacheRanking",
    "CacheScores",
    "PriorWeightChoice",
    "blended_scores",
    "check_ranking",
    "degree_scores",
    "degree_scores_by_type",
    "expected_hit_rate",
    "top_rows",
]

CacheRanking = Literal["degree", "presample"]
CACHE_RANKINGS = ("degree", "presample")
_COUNT_CHUNK = 1 << 26  # edges per bincount chunk (bounds the int64 temporary)
#: Candidate weights of the degree prior (:func:`blended_scores`), tried in this order: ``0`` is the raw counts
#: (degree only breaks their ties), ``inf`` the degree ranking alone. Doubling steps: the held-out hit rate is flat
#: near its best, and each candidate costs two top-k selections over the table.
PRIOR_WEIGHTS: tuple[float, ...] = (0.0, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, math.inf)
_SELECT_SAMPLE = 1 << 16  # sampled scores that bracket a top-k threshold (see _kth_largest)


def check_ranking(ranking: str, key: str = "cache_ranking") -> str:
    """``ranking`` if it is known; else a ``ValueError`` naming ``key``."""
    if ranking not in CACHE_RANKINGS:
        raise ValueError(f"{key} must be one of {', '.join(map(repr, CACHE_RANKINGS))}, got {ranking!r}")
    return ranking


def degree_scores(indices: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Appearances of every node in the CSC neighbor array ``indices`` (int64 ``[num_nodes]``, on its device).

    Counts in chunks, so a graph with billions of edges needs no int64 copy of ``indices``.

    Raises:
        IndexError: an entry of ``indices`` outside ``[0, num_nodes)``.
    """
    counts = torch.zeros(num_nodes, dtype=torch.int64, device=indices.device)
    for start in range(0, indices.numel(), _COUNT_CHUNK):
        chunk = indices[start : start + _COUNT_CHUNK].long()
        if chunk.numel() and (int(chunk.min()) < 0 or int(chunk.max()) >= num_nodes):
            raise IndexError(f"the graph's indices hold ids outside [0, {num_nodes})")
        counts += torch.bincount(chunk, minlength=num_nodes)
    return counts


def degree_scores_by_type(
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


def expected_hit_rate(scores: torch.Tensor, rows: torch.Tensor) -> float:
    """Share of the counted accesses that a cache holding ``rows`` serves (``nan`` when nothing was counted).

    In-sample when ``rows`` were ranked by ``scores`` themselves; held-out when ``scores`` counted other batches.
    """
    total = float(scores.sum())  # integer counts sum exactly
    if total == 0:
        return float("nan")
    return float(scores[rows.to(scores.device)].sum()) / total


def blended_scores(counts: torch.Tensor, prior: torch.Tensor, weight: float) -> torch.Tensor:
    """``counts + weight * prior * counts.sum() / prior.sum()`` (float64, on ``counts``' device).

    The prior (degree scores) is scaled to the counts' total, so ``weight`` is the prior's share of evidence in
    units of the counted accesses: ``1`` adds as many pseudo-accesses, spread like the degrees, as were counted.
    ``weight = inf`` gives the prior alone (float64). A prior without any mass adds nothing.
    """
    prior = prior.to(counts.device)
    if math.isinf(weight):
        return prior.to(torch.float64)
    prior_total = float(prior.sum())
    scale = weight * float(counts.sum()) / prior_total if prior_total > 0 else 0.0
    # a multiply, then an add: each rounds once per element, so no fused multiply-add can make the result depend
    # on how a kernel splits the table (thread counts may differ between ranks)
    return counts.to(torch.float64) + prior.to(torch.float64) * scale


def _select(values: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k``-th largest of ``values`` (``1 <= k <= n``) by ``topk`` from the nearer end (``kthvalue`` takes
    quadratic time on sorted input, such as scores of a table renumbered by degree)."""
    n = values.numel()
    if k <= n - k + 1:
        return torch.topk(values, k, sorted=False).values.min()
    return torch.topk(values, n - k + 1, largest=False, sorted=False).values.max()


def _kth_largest(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k``-th largest of ``scores`` (``1 <= k <= n``), exactly. A strided sample (deterministic) brackets it
    first, so the exact selection runs on the few values in the bracket; an unlucky bracket falls back to all."""
    n = scores.numel()
    stride = n // _SELECT_SAMPLE
    if stride >= 8:
        sample = scores[::stride]
        m = sample.numel()
        at, margin = k * m / n, 4 * math.sqrt(m) + 2  # the sample rank of the k-th largest, and ~8 sigma around it
        hi = _select(sample, max(1, int(at - margin)))
        lo = _select(sample, min(m, int(at + margin) + 1))
        above = int((scores > hi).sum())
        between = scores[(scores >= lo) & (scores <= hi)]
        if above < k <= above + between.numel():
            return _select(between, k - above)
    return _select(scores, k)


def _top_set(scores: torch.Tensor, tiebreak: torch.Tensor, k: int) -> torch.Tensor:
    """The ids of :func:`top_rows` in no particular order (``0 <= k <= n``): the rows above the k-th largest score,
    then of those tied with it the ones with the largest ``tiebreak``, smaller ids first; no sort."""
    n = scores.numel()
    if k >= n:
        return torch.arange(n, device=scores.device)
    if k == 0:
        return torch.zeros(0, dtype=torch.int64, device=scores.device)
    threshold = _kth_largest(scores, k)
    above = (scores > threshold).nonzero().squeeze(1)
    tied = (scores == threshold).nonzero().squeeze(1)  # ascending ids
    need = k - above.numel()  # of the tied rows: the largest tiebreaks, the smaller ids among equal ones
    if need < tied.numel():
        ties = tiebreak[tied]
        cut = _kth_largest(ties, need)
        over = tied[ties > cut]
        tied = torch.cat([over, tied[ties == cut][: need - over.numel()]])
    return torch.cat([above, tied])


def top_rows(scores: torch.Tensor, tiebreak: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` first row ids in the order (``scores`` descending, ``tiebreak`` descending, id ascending), in that
    order (int64, on ``scores``' device): deterministic for given inputs on a given device.

    Selects by the k-th largest score first (linear time), so only the selected rows are sorted.
    """
    tiebreak = tiebreak.to(scores.device)
    ids = _top_set(scores, tiebreak, max(0, min(int(k), scores.numel()))).sort().values
    ids = ids[torch.sort(tiebreak[ids], descending=True, stable=True).indices]  # lexicographic: last key first
    return ids[torch.sort(scores[ids], descending=True, stable=True).indices]


@dataclass(frozen=True)
class PriorWeightChoice:
    """The prior weight the presample ranking picked (:func:`~lightning_zerocopy.cache.cached_rows.rank_rows`): for
    every candidate, rank by ``blended_scores(half_a, prior, w)``, cache what the budget holds and measure the share
    of ``half_b``'s reads those rows serve, and the other way round; the best mean wins.

    Attributes:
        weights: the candidate weights, in grid order.
        heldout_hit_rates: per candidate, the mean over both directions (rank by one half, count hits on the
            other) of the held-out hit rate; ``nan`` when neither half counted anything.
        index: the chosen candidate (highest held-out rate, ties to the smaller index).
    """

    weights: tuple[float, ...]
    heldout_hit_rates: tuple[float, ...]
    index: int

    @property
    def weight(self) -> float:
        """The chosen weight, as fitted on one half of the presampled batches."""
        return self.weights[self.index]

    @property
    def heldout_hit_rate(self) -> float:
        """The chosen weight's held-out hit rate: the expected hit rate of the presample ranking."""
        return self.heldout_hit_rates[self.index]

    @property
    def final_weight(self) -> float:
        """The weight for the counts of both halves: ``weight / 2``.

        A node's score is an estimate of its per-batch access probability shrunk toward the prior,
        ``counts + m * prior_per_batch``; the right prior strength ``m`` (in pseudo-batches) is a property of how
        well the degrees predict accesses, not of how many batches were counted. On one half the prior scaled to
        the counts' total carries ``weight * K/2`` pseudo-batches, so over all ``K`` batches the same strength is
        ``weight / 2`` on the prior scaled to the full total. (Keeping ``weight`` would double the prior's
        strength; on simulated access distributions ``weight / 2`` ranked at least as well at 16 to 256 batches.)
        """
        return self.weight / 2


@dataclass(frozen=True)
class CacheScores:
    """The inputs of one node type's cache ranking, identical on every rank.

    Attributes:
        prior: int64 ``[num_nodes]`` degree scores (:func:`degree_scores`), or any score to rank by alone.
        halves: int64 ``[2, num_nodes]`` presampled counts of the even and odd batches
            (:func:`~lightning_zerocopy.strategies.presample.presample_counts`, summed over the ranks); ``None`` for
            the degree ranking.
    """

    prior: torch.Tensor
    halves: Optional[torch.Tensor] = None

    @property
    def hot_rows(self) -> int:
        """Rows with any evidence of being read (a positive prior or a presampled count): every row a ranking of
        these scores may rank above the others, whatever the prior weight."""
        hot = self.prior > 0
        if self.halves is not None:
            hot |= self.halves.to(hot.device).sum(0) > 0
        return int(hot.sum())
