"""Presampling for ``cache_ranking: presample``: the DataModule's sampler run over its training batches.

Each node's appearances in the ``n_id`` of a number of sampled batches estimate its access probability (seeds
included), per node type. The counts come in two halves (even and odd presampling batches), which
:func:`~lightning_zerocopy.cache.cached_rows.rank_rows` uses to choose the degree prior's weight and to estimate the
hit rate out of sample. Deterministic: the batches come from a seeded plan of their own (:data:`PRESAMPLE_STREAM`),
every rank samples a fixed subset of them and the counts are summed, so the result does not depend on the number
of ranks.

This is the one part of the cache's decision that needs the DataModule (its plan, handles and sampler options: what
it samples is :mod:`lightning_zerocopy.data.presampling`), so it lives here, above ``data/``; the ranking itself is
:mod:`lightning_zerocopy.cache.cached_rows`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Mapping

import torch

from lightning_zerocopy.data.plan import BatchPlan, PlanItem
from lightning_zerocopy.data.presampling import PRESAMPLE_STREAM, presampling

if TYPE_CHECKING:
    from lightning_zerocopy.data.datamodule import ZeroCopyDataModule

__all__ = ["PRESAMPLE_STREAM", "presample_counts", "presample_halves", "presample_items"]


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


def presample_counts(
    sample: Callable[[PlanItem], Mapping[str, torch.Tensor]],
    plan: BatchPlan,
    num_batches: int,
    num_rows: Mapping[str, int],
    rank: int = 0,
    world_size: int = 1,
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """This rank's presampling counts in two halves, per node type of ``num_rows`` (int64 ``[2, num_rows[type]]``,
    CPU): row ``h`` counts each node's appearances in the ``n_id`` that ``sample(item)`` returns for its type, over
    the batches ``k`` of :func:`presample_items` with ``k % 2 == h`` (a type absent from a batch counts nothing there).

    Which half a batch lands in depends on ``k`` only, so the sum over the ranks of a ``world_size`` job is the
    same for every ``world_size``.
    """
    counts = {t: torch.zeros(2, int(n), dtype=torch.int64) for t, n in num_rows.items()}
    ks = range(rank, num_batches, world_size)
    pairs: Iterable[tuple[int, PlanItem]] = zip(ks, presample_items(plan, num_batches, rank, world_size))
    if progress:
        from tqdm.auto import tqdm

        pairs = tqdm(pairs, total=len(ks), desc="presampling hot rows", unit="batch", leave=False)
    for k, item in pairs:
        for node_type, n_id in sample(item).items():
            if node_type in counts:
                ids = n_id.to(device="cpu", dtype=torch.int64)
                counts[node_type][k % 2] += torch.bincount(ids, minlength=counts[node_type].shape[1])
    return counts


def presample_halves(
    datamodule: "ZeroCopyDataModule", num_batches: int, rank: int, world_size: int, num_rows: Mapping[str, int]
) -> dict[str, torch.Tensor]:
    """This rank's part of the presampling counts of each type of ``num_rows`` (the featured types), in halves
    (:func:`presample_counts`): the DataModule's sampler on CPU over the seeded one-rank plan of its training batches
    (:func:`~lightning_zerocopy.data.presampling.presampling`).

    Raises:
        TypeError: a training plan presampling cannot draw from (the message names it).
    """
    with presampling(datamodule) as (plan, sample):
        return presample_counts(sample, plan, num_batches, num_rows, rank, world_size, progress=rank == 0)
