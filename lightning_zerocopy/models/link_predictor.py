"""A reference link-prediction LightningModule on batches laid out as PyG's ``LinkNeighborLoader`` makes them.

The encoder embeds the batch's nodes from ``(x, edge_index)`` (a GraphSAGE by default; any module with that call
signature fits); the decoder scores node pairs from their embeddings. Training reads the batch's mode:

* binary batches (``edge_label_index``, ``edge_label``: positives then negatives) train with binary cross-entropy;
* triplet batches (``src_index``, ``dst_pos_index``, ``dst_neg_index``) train with BPR or a margin ranking loss.

Validation and test batches carry fixed negatives in the binary layout; :class:`LinkMetrics` turns their scores into
AUROC and MRR / Hits@K. Nothing here knows about lightning-zerocopy's DataModule: the same module trains on PyG's
``LinkNeighborLoader`` batches.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Sequence

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torch_geometric.nn.models import GraphSAGE as PyGGraphSAGE
from torchmetrics.classification import BinaryAUROC

from lightning_zerocopy.models.link_metrics import LinkMetrics
from lightning_zerocopy.models.seed_classifier import configure_from_factories
from lightning_zerocopy.models.trim import batch_hop_counts, can_trim
from lightning_zerocopy.options import RecipeError

__all__ = ["LinkPredictor", "batch_mode", "num_positives", "sigmoid_by_value"]

_LOSS_MODE = {"bce": "binary", "bpr": "triplet", "margin": "triplet"}
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


def batch_mode(batch: Any) -> str:
    """``"triplet"`` when the batch has ``src_index`` (PyG's triplet layout), else ``"binary"``."""
    return "triplet" if getattr(batch, "src_index", None) is not None else "binary"


def num_positives(batch: Any) -> int:
    """Positive supervision edges in a link batch: ``batch.batch_size`` (ours), else the length of ``input_id`` (PyG's
    ``LinkNeighborLoader`` batches have no ``batch_size``); read from shapes, never from device values."""
    size = getattr(batch, "batch_size", None)
    if isinstance(size, int):
        return size
    input_id = getattr(batch, "input_id", None)
    if input_id is not None:
        return int(input_id.numel())
    return int(batch.src_index.numel() if batch_mode(batch) == "triplet" else batch.edge_label_index.size(1))


def _configured_mode(neg_sampling: Any) -> Optional[str]:
    """The negative-sampling mode of a data module's ``neg_sampling`` (a name, a dict or PyG's ``NegativeSampling``)."""
    mode = neg_sampling.get("mode") if isinstance(neg_sampling, dict) else getattr(neg_sampling, "mode", neg_sampling)
    mode = getattr(mode, "value", mode)  # PyG's NegativeSamplingMode enum
    return str(mode) if mode is not None else None


class DotDecoder(nn.Module):
    """Score of a pair: the dot product of its two embeddings."""

    def forward(self, z_src: torch.Tensor, z_dst: torch.Tensor) -> torch.Tensor:
        return (z_src * z_dst).sum(dim=-1)


class MLPDecoder(nn.Module):
    """Score of a pair: an MLP on the element-wise product of its two embeddings (symmetric in the pair).

    Args:
        channels: embedding width.
        hidden_channels: width of the hidden layer.
        dropout: dropout before the output layer.
    """

    def __init__(self, channels: int, hidden_channels: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(channels, hidden_channels), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden_channels, 1)
        )

    def forward(self, z_src: torch.Tensor, z_dst: torch.Tensor) -> torch.Tensor:
        return self.mlp(z_src * z_dst).squeeze(-1)


