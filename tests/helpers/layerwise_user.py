"""A user's LightningModules built on a PyG ``BasicGNN`` as PyG's examples write them, with no layer-wise methods of
their own (``tests/test_cli_layerwise.py`` predicts with :class:`UserSAGE` layer-wise from the command, unchanged;
``tests/data/test_layerwise*.py`` wrap any BasicGNN in :class:`UserGNN`)."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch_geometric.nn.models import GraphSAGE


class UserSAGE(pl.LightningModule):
    """PyG's GraphSAGE (``convs``, ``norms``, ``act``) with a BatchNorm per layer, trained on a batch's seed rows."""

    def __init__(self, in_channels: int = 8, num_classes: int = 3, hidden_channels: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.gnn = GraphSAGE(in_channels, hidden_channels, num_layers=2, out_channels=num_classes, norm="batch_norm")

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.gnn(x, edge_index)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        out = self(batch.x, batch.edge_index)[: batch.batch_size]
        return F.cross_entropy(out, batch.y[: batch.batch_size])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


class UserGNN(pl.LightningModule):
    """A user's module holding any PyG BasicGNN, without the contract's methods (found through its BasicGNN)."""

    def __init__(self, gnn: torch.nn.Module) -> None:
        super().__init__()
        self.gnn = gnn

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.gnn(x, edge_index)
