"""The reference link-prediction LightningModules, on batches laid out as PyG's ``LinkNeighborLoader`` makes them:
:class:`LinkPredictor` (untyped batches) and :class:`HeteroLinkPredictor` (one edge type of ``HeteroData`` batches).
Their steps (losses, logged figures, metrics, ``predict_step``) are
:class:`~lightning_zerocopy.models.link_scorer.LinkScorer`'s: only where the fields stand and how nodes are embedded
differ.

:class:`LinkPredictor`'s encoder embeds the batch's nodes from ``(x, edge_index)`` (a GraphSAGE by default; any module
with that call signature fits); the decoder scores node pairs from their embeddings. Training reads the batch's mode:

* binary batches (``edge_label_index``, ``edge_label``: positives then negatives) train with binary cross-entropy;
* triplet batches (``src_index``, ``dst_pos_index``, ``dst_neg_index``) train with BPR or a margin ranking loss.

Validation and test batches carry fixed negatives in the binary layout; :class:`LinkMetrics` turns their scores into
AUROC and MRR / Hits@K. Nothing here knows about lightning-zerocopy's DataModule: the same module trains on PyG's
``LinkNeighborLoader`` batches.

:class:`HeteroLinkPredictor` encodes every node type with a relational GraphSAGE (a ``HeteroConv`` of one
``SAGEConv`` per edge type, messages summed per destination type; featured types enter through a linear layer,
featureless ones are embedded from ``batch[type].n_id``) and scores a pair by the dot product of its source-type and
destination-type embeddings. It reads ``edge_label_index`` / ``edge_label`` on the supervised edge type (binary,
BCE), or ``src_index`` on the source type and ``dst_pos_index`` / ``dst_neg_index`` on the destination type (triplet,
BPR); ``predict_step`` returns ``score`` (the probability) and ``logits`` of ``edge_label_index``, what
:class:`~lightning_zerocopy.callbacks.PredictionWriter` writes.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, Mapping, Optional, Sequence, Union

import torch
from pytorch_lightning.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torch_geometric.nn import HeteroConv, SAGEConv
from torch_geometric.nn.models import GraphSAGE as PyGGraphSAGE

from lightning_zerocopy.models.link_scorer import (
    LOSS_MODE,
    DotDecoder,
    LinkScorer,
    LinkStores,
    batch_mode,
    num_positives,
    sigmoid_by_value,
)
from lightning_zerocopy.models.layerwise import LayerwiseByBasicGNN, block_destination
from lightning_zerocopy.models.relational_gnn import EdgeType, as_edge_type
from lightning_zerocopy.models.trim import batch_hop_counts, can_trim

__all__ = ["HeteroLinkPredictor", "LinkPredictor", "batch_mode", "num_positives", "sigmoid_by_value"]


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


class LinkPredictor(LayerwiseByBasicGNN, LinkScorer):
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

    layerwise_net_attribute = "encoder"

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
        if loss not in LOSS_MODE:
            raise ValueError(f"model.loss must be one of {sorted(LOSS_MODE)}, got {loss!r}")
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
        self._init_link_scoring(loss, margin, hits_k, optimizer, lr_scheduler, lr_scheduler_monitor)

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

    def _stores(self, batch: Any) -> LinkStores:
        return LinkStores(batch, batch, batch)

    def _endpoint_embeddings(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.embed(batch)
        return z, z

    def _not_a_link_batch(self) -> str:
        return ("LinkPredictor needs link batches: this batch has neither edge_label_index (binary) nor src_index "
                "(triplet); use a link data module (ZeroCopyLinkDataModule or PyG's LinkNeighborLoader)")  # fmt: skip

    def _prediction(self, batch: Any, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """The predicted edges: ``edge_index`` (global node ids ``[2, M]``, from ``batch.n_id``), ``scores`` (the
        probability, sigmoid of the logit, bitwise the same for an edge in any batch: :func:`sigmoid_by_value`),
        ``logits``, and ``edge_label`` when the batch has labels."""
        out = {"edge_index": batch.n_id[batch.edge_label_index], "scores": sigmoid_by_value(logits), "logits": logits}
        if getattr(batch, "edge_label", None) is not None:
            out["edge_label"] = batch.edge_label
        return out


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
        x = self._layer_inputs(batch)
        for i, conv in enumerate(self.convs):
            out = conv(x, batch.edge_index_dict)
            last = i == len(self.convs) - 1
            x = {t: (out[t] if last else out[t].relu()) if t in out else x[t] for t in x}
        return x

    def _layer_inputs(self, batch: Any) -> dict[str, torch.Tensor]:
        """The first layer's rows of every node type: its features projected, or its ``n_id`` embedded."""
        return {t: self.inputs[t](batch[t].x) if t in self.inputs else self.embeddings[t](batch[t].n_id)
                for t in batch.node_types}  # fmt: skip

    def layerwise_layers(self) -> list[list[str]]:
        """Layer-wise embeddings (:mod:`~lightning_zerocopy.models.layerwise`): every layer outputs every node type
        (a type no relation reaches keeps its rows)."""
        types = [str(t) for t in self.hparams.metadata[0]]
        return [types for _ in self.convs]

    def layerwise_step(self, layer: int, block: Any) -> dict[str, torch.Tensor]:
        """Layer ``layer`` of :meth:`embed` for the rows of ``block``'s destination type (the store holding
        ``batch_size``); layer 0 first projects or embeds every type as :meth:`embed` does."""
        dst = block_destination(block)
        x = self._layer_inputs(block) if layer == 0 else {t: block[t].x for t in block.node_types}
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
