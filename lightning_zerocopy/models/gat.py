"""Graph attention network node classifier (PyG ``GATConv`` layers) as a LightningModule."""

from __future__ import annotations

from typing import Optional

import torch
from pytorch_lightning.cli import LRSchedulerCallable, OptimizerCallable
from torch_geometric.nn.models import GAT as PyGGAT

from lightning_zerocopy.models.node_classifier import NodeClassifier

__all__ = ["GAT"]


class GAT(NodeClassifier):
    """GAT with multi-head attention in the hidden layers (heads concatenated), ELU and dropout.

    Args:
        in_channels: input feature width (linked from ``data.num_features`` by the CLI).
        out_channels: number of classes (linked from ``data.num_classes`` by the CLI).
        hidden_channels: width of the hidden layers (split over ``heads``; must be divisible by it).
        num_layers: number of ``GATConv`` layers (usually ``len(fanouts)``).
        heads: attention heads per hidden layer.
        dropout: dropout probability between layers.
        v2: use ``GATv2Conv`` instead of ``GATConv``.
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
        heads: int = 4,
        dropout: float = 0.5,
        v2: bool = False,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: Optional[LRSchedulerCallable] = None,
        lr_scheduler_monitor: str = "val_acc",
        trim: bool = True,
        compile: bool = False,
    ) -> None:
        if hidden_channels % heads != 0:
            raise ValueError(f"model.hidden_channels ({hidden_channels}) must be divisible by model.heads ({heads})")
        net = PyGGAT(
            in_channels, hidden_channels, num_layers, out_channels, dropout=dropout, heads=heads, v2=v2, act="elu"
        )
        super().__init__(net, out_channels, optimizer, lr_scheduler, lr_scheduler_monitor, trim=trim, compile=compile)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
