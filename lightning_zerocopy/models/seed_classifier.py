"""What the node-classification LightningModules share (:class:`~lightning_zerocopy.models.NodeClassifier` on
homogeneous batches, :class:`~lightning_zerocopy.models.HeteroNodeClassifier` on ``HeteroData`` ones): cross-entropy
on the seed nodes, the training figures handed over without synchronizing a step, validation/test accuracy, the
seeds' ids and logits from ``predict_step``, and the optimizer and LR scheduler from their factories.

A subclass calls :meth:`SeedClassifier._init_seed_classification` in its ``__init__`` and implements
:meth:`SeedClassifier._seed_store` (where the batch keeps its seeds' ``batch_size``, ``y`` and ``n_id``: the batch, or
the input type's store) and :meth:`SeedClassifier._logits` (the logits of the batch's rows of that store).
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from typing import Any, Callable, Iterable, Optional

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from lightning_zerocopy.models.seed_accuracy import SeedAccuracy
from lightning_zerocopy.step_logging import is_log_step

__all__ = ["SeedClassifier", "configure_from_factories"]


def configure_from_factories(parameters: Iterable[torch.nn.Parameter], optimizer_factory: Callable[..., Any],
                             lr_scheduler_factory: Optional[Callable[..., Any]], monitor: str) -> Any:  # fmt: skip
    """``configure_optimizers``' answer: the optimizer of ``parameters``, with the scheduler of it (watching
    ``monitor``, for ``ReduceLROnPlateau``) where there is a scheduler factory."""
    optimizer = optimizer_factory(parameters)
    if lr_scheduler_factory is None:
        return optimizer
    scheduler = lr_scheduler_factory(optimizer)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": monitor}}


class SeedClassifier(pl.LightningModule, metaclass=ABCMeta):
    """Cross-entropy training on each batch's seed nodes; the logged figures of the module docstring.

    Training figures never synchronize a step with the GPU: loss and accuracy are summed on the device
    (:class:`~lightning_zerocopy.models.seed_accuracy.SeedAccuracy`) and read back only on the steps
    :func:`~lightning_zerocopy.step_logging.is_log_step` names: ``train_loss`` and ``train_acc_step`` are the means
    over the steps since the previous hand-over; ``train_acc_epoch`` is the epoch's exact accuracy. Unlabeled nodes
    (``y = -1``) are ignored by the loss and the metrics.
    """

    def _init_seed_classification(self, out_channels: int, optimizer: Callable[..., Any],
                                  lr_scheduler: Optional[Callable[..., Any]], lr_scheduler_monitor: str) -> None:  # fmt: skip
        """The factories and the metrics (``out_channels`` classes); called from the subclass's ``__init__``."""
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.lr_scheduler_monitor = lr_scheduler_monitor
        # unlabeled nodes (y = -1) are ignored by the loss and the metrics; the training one never syncs a step
        self.train_acc = SeedAccuracy(ignore_index=-1)
        self._handed_over = (0, 0, 0.0)  # train_acc's (correct, labeled, loss_sum) at the last hand-over
        self.val_acc = MulticlassAccuracy(out_channels, average="micro", ignore_index=-1)
        self.test_acc = MulticlassAccuracy(out_channels, average="micro", ignore_index=-1)

    @abstractmethod
    def _seed_store(self, batch: Any) -> Any:
        """Where ``batch`` keeps its seeds' ``batch_size``, labels ``y`` and global ids ``n_id`` (the seeds first)."""

    @abstractmethod
    def _logits(self, batch: Any) -> torch.Tensor:
        """Logits of the seed store's rows, the seeds first (trimmed: at least the seeds' rows)."""

    def _seed_outputs(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """The seeds' logits, their labels and how many seeds there are (the metrics' ``batch_size``)."""
        seeds = self._seed_store(batch)
        size = seeds.batch_size
        return self._logits(batch)[:size], seeds.y[:size], size

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        out, y, _ = self._seed_outputs(batch)
        loss = F.cross_entropy(out, y, ignore_index=-1)
        self.train_acc.update(out.detach(), y, loss.detach())  # queued on the device, not read back
        if is_log_step(self._trainer):
            self._hand_over_train_figures()
        return loss

    def on_train_epoch_start(self) -> None:
        self.train_acc.reset()
        self._handed_over = (0, 0, 0.0)

    def on_train_epoch_end(self) -> None:
        # the Metric itself: Lightning computes it once at the epoch's end (torchmetrics sums the counts over ranks)
        self.log("train_acc_epoch", self.train_acc, prog_bar=True)

    def _hand_over_train_figures(self) -> None:
        """Log the mean loss and accuracy of the steps since the last hand-over (one read of three numbers)."""
        acc = self.train_acc
        now = torch.stack([acc.correct.to(torch.float64), acc.labeled.to(torch.float64), acc.loss_sum]).tolist()
        correct, labeled, loss_sum = (a - b for a, b in zip(now, self._handed_over))
        self._handed_over = (now[0], now[1], now[2])
        if labeled <= 0:
            return
        # CPU tensors: Lightning turns progress-bar values into numbers after every step, which for a GPU tensor
        # (or a Python number, which it would copy to the GPU) is a synchronization
        self.log("train_loss", torch.tensor(loss_sum / labeled), prog_bar=True, on_step=True, on_epoch=False)
        self.log("train_acc_step", torch.tensor(correct / labeled), prog_bar=True, on_step=True, on_epoch=False)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        out, y, size = self._seed_outputs(batch)
        self.val_acc(out, y)
        self.log("val_loss", F.cross_entropy(out, y, ignore_index=-1), batch_size=size, sync_dist=True)
        self.log("val_acc", self.val_acc, prog_bar=True, batch_size=size)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        out, y, size = self._seed_outputs(batch)
        self.test_acc(out, y)
        self.log("test_acc", self.test_acc, prog_bar=True, batch_size=size)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        """The seed nodes' global ids and logits (what :class:`~lightning_zerocopy.callbacks.PredictionWriter`
        writes; the class is ``logits.argmax(-1)``)."""
        logits, _, size = self._seed_outputs(batch)
        return {"n_id": self._seed_store(batch).n_id[:size], "logits": logits}

    def configure_optimizers(self) -> Any:
        return configure_from_factories(self.parameters(), self.optimizer_factory, self.lr_scheduler_factory,
                                        self.lr_scheduler_monitor)  # fmt: skip
