"""What :class:`~lightning_zerocopy.models.LinkPredictor` and :class:`~lightning_zerocopy.models.HeteroLinkPredictor`
share: scoring node pairs from their endpoints' embeddings, the binary and triplet losses, the training figures logged
without synchronizing a step, validation/test AUROC and MRR / Hits@K, ``predict_step``'s scores, the optimizer factories.

Both read PyG's ``LinkNeighborLoader`` field names; only where they stand differs (:class:`LinkStores`: the batch, or
the supervised edge type's and its endpoint types' stores). A subclass builds its layers and ``decoder``, calls
:meth:`LinkScorer._init_link_scoring` and implements the four methods under "what differs".
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from typing import Any, Callable, NamedTuple, Optional, Sequence

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import BinaryAUROC

from lightning_zerocopy.models.link_metrics import LinkMetrics
from lightning_zerocopy.models.seed_classifier import configure_from_factories
from lightning_zerocopy.options import RecipeError

__all__ = ["DotDecoder", "LinkScorer", "LinkStores", "batch_mode", "num_positives", "sigmoid_by_value"]

#: the batches each loss trains on
LOSS_MODE = {"bce": "binary", "bpr": "triplet", "margin": "triplet"}
_BLOCK = 1024  # elements per sigmoid call: a multiple of every SIMD width, below torch's parallel grain size (32768)


def sigmoid_by_value(logits: torch.Tensor) -> torch.Tensor:
    """``torch.sigmoid(logits)``, where an element's result depends on its value only, not on its position.

    On the CPU torch computes an elementwise function with SIMD vectors, but the elements past the last whole vector
    (of the tensor, or of a thread's chunk) with scalar code, whose last bit can differ. A link score would then
    change with the batch its edge falls in (on 1 and 2 ranks, 3 of 13,015 scores differed by up to 6e-8). Here
    every element goes through the vector code: the logits are cut into blocks of 1,024, the last one padded, and
    each block is one call. Other devices compute every element alike already.
    """
    if logits.device.type != "cpu" or logits.numel() == 0:
        return torch.sigmoid(logits)
    flat = logits.reshape(-1)
    padded = flat.new_zeros(-(-flat.numel() // _BLOCK) * _BLOCK)
    padded[: flat.numel()] = flat
    out = torch.cat([torch.sigmoid(block) for block in padded.split(_BLOCK)])
    return out[: flat.numel()].view(logits.shape)


class LinkStores(NamedTuple):
    """Where a link batch keeps its fields (each the batch itself for a homogeneous batch).

    Attributes:
        label: ``edge_label_index``, ``edge_label``, ``edge_label_query``, ``batch_size``, ``input_id``.
        src: ``src_index`` (triplet batches).
        dst: ``dst_pos_index``, ``dst_neg_index`` (triplet batches).
    """

    label: Any
    src: Any
    dst: Any


def _mode(stores: LinkStores) -> str:
    return "triplet" if getattr(stores.src, "src_index", None) is not None else "binary"


def _positives(stores: LinkStores) -> int:
    size = getattr(stores.label, "batch_size", None)
    if isinstance(size, int):
        return size
    input_id = getattr(stores.label, "input_id", None)
    if input_id is not None:
        return int(input_id.numel())
    return int(stores.src.src_index.numel() if _mode(stores) == "triplet" else stores.label.edge_label_index.size(1))


def batch_mode(batch: Any) -> str:
    """``"triplet"`` when the batch has ``src_index`` (PyG's triplet layout), else ``"binary"``."""
    return _mode(LinkStores(batch, batch, batch))


def num_positives(batch: Any) -> int:
    """Positive supervision edges in a link batch: ``batch.batch_size`` (ours), else the length of ``input_id`` (PyG's
    ``LinkNeighborLoader`` batches have no ``batch_size``); read from shapes, never from device values."""
    return _positives(LinkStores(batch, batch, batch))


def _configured_mode(neg_sampling: Any) -> Optional[str]:
    """The negative-sampling mode of a data module's ``neg_sampling`` (a name, a dict or PyG's ``NegativeSampling``)."""
    mode = neg_sampling.get("mode") if isinstance(neg_sampling, dict) else getattr(neg_sampling, "mode", neg_sampling)
    mode = getattr(mode, "value", mode)  # PyG's NegativeSamplingMode enum
    return str(mode) if mode is not None else None


class DotDecoder(nn.Module):
    """Score of a pair: the dot product of its two embeddings."""

    def forward(self, z_src: torch.Tensor, z_dst: torch.Tensor) -> torch.Tensor:
        return (z_src * z_dst).sum(dim=-1)


class LinkScorer(pl.LightningModule, metaclass=ABCMeta):
    """Scores node pairs with ``self.decoder`` on their endpoints' embeddings; the steps of the module docstring.

    Labels: an edge is a positive when its ``edge_label`` is above 0 (PyG's convention: negatives are 0), so the loss
    and the metrics read ``edge_label > 0``. Training figures are logged on logging steps only (a logged tensor is read
    back to the host): ``train_loss`` on the step, ``train_auroc`` over the epoch's logging steps.
    """

    decoder: nn.Module

    def _init_link_scoring(self, loss: Optional[str], margin: float, hits_k: Sequence[int],
                           optimizer: Callable[..., Any], lr_scheduler: Optional[Callable[..., Any]],
                           lr_scheduler_monitor: str) -> None:  # fmt: skip
        """The loss (``None``: by the batch, BCE on binary batches and BPR on triplet ones), the metrics and the
        optimizer factories; called from the subclass's ``__init__``."""
        self.loss_name = loss
        self.margin = float(margin)
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.lr_scheduler_monitor = lr_scheduler_monitor
        # training AUROC on the batches of logging steps only: its state grows with every batch it sees
        self.train_auroc = BinaryAUROC(validate_args=False, normalization=None)  # logits as they are (LinkMetrics)
        self.val_metrics = LinkMetrics("val", hits_k)
        self.test_metrics = LinkMetrics("test", hits_k)

    # ------------------------------------------------------------------------------------------ what differs
    @abstractmethod
    def _stores(self, batch: Any) -> LinkStores:
        """Where ``batch`` keeps its link fields."""

    @abstractmethod
    def _endpoint_embeddings(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The embeddings the source ids index and those the destination ids index (the batch's local ids)."""

    @abstractmethod
    def _not_a_link_batch(self) -> str:
        """The error of a batch without ``edge_label_index``: what the module needs and which DataModule gives it."""

    @abstractmethod
    def _prediction(self, batch: Any, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """``predict_step``'s answer from the logits of the batch's ``edge_label_index``."""

    # ------------------------------------------------------------------------------------------ the scores
    def _binary_scores(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the batch's label edges and whether each is a positive."""
        label = self._stores(batch).label
        index = getattr(label, "edge_label_index", None)
        if index is None:
            raise ValueError(self._not_a_link_batch())
        z_src, z_dst = self._endpoint_embeddings(batch)
        scores = self.decoder(z_src[index[0]], z_dst[index[1]])
        edge_label = getattr(label, "edge_label", None)
        positive = edge_label > 0 if edge_label is not None else torch.ones_like(scores, dtype=torch.bool)
        return scores, positive

    def _triplet_scores(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the positives ``[B]`` and of their negatives ``[B, amount]``."""
        stores = self._stores(batch)
        z_src, z_dst = self._endpoint_embeddings(batch)
        src = z_src[stores.src.src_index]
        pos = self.decoder(src, z_dst[stores.dst.dst_pos_index])
        neg_index = stores.dst.dst_neg_index.view(src.size(0), -1)
        neg = self.decoder(src.unsqueeze(1).expand(-1, neg_index.size(1), -1), z_dst[neg_index])
        return pos, neg

    # ------------------------------------------------------------------------------------------ the steps
    def _check_mode(self, mode: Optional[str], where: str) -> None:
        if self.loss_name is None:
            return
        wanted = LOSS_MODE[self.loss_name]
        if mode is not None and mode != wanted:
            raise RecipeError(
                f"model.loss={self.loss_name!r} trains on {wanted} batches, but {where} is {mode}: set "
                f"model.loss to {'bce' if mode == 'binary' else 'bpr or margin'}, or data.neg_sampling to {wanted!r}"
            )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        stores = self._stores(batch)
        mode = _mode(stores)
        self._check_mode(mode, "the training batch's mode")
        if mode == "binary":
            scores, positive = self._binary_scores(batch)
            loss = F.binary_cross_entropy_with_logits(scores, positive.to(scores.dtype))
        else:
            pos, neg = self._triplet_scores(batch)
            diff = pos.unsqueeze(1) - neg
            loss = F.relu(self.margin - diff).mean() if self.loss_name == "margin" else -F.logsigmoid(diff).mean()
            scores = torch.cat([pos, neg.flatten()])
            positive = torch.zeros_like(scores, dtype=torch.bool)
            positive[: pos.numel()] = True
        # Logged on logging steps only: a logged tensor is read back to the host, which stalls the step.
        log_every = self._trainer.log_every_n_steps if self._trainer is not None else 1
        if self.global_step % max(1, log_every) == 0:
            size = _positives(stores)
            self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=False, batch_size=size)
            self.train_auroc.update(scores.detach(), positive.long())
            self.log("train_auroc", self.train_auroc, on_step=False, on_epoch=True, batch_size=size)
        return loss

    def _evaluate(self, batch: Any, metrics: LinkMetrics) -> None:
        scores, positive = self._binary_scores(batch)
        stores = self._stores(batch)
        query = getattr(stores.label, "edge_label_query", None)
        metrics.update(scores, positive, query)
        metrics.log_to(self, grouped=query is not None, batch_size=_positives(stores))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        """The scores of the batch's ``edge_label_index`` (:meth:`_prediction` says which fields)."""
        scores, _ = self._binary_scores(batch)
        return self._prediction(batch, scores)

    def setup(self, stage: str) -> None:
        """Checks ``loss`` against the data module's ``neg_sampling`` before the first batch."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if stage == "fit" and datamodule is not None and hasattr(datamodule, "neg_sampling"):
            self._check_mode(_configured_mode(datamodule.neg_sampling), "data.neg_sampling's mode")

    def configure_optimizers(self) -> Any:
        return configure_from_factories(self.parameters(), self.optimizer_factory, self.lr_scheduler_factory,
                                        self.lr_scheduler_monitor)  # fmt: skip
