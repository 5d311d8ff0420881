"""GraphSAGE node classifier (PyG ``SAGEConv`` layers) as a LightningModule."""

from __future__ import annotations

from typing import Optional

import torch
from pytorch_lightning.cli import LRSchedulerCallable, OptimizerCallable
from torch_geometric.nn.models import GraphSAGE as PyGGraphSAGE

from lightning_zerocopy.models.node_classifier import NodeClassifier

__all__ = ["GraphSAGE"]


class GraphSAGE(NodeClassifier):
    """GraphSAGE with mean aggregation, ReLU and dropout between layers.

    Args:
        in_channels: input feature width (linked from ``data.num_features`` by the CLI).
        out_channels: number of classes (linked from ``data.num_classes`` by the CLI).
        hidden_channels: width of the hidden layers.
        num_layers: number of ``SAGEConv`` layers (usually ``len(fanouts)``).
        dropout: dropout probability between layers.
        aggr: neighbor aggregation, e.g. ``"mean"``, ``"max"``, ``"sum"``.
        trim: run each layer on the nodes and edges the remaining layers still need (PyG's ``trim_to_layer``,
            from the batch's ``num_sampled_nodes`` / ``num_sampled_edges``); the seed logits are the untrimmed
            ones. ``False``: every layer on the whole sampled subgraph. Batches without per-hop counts (a full
            graph) run untrimmed either way.
        compile: ``torch.compile`` the GNN (``dynamic=True``); see the README for what it gives.
        optimizer: optimizer factory (YAML ``class_path``/``init_args``).
        lr_scheduler: optional LR scheduler factory.
        lr_scheduler_monitor: metric watched by a ``ReduceLROnPlateau`` scheduler.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        hidden_channels: int = 128,
        num_layers: int = 2,
        dropout: float = 0.5,
        aggr: str = "mean",
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: Optional[LRSchedulerCallable] = None,
        lr_scheduler_monitor: str = "val_acc",
        trim: bool = True,
        compile: bool = False,
    ) -> None:
        net = PyGGraphSAGE(in_channels, hidden_channels, num_layers, out_channels, dropout=dropout, aggr=aggr)
        super().__init__(net, out_channels, optimizer, lr_scheduler, lr_scheduler_monitor, trim=trim, compile=compile)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
