"""Presampling for ``cache_ranking: presample``: the DataModule's sampler run over the training seeds.

Each node's appearances in the ``n_id`` of a number of sampled batches estimate its access probability (seeds
included). The counts come in two halves (even and odd presampling batches), which
:class:`~lightning_zerocopy.cache.ranking.CacheScores` uses to choose the degree prior's weight and to estimate the
hit rate out of sample. Deterministic: the batches come from a seeded plan of their own (:data:`PRESAMPLE_STREAM`),
every rank samples a fixed subset of them and the counts are summed, so the result does not depend on the number
of ranks.

This is the one part of the cache's decision that needs the DataModule (its plan, handles and sampler options), so
it lives here, above ``data/``; the ranking itself is :mod:`lightning_zerocopy.cache.ranking`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import torch

from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.data.plan import BatchPlan, PlanItem

if TYPE_CHECKING:
    from lightning_zerocopy.data.datamodule import ZeroCopyDataModule

__all__ = [
    "PRESAMPLE_STREAM",
    "presample_counts",
    "presample_halves",
    "presample_items",
    "presample_typed_counts",
    "presample_typed_halves",
]

#: Random stream of the presampling plan (the splits' plans use :data:`~lightning_zerocopy.data.plan.SPLIT_STREAMS`,
#: so presampling estimates the access distribution without replaying the exact training batches).
PRESAMPLE_STREAM = 17


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
    sample: Callable[[PlanItem], torch.Tensor],
    plan: BatchPlan,
    num_batches: int,
    num_nodes: int,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = False,
) -> torch.Tensor:
    """This rank's presampling counts in two halves (int64 ``[2, num_nodes]``, CPU): row ``h`` counts each node's
    appearances in the ``n_id`` of the batches ``k`` of :func:`presample_items` with ``k % 2 == h``.

    Which half a batch lands in depends on ``k`` only, so the sum over the ranks of a ``world_size`` job is the
    same for every ``world_size``.
    """
    counts = torch.zeros(2, num_nodes, dtype=torch.int64)
    ks = range(rank, num_batches, world_size)
    pairs: Iterable[tuple[int, PlanItem]] = zip(ks, presample_items(plan, num_batches, rank, world_size))
    if progress:
        from tqdm.auto import tqdm

        pairs = tqdm(pairs, total=len(ks), desc="presampling hot rows", unit="batch", leave=False)
    for k, item in pairs:
        n_id = sample(item).to(device="cpu", dtype=torch.int64)
        counts[k % 2] += torch.bincount(n_id, minlength=num_nodes)
    return counts


def presample_halves(
    datamodule: "ZeroCopyDataModule", num_batches: int, rank: int, world_size: int, num_nodes: int
) -> torch.Tensor:
    """This rank's part of the presampling counts, in halves (``[2, num_nodes]``, see :func:`presample_counts`):
    the DataModule's sampler on CPU over a seeded one-rank plan of its training seeds."""
    train = datamodule.plan("train")
    # batches of the training plan's seed nodes, as many per batch as its items start from (a link plan's items
    # start from both endpoints of their positive and negative edges)
    plan = BatchPlan(train.input_nodes, train.max_seed_nodes, shuffle=True, seed=datamodule.seed, stream=PRESAMPLE_STREAM)
    # the CPU placement draws bitwise the samples of the GPU placements (same plan item, same seed)
    builder = BatchBuilder(
        datamodule.handles, datamodule.fanouts, replace=datamodule.replace, num_threads=datamodule.num_threads
    ).open(datamodule.resources, place=False)

    def sample(item: PlanItem) -> torch.Tensor:
        return builder.sample_batch(item).sample.n_id

    try:
        return presample_counts(sample, plan, num_batches, num_nodes, rank, world_size, progress=rank == 0)
    finally:
        builder.close()


def presample_typed_counts(
    sample: Callable[[PlanItem], Mapping[str, torch.Tensor]],
    plan: BatchPlan,
    num_batches: int,
    num_nodes: Mapping[str, int],
    rank: int = 0,
    world_size: int = 1,
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """:func:`presample_counts` per node type: ``sample(item)`` returns a batch's ``n_id`` per type, and each type of
    ``num_nodes`` gets its int64 ``[2, num_nodes[type]]`` halves (a type absent from a batch counts nothing there)."""
    counts = {t: torch.zeros(2, int(n), dtype=torch.int64) for t, n in num_nodes.items()}
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


def presample_typed_halves(
    datamodule: "ZeroCopyDataModule", num_batches: int, rank: int, world_size: int, num_nodes: Mapping[str, int]
) -> dict[str, torch.Tensor]:
    """This rank's part of the presampling counts of each type of ``num_nodes`` (the featured types), in halves
    (:func:`presample_typed_counts`): a heterogeneous DataModule's sampler on CPU (its builder's ``sample_batch``)
    over a seeded one-rank plan of its training batches, on :data:`PRESAMPLE_STREAM`.

    A node DataModule's plan is over the input type's training seeds, as :func:`presample_halves` builds it. A link
    DataModule's (a :class:`~lightning_zerocopy.data.link_plan.LinkBatchPlan` over typed endpoints) is its training
    plan on one rank over :data:`PRESAMPLE_STREAM` (:meth:`~lightning_zerocopy.data.link_plan.LinkBatchPlan.one_rank_plan`):
    each item's seeds are its supervision edges' endpoints per endpoint type, negatives' included, which the builder
    samples from as a ``seed_dict``, as in training. (One table's link presampling draws batches of the split's
    distinct endpoints instead; typed endpoints have no one id space to draw them from.)

    Raises:
        TypeError: a training plan that is neither (the message names its type).
    """
    from lightning_zerocopy.data.batch import HeteroBatchBuilder
    from lightning_zerocopy.data.link_plan import LinkBatchPlan

    train = datamodule.plan("train")
    plan: Any
    if isinstance(train, LinkBatchPlan):
        plan = train.one_rank_plan(PRESAMPLE_STREAM)
    elif isinstance(train, BatchPlan):
        plan = BatchPlan(train.input_nodes, train.max_seed_nodes, shuffle=True, seed=datamodule.seed,
                         stream=PRESAMPLE_STREAM)  # fmt: skip
    else:
        raise TypeError(f"cache_ranking='presample' presamples node or link batch plans, not "
                        f"{type(datamodule).__name__}'s {type(train).__name__}; use cache_ranking='degree'")  # fmt: skip
    fanouts: Any = datamodule.fanouts  # per edge type on a heterogeneous DataModule
    builder = HeteroBatchBuilder(
        datamodule.handles, fanouts, replace=datamodule.replace, num_threads=datamodule.num_threads  # type: ignore[arg-type]
    ).open(datamodule.resources, place=False)  # type: ignore[arg-type]

    def sample(item: PlanItem) -> Mapping[str, torch.Tensor]:
        return builder.sample_batch(item).sample.n_id

    try:
        return presample_typed_counts(sample, plan, num_batches, num_nodes, rank, world_size, progress=rank == 0)
    finally:
        builder.close()
