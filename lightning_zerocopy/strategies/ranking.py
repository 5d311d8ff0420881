"""``cache_ranking``: which feature rows are hot.

* ``degree``: a node enters a sampled batch as a neighbor in proportion to how often it is some node's
  in-neighbor, so its score is its number of out-edges in the sampled graph (appearances in the CSC ``indices``).
* ``presample``: run the configured sampler over the training seeds for a number of batches and count how often
  each node appears in a batch's ``n_id`` (an estimate of its access probability, seeds included). Deterministic:
  the batches come from a seeded plan of their own, every rank samples a fixed subset of them and the counts are
  summed, so the result does not depend on the number of ranks.

Scores become an order with :func:`order_by_score` (hottest first, ties broken by the smaller id), and
:func:`expected_hit_rate` says what share of the counted accesses a set of cached rows would serve.
"""

from __future__ import annotations

from typing import Callable, Iterable, Literal, Optional

import torch

from lightning_zerocopy.data.plan import BatchPlan, PlanItem

__all__ = [
    "CACHE_RANKINGS",
    "CacheRanking",
    "check_ranking",
    "degree_scores",
    "expected_hit_rate",
    "order_by_score",
    "presample_items",
    "presample_scores",
]

CacheRanking = Literal["degree", "presample"]
CACHE_RANKINGS = ("degree", "presample")
_COUNT_CHUNK = 1 << 26  # edges per bincount chunk (bounds the int64 temporary)
#: Random stream of the presampling plan (the training batches use streams 0-3, so presampling estimates the
#: access distribution without replaying the exact training batches).
PRESAMPLE_STREAM = 17


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


def presample_items(plan: BatchPlan, num_batches: int, rank: int = 0, world_size: int = 1) -> Iterable[PlanItem]:
    """The presampling batches this rank samples: batch ``k`` of ``plan`` (a one-rank plan, epochs back to back)
    for ``k < num_batches`` with ``k % world_size == rank``."""
    if plan.world_size != 1:
        raise ValueError(f"the presampling plan must be a one-rank plan, got world_size={plan.world_size}")
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}")
    steps = len(plan)
    if steps == 0:
        return
    for k in range(rank, num_batches, world_size):
        yield plan.item(k // steps, k % steps)


def presample_scores(
    sample: Callable[[PlanItem], torch.Tensor],
    items: Iterable[PlanItem],
    num_nodes: int,
    progress: bool = False,
    total: Optional[int] = None,
) -> torch.Tensor:
    """Count how often each node appears in the ``n_id`` of the sampled ``items`` (int64 ``[num_nodes]``, CPU).

    Args:
        sample: plan item -> ``n_id`` of its sampled batch (row ids of the host feature table).
        items: the batches to sample (see :func:`presample_items`).
        num_nodes: rows of the feature table.
        progress: show a progress bar (tqdm).
        total: number of items, for the progress bar.
    """
    counts = torch.zeros(num_nodes, dtype=torch.int64)
    iterator = items
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(items, total=total, desc="presampling hot rows", unit="batch", leave=False)
    for item in iterator:
        n_id = sample(item).to(device="cpu", dtype=torch.int64)
        counts += torch.bincount(n_id, minlength=num_nodes)
    return counts


def order_by_score(scores: torch.Tensor) -> torch.Tensor:
    """Node ids by descending score, ties by ascending id (int64, on the CPU): identical on every rank."""
    return torch.sort(scores.cpu(), descending=True, stable=True).indices


def expected_hit_rate(scores: torch.Tensor, rows: torch.Tensor) -> float:
    """Share of the counted accesses that a cache holding ``rows`` serves (``nan`` when nothing was counted)."""
    scores = scores.cpu().to(torch.float64)
    total = float(scores.sum())
    if total == 0:
        return float("nan")
    return float(scores[rows.cpu()].sum()) / total
