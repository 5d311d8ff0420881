"""A tiny link dataset and a PyG-style link module for the link data path's tests (``tests/`` is on ``sys.path``).

``TinyLinkGraph`` is a planted-community graph: edges inside a community, node features the community's
one-hot code plus noise, so an encoder/decoder learns which pairs link. Val/test positives are held out of the
message-passing graph; their fixed negatives are cross-community pairs (grouped per positive, or one pool).
``PyGLinkModule`` is written the way PyG's link examples write one (``encode`` / ``decode`` on ``edge_label_index``)
and knows nothing about lightning-zerocopy.
"""

from __future__ import annotations

from typing import Optional

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import SAGEConv

from lightning_zerocopy.datasets.links import LinkData, LinkDataset, LinkSplit


class TinyLinkGraph(LinkDataset):
    """An in-memory link dataset (see the module docstring).

    Args:
        num_nodes: nodes of the graph.
        num_edges: distinct directed edges drawn (before the val/test hold-out).
        communities: planted communities.
        num_features: feature width (>= communities).
        neg_per_positive: fixed negatives per val/test positive; ``None`` stores one shared pool of the same size.
        with_labels: give the train split ``edge_label`` (0/1 with a 0 present, as a user's labels may be).
        seed: seed of everything.
    """

    def __init__(
        self,
        num_nodes: int = 400,
        num_edges: int = 3000,
        communities: int = 4,
        num_features: int = 8,
        neg_per_positive: Optional[int] = 3,
        with_labels: bool = False,
        seed: int = 0,
    ) -> None:
        self.num_nodes, self.num_edges_drawn, self.communities = num_nodes, num_edges, communities
        self._num_features = num_features
        self.neg_per_positive, self.with_labels, self.seed = neg_per_positive, with_labels, seed
        self.loads = 0

    @property
    def num_features(self) -> int:
        return self._num_features

    def load(self) -> LinkData:
        self.loads += 1
        g = torch.Generator().manual_seed(self.seed)
        n, c = self.num_nodes, self.communities
        community = torch.arange(n) % c
        src = torch.randint(0, n, (self.num_edges_drawn,), generator=g)
        # every edge stays inside its source's community, so cross-community pairs are never positives
        offset = torch.randint(0, n // c, (self.num_edges_drawn,), generator=g) * c
        dst = (offset + community[src]) % n
        keep = src != dst
        key = torch.unique(src[keep] * n + dst[keep])
        edges = torch.stack([key // n, key % n])
        perm = torch.randperm(edges.shape[1], generator=g)
        n_val = n_test = max(1, edges.shape[1] // 10)
        val, test, rest = perm[:n_val], perm[n_val : n_val + n_test], perm[n_val + n_test :]
        x = torch.randn(n, self.num_features, generator=g) * 0.3
        x[torch.arange(n), community] += 1.0
        splits = {"train": LinkSplit(edges[:, rest], edge_label=self._labels(rest.numel(), g))}
        for name, cols in (("val", val), ("test", test)):
            pos = edges[:, cols]
            k = self.neg_per_positive or 3
            neg_src = pos[0].repeat_interleave(k)
            # a node of another community: never a positive
            shift = torch.randint(1, c, (neg_src.numel(),), generator=g)
            neg_dst = (neg_src + shift + c * torch.randint(0, n // c - 1, (neg_src.numel(),), generator=g)) % n
            neg = torch.stack([neg_src, neg_dst])
            splits[name] = LinkSplit(pos, neg_edge_index=neg, neg_per_positive=self.neg_per_positive)
        return LinkData(edge_index=edges[:, rest].contiguous(), x=x, splits=splits)

    def _labels(self, count: int, g: torch.Generator) -> Optional[torch.Tensor]:
        if not self.with_labels:
            return None
        return (torch.rand(count, generator=g) < 0.8).to(torch.float32)  # 0/1: PyG shifts these to 1/2


class PyGLinkModule(pl.LightningModule):
    """A link module as PyG's examples write one: ``encode`` the batch's nodes, ``decode`` ``edge_label_index``."""

    def __init__(self, in_channels: int, hidden_channels: int = 32, lr: float = 0.01) -> None:
        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, hidden_channels)
        self.lr = lr
        self.val_scores: list[tuple[torch.Tensor, torch.Tensor]] = []

    def encode(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    def decode(self, z: torch.Tensor, edge_label_index: torch.Tensor) -> torch.Tensor:
        return (z[edge_label_index[0]] * z[edge_label_index[1]]).sum(-1)

    def forward(self, data: Data) -> torch.Tensor:
        return self.decode(self.encode(data.x, data.edge_index), data.edge_label_index)

    def training_step(self, data: Data, batch_idx: int) -> torch.Tensor:
        loss = F.binary_cross_entropy_with_logits(self(data), (data.edge_label > 0).float())
        self.log("train_loss", loss, batch_size=data.batch_size)
        return loss

    def validation_step(self, data: Data, batch_idx: int) -> None:
        self.val_scores.append((self(data).detach().cpu(), data.edge_label.detach().cpu()))

    def predict_step(self, data: Data, batch_idx: int) -> dict:
        return {"scores": self(data).sigmoid()}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (probability a positive outscores a negative; ties count half)."""
    pos, neg = scores[labels > 0], scores[labels == 0]
    greater = (pos.view(-1, 1) > neg.view(1, -1)).float().mean()
    ties = (pos.view(-1, 1) == neg.view(1, -1)).float().mean()
    return float(greater + 0.5 * ties)
