"""``SeedAccuracy``: the share of labeled seed nodes predicted right, counted on the device with no host sync.

torchmetrics' ``MulticlassAccuracy(ignore_index=-1)`` drops the unlabeled rows with a boolean mask (a
``nonzero``, which reads a count back from the GPU) and, with ``validate_args``, checks the labels on the host:
each ``update`` synchronizes. This metric counts with masks multiplied in instead, so its ``update`` only queues
kernels; ``compute`` (at an epoch's end, or when a training loop hands its figures to the logger) reads the sums.
Under DDP torchmetrics sums the counts over ranks (``dist_reduce_fx="sum"``), so the epoch figure is exact.
"""

from __future__ import annotations

from typing import Optional

import torch
from torchmetrics import Metric

__all__ = ["SeedAccuracy"]


class SeedAccuracy(Metric):
    """Micro accuracy over labeled rows (``target != ignore_index``), and the loss summed over them.

    States (int64 counts and a float64 sum, exact): ``correct``, ``labeled`` and ``loss_sum`` (each step's mean
    loss times its labeled rows, when :meth:`update` gets ``loss``), so the mean loss over any run of steps is
    a difference of ``loss_sum`` over a difference of ``labeled``.

    Args:
        ignore_index: the label of rows that count nowhere (unlabeled nodes).
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    correct: torch.Tensor
    labeled: torch.Tensor
    loss_sum: torch.Tensor

    def __init__(self, ignore_index: int = -1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ignore_index = int(ignore_index)
        self.add_state("correct", torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("labeled", torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("loss_sum", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, target: torch.Tensor, loss: Optional[torch.Tensor] = None) -> None:
        """Count a batch: ``logits`` ``[rows, classes]``, ``target`` ``[rows]``; ``loss`` the batch's mean loss
        over its labeled rows (``F.cross_entropy(..., ignore_index=...)``), NaN when it has none."""
        if logits.dim() != 2 or target.dim() != 1 or logits.shape[0] != target.shape[0]:
            raise ValueError(
                f"SeedAccuracy.update takes logits [rows, classes] and target [rows]; got {tuple(logits.shape)} and "
                f"{tuple(target.shape)}"
            )
        labeled = target != self.ignore_index
        count = labeled.sum()
        self.correct += ((logits.argmax(dim=-1) == target) & labeled).sum()
        self.labeled += count
        if loss is not None:  # a batch without labeled rows has a NaN mean loss and adds nothing
            self.loss_sum += torch.where(count > 0, loss.detach().to(torch.float64) * count, 0.0)

    def compute(self) -> torch.Tensor:
        """``correct / labeled`` (NaN when nothing was labeled)."""
        return self.correct.to(torch.float64) / self.labeled.to(torch.float64)