class LinkPredictor(pl.LightningModule):
    """GraphSAGE encoder + dot/MLP decoder trained on link batches (see the module docstring).

    Labels: an edge is a positive when its ``edge_label`` is above 0 (PyG's convention: negatives are 0; labels the
    user gave are shifted by one when negatives are sampled), so the loss and the metrics read ``edge_label > 0``.

    Args:
        in_channels: input feature width (linked from ``data.num_features`` by the CLI).
        hidden_channels: width of the hidden layers and of the node embeddings.
        num_layers: number of ``SAGEConv`` layers (usually ``len(num_neighbors)``).
        dropout: dropout probability between encoder layers.
        aggr: neighbor aggregation of the encoder, e.g. ``"mean"``, ``"max"``, ``"sum"``.
        decoder: ``"dot"`` (dot product of the two embeddings) or ``"mlp"`` (an MLP on their element-wise product).
        loss: ``"bce"`` (binary batches, ``neg_sampling: binary``), ``"bpr"`` or ``"margin"`` (triplet batches,
            ``neg_sampling: triplet``).
        margin: the margin of ``loss: margin`` (``relu(margin - pos + neg)``).
        hits_k: the cut-offs ``K`` of the validation/test Hits@K.
        encoder: replaces the GraphSAGE: any module called as ``encoder(x, edge_index)`` returning node embeddings
            (``hidden_channels`` wide when ``decoder: mlp``).
        optimizer: builds the optimizer from the parameters (YAML: ``class_path: torch.optim.Adam``).
        lr_scheduler: optional, builds a scheduler from the optimizer; stepped every epoch.
        lr_scheduler_monitor: the metric a ``ReduceLROnPlateau`` scheduler watches.
        trim: run each encoder layer on the nodes and edges the remaining layers still need (PyG's
            ``trim_to_layer``, from the batch's ``num_sampled_nodes`` / ``num_sampled_edges``,
            :mod:`~lightning_zerocopy.models.trim`). Exact for link batches: every label edge's endpoints are seed
            rows, and the seed rows' embeddings are the untrimmed ones. ``False``: every layer on the whole sampled
            subgraph. Batches without per-hop counts run untrimmed either way.

    Raises:
        ValueError: an unknown ``decoder`` or ``loss``, ``hits_k`` with a cut-off below 1, or ``trim=True`` with an
            ``encoder`` that cannot trim.
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int = 128,
        num_layers: int = 2,
        dropout: float = 0.0,
        aggr: str = "mean",
        decoder: Literal["dot", "mlp"] = "dot",
        loss: Literal["bce", "bpr", "margin"] = "bce",
        margin: float = 1.0,
        hits_k: Sequence[int] = (10, 50),
        encoder: Optional[nn.Module] = None,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: Optional[LRSchedulerCallable] = None,
        lr_scheduler_monitor: str = "val_auroc",
        trim: bool = True,
    ) -> None:
        super().__init__()
        if decoder not in ("dot", "mlp"):
            raise ValueError(f"model.decoder must be 'dot' or 'mlp', got {decoder!r}")
        if loss not in _LOSS_MODE:
            raise ValueError(f"model.loss must be one of {sorted(_LOSS_MODE)}, got {loss!r}")
        self.save_hyperparameters(ignore=["encoder", "optimizer", "lr_scheduler"])
        self.encoder = encoder if encoder is not None else PyGGraphSAGE(
            in_channels, hidden_channels, num_layers, hidden_channels, dropout=dropout, aggr=aggr
        )  # fmt: skip
        if trim and encoder is not None and not can_trim(encoder):
            raise ValueError(
                f"model.trim=true needs an encoder with an int `num_layers` whose forward takes "
                f"`num_sampled_nodes_per_hop` and `num_sampled_edges_per_hop` (PyG's BasicGNN models do); "
                f"{type(encoder).__name__} does not: set model.trim to false"
            )
        self.trim = bool(trim)
        self.decoder = DotDecoder() if decoder == "dot" else MLPDecoder(hidden_channels, hidden_channels, dropout)
        self.loss_name = loss
        self.margin = float(margin)
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.lr_scheduler_monitor = lr_scheduler_monitor
        # training AUROC on the batches of logging steps only: its state grows with every batch it sees
        self.train_auroc = BinaryAUROC(validate_args=False, normalization=None)  # logits as they are (LinkMetrics)
        self.val_metrics = LinkMetrics("val", hits_k)
        self.test_metrics = LinkMetrics("test", hits_k)

    # ------------------------------------------------------------------------------------------ the model
    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Node embeddings of the batch."""
        return self.encoder(x, edge_index)

    def embed(self, batch: Any) -> torch.Tensor:
        """Embeddings of the batch's nodes (the rows its label-edge indices point into). Trimmed (``trim``): only
        the seed rows (the label edges' endpoints, first in the batch) are exact, and fewer rows may come back."""
        hops = batch_hop_counts(batch, self.encoder.num_layers) if self.trim else None
        if hops is None:
            return self(batch.x, batch.edge_index)
        return self.encoder(hops.x, hops.edge_index, num_sampled_nodes_per_hop=hops.nodes_per_hop,
                            num_sampled_edges_per_hop=hops.edges_per_hop)  # fmt: skip

    def score(self, z: torch.Tensor, edge_label_index: torch.Tensor) -> torch.Tensor:
        """Logits of the node pairs ``edge_label_index`` (local ids, ``[2, M]``)."""
        return self.decoder(z[edge_label_index[0]], z[edge_label_index[1]])

    def _binary_scores(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the batch's label edges and whether each is a positive."""
        if getattr(batch, "edge_label_index", None) is None:
            raise ValueError(
                "LinkPredictor needs link batches: this batch has neither edge_label_index (binary) nor src_index "
                "(triplet); use a link data module (ZeroCopyLinkDataModule or PyG's LinkNeighborLoader)"
            )
        scores = self.score(self.embed(batch), batch.edge_label_index)
        label = getattr(batch, "edge_label", None)
        positive = label > 0 if label is not None else torch.ones_like(scores, dtype=torch.bool)
        return scores, positive

    def _triplet_scores(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the positives ``[B]`` and of their negatives ``[B, amount]``."""
        z = self.embed(batch)
        src = z[batch.src_index]
        pos = self.decoder(src, z[batch.dst_pos_index])
        neg_index = batch.dst_neg_index.view(batch.src_index.numel(), -1)
        neg = self.decoder(src.unsqueeze(1).expand(-1, neg_index.size(1), -1), z[neg_index])
        return pos, neg

    # ------------------------------------------------------------------------------------------ the steps
    def _check_mode(self, mode: Optional[str], where: str) -> None:
        wanted = _LOSS_MODE[self.loss_name]
        if mode is not None and mode != wanted:
            raise RecipeError(
                f"model.loss={self.loss_name!r} trains on {wanted} batches, but {where} is {mode}: set "
                f"model.loss to {'bce' if mode == 'binary' else 'bpr or margin'}, or data.neg_sampling to {wanted!r}"
            )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._check_mode(batch_mode(batch), "the training batch's mode")
        if self.loss_name == "bce":
            scores, positive = self._binary_scores(batch)
            loss = F.binary_cross_entropy_with_logits(scores, positive.to(scores.dtype))
        else:
            pos, neg = self._triplet_scores(batch)
            diff = pos.unsqueeze(1) - neg
            loss = -F.logsigmoid(diff).mean() if self.loss_name == "bpr" else F.relu(self.margin - diff).mean()
            scores = torch.cat([pos, neg.flatten()])
            positive = torch.zeros_like(scores, dtype=torch.bool)
            positive[: pos.numel()] = True
        # Logged on logging steps only: a logged tensor is read back to the host, which stalls the step.
        log_every = self._trainer.log_every_n_steps if self._trainer is not None else 1
        if self.global_step % max(1, log_every) == 0:
            size = num_positives(batch)
            self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=False, batch_size=size)
            self.train_auroc.update(scores.detach(), positive.long())
            self.log("train_auroc", self.train_auroc, on_step=False, on_epoch=True, batch_size=size)
        return loss

    def _evaluate(self, batch: Any, metrics: LinkMetrics) -> None:
        scores, positive = self._binary_scores(batch)
        query = getattr(batch, "edge_label_query", None)
        metrics.update(scores, positive, query)
        metrics.log_to(self, grouped=query is not None, batch_size=num_positives(batch))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        """The predicted edges: ``edge_index`` (global node ids ``[2, M]``, from ``batch.n_id``), ``scores`` (the
        probability, sigmoid of the logit, bitwise the same for an edge in any batch: :func:`sigmoid_by_value`),
        ``logits``, and ``edge_label`` when the batch has labels."""
        scores, _ = self._binary_scores(batch)
        out = {"edge_index": batch.n_id[batch.edge_label_index], "scores": sigmoid_by_value(scores), "logits": scores}
        if getattr(batch, "edge_label", None) is not None:
            out["edge_label"] = batch.edge_label
        return out

    def setup(self, stage: str) -> None:
        """Checks ``loss`` against the data module's ``neg_sampling`` before the first batch."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if stage == "fit" and datamodule is not None and hasattr(datamodule, "neg_sampling"):
            self._check_mode(_configured_mode(datamodule.neg_sampling), "data.neg_sampling's mode")

    def configure_optimizers(self) -> Any:
        return configure_from_factories(self.parameters(), self.optimizer_factory, self.lr_scheduler_factory,
                                        self.lr_scheduler_monitor)  # fmt: skip

