"""The minimal interface the pipeline needs from a data loader: a picklable *batch source*.

A batch source is the DataModule's own batch plan and batch builder bound to one loader (stage, seed, rank,
world size). The pipeline never builds batches any other way: the trainer, an in-process producer thread and
a worker process all call the same two methods, so toggling the pipeline changes where a batch is made, never
what it contains.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol, runtime_checkable

import torch
from torch_geometric.data import Data


@runtime_checkable
class BatchSource(Protocol):
    """What the pipeline needs to produce the batches of one loader. Must be picklable (it is sent once to
    the worker process, which opens shared host memory by name or descriptor; no data in the pickle)."""

    def num_steps(self, epoch: int) -> int:
        """Number of batches in ``epoch``."""
        ...

    def plan(self, epoch: int, step: int) -> Any:
        """The plan item (seed ids, batch seed...) of batch ``step`` of ``epoch``: a pure function."""
        ...

    def build_batch(self, item: Any, out: Optional[Mapping[str, torch.Tensor]] = None) -> Data:
        """Build the batch of ``item``. ``out`` maps field names to preallocated buffers (capacity-sized, on
        the device the batch should end up on); a builder writes a field's rows into the front of its buffer
        when it fits and returns views of them. Fields it cannot place there are returned as fresh tensors;
        the pipeline copies those in (and grows the slot when a batch is larger than its capacity)."""
        ...


def capacity_hint(source: Any) -> Optional[dict[str, int]]:
    """The source's upper bound on batch sizes per axis, if it offers one (``capacity_hint()``)."""
    fn = getattr(source, "capacity_hint", None)
    if fn is None:
        return None
    hint = fn()
    return dict(hint) if hint is not None else None
