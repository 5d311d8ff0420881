"""What ``cache_ranking: presample`` samples of a DataModule: its training batches, on a random stream of their own,
sampled on CPU, and the rows each batch reads per node type (what the feature cache serves).

The batches come from a seeded one-rank plan (:data:`PRESAMPLE_STREAM`), so presampling estimates the access
distribution without replaying the exact training batches. A node DataModule's plan is over its training seeds (of
the input type, for a heterogeneous one); so is a homogeneous link DataModule's: batches of the split's distinct
endpoints. A heterogeneous link DataModule's (a :class:`~lightning_zerocopy.data.link_plan.LinkBatchPlan` over typed
endpoints) is its training plan on one rank over :data:`PRESAMPLE_STREAM`
(:meth:`~lightning_zerocopy.data.link_plan.LinkBatchPlan.one_rank_plan`): each item's seeds are its supervision
edges' endpoints per endpoint type, negatives' included, sampled from as in training (typed endpoints have no one id
space to draw batches from). The counting itself is :mod:`lightning_zerocopy.strategies.presample`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.data.handles import HeteroHostGraphHandles
from lightning_zerocopy.data.plan import BatchPlan, PlanItem
from lightning_zerocopy.graph.schema import NODE

__all__ = ["PRESAMPLE_STREAM", "presampling"]

#: Random stream of the presampling plan (the splits' plans use :data:`~lightning_zerocopy.data.plan.SPLIT_STREAMS`).
PRESAMPLE_STREAM = 17

#: a batch's sampled rows per node type (internal ids: rows of the host memory)
SampleRows = Callable[[PlanItem], dict[str, torch.Tensor]]


@contextmanager
def presampling(datamodule: Any) -> Iterator[tuple[Any, SampleRows]]:
    """``(plan, sample)``: the one-rank presampling plan of ``datamodule``'s training batches (any of the package's
    DataModules, set up) and a function that samples an item of it on CPU (the DataModule's fanouts and sampler
    options; the CPU placement draws bitwise the samples of the GPU placements) and returns its rows per node type.
    The builder is closed on exit.

    Raises:
        TypeError: a heterogeneous training plan that is neither a node nor a link batch plan.
    """
    train = datamodule.plan("train")
    handles, fanouts = datamodule.handles, datamodule.fanouts
    seeds_plan = lambda: BatchPlan(train.input_nodes, train.max_seed_nodes, shuffle=True,  # noqa: E731
                                   seed=datamodule.seed, stream=PRESAMPLE_STREAM)  # fmt: skip
    if isinstance(handles, HeteroHostGraphHandles):
        from lightning_zerocopy.data.hetero_batch import HeteroBatchBuilder
        from lightning_zerocopy.data.link_plan import LinkBatchPlan

        if isinstance(train, BatchPlan):
            plan = seeds_plan()
        elif isinstance(train, LinkBatchPlan):
            plan = train.one_rank_plan(PRESAMPLE_STREAM)
        else:
            owner = f"{type(datamodule).__name__}'s {type(train).__name__}"
            raise TypeError(f"cache_ranking='presample' presamples node or link batch plans, not {owner}; use "
                            "cache_ranking='degree'")  # fmt: skip
        typed = HeteroBatchBuilder(handles, fanouts, replace=datamodule.replace, num_threads=datamodule.num_threads)
        builder: Any = typed.open(datamodule.resources, place=False)
        sample: SampleRows = lambda item: dict(typed.sample_batch(item).sample.n_id)  # noqa: E731
    else:
        plan = seeds_plan()  # a link plan's: its training split's distinct endpoints
        one = BatchBuilder(handles, fanouts, replace=datamodule.replace, num_threads=datamodule.num_threads)
        builder = one.open(datamodule.resources, place=False)
        sample = lambda item: {NODE: one.sample_batch(item).sample.n_id}  # noqa: E731
    try:
        yield plan, sample
    finally:
        builder.close()
