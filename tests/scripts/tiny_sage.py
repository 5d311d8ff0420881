"""The one-layer SAGE module of the CPU DDP scripts (``resume_ddp_script.py``, ``strategy_ddp_script.py``)."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv


class TinySAGE(pl.LightningModule):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = SAGEConv(in_channels, out_channels)

    def training_step(self, data, batch_idx):
        out = self.conv(data.x, data.edge_index)[: data.batch_size]
        return F.cross_entropy(out, data.y[: data.batch_size])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
