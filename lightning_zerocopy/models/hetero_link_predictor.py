"""Link prediction on one edge type of a heterogeneous graph (PyG hetero ``LinkNeighborLoader`` batches).

:class:`HeteroLinkPredictor` encodes every node type with a relational GraphSAGE (a ``HeteroConv`` of one
``SAGEConv`` per edge type, messages summed per destination type; featured types enter through a linear layer,
featureless ones are embedded from ``batch[type].n_id``) and scores a pair by the dot product of its source-type and
destination-type embeddings. It reads only PyG's field names: ``edge_label_index`` / ``edge_label`` on the supervised
edge type (binary, trained with BCE), or ``src_index`` on the source type and ``dst_pos_index`` / ``dst_neg_index`` on
the destination type (triplet, trained with BPR); validation and test log ``<stage>_auroc`` (and MRR / Hits@K,
:class:`~lightning_zerocopy.models.LinkMetrics`); ``predict_step`` returns ``score`` (the probability) and
``logits`` of ``edge_label_index``, what :class:`~lightning_zerocopy.callbacks.PredictionWriter` writes.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, Union

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import HeteroConv, SAGEConv

from lightning_zerocopy.models.hetero_classifier import as_edge_type
from lightning_zerocopy.models.link_metrics import LinkMetrics
from lightning_zerocopy.models.link_predictor import sigmoid_by_value

__all__ = ["HeteroLinkPredictor"]

EdgeType = tuple[str, str, str]


class HeteroLinkPredictor(pl.LightningModule):
    """A relational SAGE encoder and a dot-product decoder on the endpoint types of ``edge_type``.

    Args:
        metadata: ``(node types, edge types)`` (the DataModule's ``metadata``).
        num_features: feature width per featured node type (``num_features``).
        num_nodes: nodes per node type (sizes the embeddings of featureless types).
        edge_type: the supervised edge type, ``(src, rel, dst)`` or ``"src__rel__dst"``.
        hidden_channels: embedding width.
        num_layers: message-passing layers (one per sampled hop is usual).
        lr: Adam's learning rate.
        hits_k: cut-offs of the Hits@K metrics.
    """

    def __init__(
        self,
        metadata: tuple[Sequence[str], Sequence[Sequence[str]]],
        num_features: Mapping[str, int],
        num_nodes: Mapping[str, int],
        edge_type: Union[str, Sequence[str]],
        hidden_channels: int = 32,
        num_layers: int = 2,
        lr: float = 0.01,
        hits_k: Sequence[int] = (10,),
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        node_types, edge_types = list(metadata[0]), [as_edge_type(et) for et in metadata[1]]
        self.edge_type: EdgeType = as_edge_type(edge_type)
        if self.edge_type not in edge_types:
            raise ValueError(f"edge_type {'__'.join(self.edge_type)} is not one of the edge types "
                             f"{['__'.join(et) for et in edge_types]}")  # fmt: skip
        h = int(hidden_channels)
        self.inputs = nn.ModuleDict({t: nn.Linear(int(num_features[t]), h) for t in node_types if t in num_features})
        self.embeddings = nn.ModuleDict(
            {t: nn.Embedding(int(num_nodes[t]), h) for t in node_types if t not in num_features}
        )
        self.convs = nn.ModuleList(
            HeteroConv({et: SAGEConv((h, h), h) for et in edge_types}, aggr="sum") for _ in range(int(num_layers))
        )
        self.lr = float(lr)
        self.val_metrics = LinkMetrics("val", hits_k)
        self.test_metrics = LinkMetrics("test", hits_k)

    # ---- the model ---------------------------------------------------------------------------------------

    def embed(self, batch: Any) -> dict[str, torch.Tensor]:
        """Embeddings of every sampled node, by node type."""
        x = {}
        for t in batch.node_types:
            store = batch[t]
            x[t] = self.inputs[t](store.x) if t in self.inputs else self.embeddings[t](store.n_id)
        for i, conv in enumerate(self.convs):
            out = conv(x, batch.edge_index_dict)
            last = i == len(self.convs) - 1
            x = {t: (out[t] if last else out[t].relu()) if t in out else x[t] for t in x}
        return x

    def _binary_scores(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the supervised edge type's label edges and whether each is a positive."""
        store = batch[self.edge_type]
        if "edge_label_index" not in store:
            raise ValueError(f"HeteroLinkPredictor needs link batches on {'__'.join(self.edge_type)}: this batch has "
                             "no edge_label_index there (use ZeroCopyHeteroLinkDataModule)")  # fmt: skip
        z = self.embed(batch)
        index = store.edge_label_index
        scores = (z[self.edge_type[0]][index[0]] * z[self.edge_type[2]][index[1]]).sum(-1)
        label = store.get("edge_label")
        positive = label > 0 if label is not None else torch.ones_like(scores, dtype=torch.bool)
        return scores, positive

    def _triplet_scores(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the positives ``[B]`` and of their negatives ``[B, amount]``."""
        z = self.embed(batch)
        src_store, dst_store = batch[self.edge_type[0]], batch[self.edge_type[2]]
        src = z[self.edge_type[0]][src_store.src_index]
        dst = z[self.edge_type[2]]
        pos = (src * dst[dst_store.dst_pos_index]).sum(-1)
        neg_index = dst_store.dst_neg_index.view(src.size(0), -1)
        neg = (src.unsqueeze(1) * dst[neg_index]).sum(-1)
        return pos, neg

    def _num_positives(self, batch: Any) -> int:
        store = batch[self.edge_type]
        size = store.get("batch_size")
        return int(size) if isinstance(size, int) else int(store.input_id.numel())

    # ---- the steps ---------------------------------------------------------------------------------------

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if "src_index" in batch[self.edge_type[0]]:
            pos, neg = self._triplet_scores(batch)
            loss = -F.logsigmoid(pos.unsqueeze(1) - neg).mean()  # BPR
        else:
            scores, positive = self._binary_scores(batch)
            loss = F.binary_cross_entropy_with_logits(scores, positive.to(scores.dtype))
        self.log("train_loss", loss, prog_bar=True, batch_size=self._num_positives(batch))
        return loss

    def _evaluate(self, batch: Any, metrics: LinkMetrics) -> None:
        scores, positive = self._binary_scores(batch)
        query = batch[self.edge_type].get("edge_label_query")
        metrics.update(scores, positive, query)
        metrics.log_to(self, grouped=query is not None, batch_size=self._num_positives(batch))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        """``score`` (the probability, by value: :func:`~lightning_zerocopy.models.link_predictor.sigmoid_by_value`)
        and ``logits`` of the supervised edge type's ``edge_label_index``."""
        scores, _ = self._binary_scores(batch)
        return {"score": sigmoid_by_value(scores), "logits": scores}

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.lr)
