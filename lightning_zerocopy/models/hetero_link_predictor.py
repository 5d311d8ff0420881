"""Link prediction on one edge type of a heterogeneous graph (PyG hetero ``LinkNeighborLoader`` batches).

:class:`HeteroLinkPredictor` encodes every node type with a relational GraphSAGE (a ``HeteroConv`` of one
``SAGEConv`` per edge type, messages summed per destination type; featured types enter through a linear layer,
featureless ones are embedded from ``batch[type].n_id``) and scores a pair by the dot product of its source-type and
destination-type embeddings. It reads only PyG's field names: ``edge_label_index`` / ``edge_label`` on the supervised
edge type (binary, trained with BCE), or ``src_index`` on the source type and ``dst_pos_index`` / ``dst_neg_index`` on
the destination type (triplet, trained with BPR); validation and test log ``<stage>_auroc`` (and MRR / Hits@K,
:class:`~lightning_zerocopy.models.LinkMetrics`); ``predict_step`` returns ``score`` (the probability) and
``logits`` of ``edge_label_index``, what :class:`~lightning_zerocopy.callbacks.PredictionWriter` writes. The steps are
:class:`~lightning_zerocopy.models.LinkPredictor`'s (:class:`~lightning_zerocopy.models.link_scorer.LinkScorer`):
only where the fields stand and how nodes are embedded differ.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence, Union

import torch
from torch import nn
from torch_geometric.nn import HeteroConv, SAGEConv

from lightning_zerocopy.models.hetero_classifier import as_edge_type
from lightning_zerocopy.models.link_scorer import DotDecoder, LinkScorer, LinkStores, sigmoid_by_value

__all__ = ["HeteroLinkPredictor"]

EdgeType = tuple[str, str, str]


class HeteroLinkPredictor(LinkScorer):
    """A relational SAGE encoder and a dot-product decoder on the endpoint types of ``edge_type``; the steps (losses,
    logged figures, metrics) are :class:`~lightning_zerocopy.models.LinkPredictor`'s, the loss chosen by the batch:
    BCE on binary batches, BPR on triplet ones.

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
        self.decoder = DotDecoder()
        self.lr = float(lr)
        self._init_link_scoring(None, 1.0, hits_k, functools.partial(torch.optim.Adam, lr=self.lr), None, "val_auroc")

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

    def layerwise_layers(self) -> list[list[str]]:
        """Layer-wise embeddings (:mod:`~lightning_zerocopy.models.layerwise`): every layer outputs every node type
        (a type no relation reaches keeps its rows)."""
        types = [str(t) for t in self.hparams.metadata[0]]
        return [types for _ in self.convs]

    def layerwise_step(self, layer: int, block: Any) -> dict[str, torch.Tensor]:
        """Layer ``layer`` of :meth:`embed` for the rows of ``block``'s destination type (the store holding
        ``batch_size``); layer 0 first projects or embeds every type as :meth:`embed` does."""
        dst = next(t for t in block.node_types if "batch_size" in block[t])
        if layer == 0:
            x = {t: self.inputs[t](block[t].x) if t in self.inputs else self.embeddings[t](block[t].n_id)
                 for t in block.node_types}  # fmt: skip
        else:
            x = {t: block[t].x for t in block.node_types}
        out = self.convs[layer](x, block.edge_index_dict)
        if dst not in out:
            return {dst: x[dst]}
        return {dst: out[dst] if layer == len(self.convs) - 1 else out[dst].relu()}

    def _stores(self, batch: Any) -> LinkStores:
        return LinkStores(batch[self.edge_type], batch[self.edge_type[0]], batch[self.edge_type[2]])

    def _endpoint_embeddings(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.embed(batch)
        return z[self.edge_type[0]], z[self.edge_type[2]]

    def _not_a_link_batch(self) -> str:
        return (f"HeteroLinkPredictor needs link batches on {'__'.join(self.edge_type)}: this batch has no "
                "edge_label_index there (use ZeroCopyHeteroLinkDataModule)")  # fmt: skip

    def _prediction(self, batch: Any, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """``score`` (the probability, by value: :func:`~lightning_zerocopy.models.link_scorer.sigmoid_by_value`)
        and ``logits`` of the supervised edge type's ``edge_label_index``."""
        return {"score": sigmoid_by_value(logits), "logits": logits}
