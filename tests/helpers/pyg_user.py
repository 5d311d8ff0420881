"""What a PyG user brings to the command: small graphs saved with ``torch.save`` (a ``Data`` with masks, an
ogbn-mag-shaped ``HeteroData`` with every type featured and every type a message destination, as
``T.ToUndirected(merge=False)`` leaves ogbn-mag), written as a user writes them, a DataModule without
``metadata`` and a module without ``in_channels``."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.nn import SAGEConv

from lightning_zerocopy.data.datamodule import ZeroCopyHeteroDataModule

MAG_NODES = {"paper": 120, "author": 90, "institution": 12}
MAG_CLASSES = 4


def _masks(count: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    perm = torch.randperm(count, generator=generator)
    masks = {}
    for name, part in (("train", perm[: count * 6 // 10]), ("val", perm[count * 6 // 10 : count * 8 // 10]),
                       ("test", perm[count * 8 // 10 :])):  # fmt: skip
        mask = torch.zeros(count, dtype=torch.bool)
        mask[part] = True
        masks[f"{name}_mask"] = mask
    return masks


def saved_data(path: Path, num_nodes: int = 80, seed: int = 0) -> Path:
    """A homogeneous ``Data`` (8 features, 3 classes, masks) saved to ``path``."""
    g = torch.Generator().manual_seed(seed)
    data = Data(x=torch.randn(num_nodes, 8, generator=g), y=torch.randint(0, 3, (num_nodes,), generator=g),
                edge_index=torch.randint(0, num_nodes, (2, num_nodes * 5), generator=g), **_masks(num_nodes, g))  # fmt: skip
    torch.save(data, path)
    return path


def mag_like(seed: int = 0) -> HeteroData:
    """Papers (labelled, split by masks), authors and institutions, each with 8 features; every relation with its
    reverse."""
    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    for node_type, count in MAG_NODES.items():
        data[node_type].x = torch.randn(count, 8, generator=g)
    data["paper"].y = torch.randint(0, MAG_CLASSES, (MAG_NODES["paper"],), generator=g)
    for name, mask in _masks(MAG_NODES["paper"], g).items():
        data["paper"][name] = mask

    def edges(src: str, dst: str, count: int) -> torch.Tensor:
        return torch.stack([torch.randint(0, MAG_NODES[src], (count,), generator=g),
                            torch.randint(0, MAG_NODES[dst], (count,), generator=g)])  # fmt: skip

    data["paper", "cites", "paper"].edge_index = edges("paper", "paper", 500)
    writes = edges("author", "paper", 300)
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    affiliated = edges("author", "institution", 90)
    data["author", "affiliated_with", "institution"].edge_index = affiliated
    data["institution", "rev_affiliated_with", "author"].edge_index = affiliated.flip(0)
    return data


def saved_mag_like(path: Path, seed: int = 0) -> Path:
    """:func:`mag_like` saved to ``path`` with ``torch.save``."""
    torch.save(mag_like(seed), path)
    return path


class DataModuleWithoutMetadata(ZeroCopyHeteroDataModule):
    """A heterogeneous DataModule that, as a user's own may, has no ``metadata``: the recipe gives the model its
    ``metadata`` (YAML lists)."""

    @property
    def metadata(self):  # type: ignore[override]
        raise AttributeError("no metadata here")


class LazyInputSAGE(pl.LightningModule):
    """A homogeneous module that takes ``out_channels`` but not ``in_channels`` (lazy input width, as PyG allows)."""

    def __init__(self, out_channels: int, hidden_channels: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.conv1 = SAGEConv(-1, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, out_channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    def training_step(self, batch, batch_idx):  # noqa: ANN001
        out = self(batch.x, batch.edge_index)[: batch.batch_size]
        return torch.nn.functional.cross_entropy(out, batch.y[: batch.batch_size])

    def test_step(self, batch, batch_idx):  # noqa: ANN001
        out = self(batch.x, batch.edge_index)[: batch.batch_size]
        self.log("test_acc", (out.argmax(-1) == batch.y[: batch.batch_size]).float().mean(), batch_size=batch.batch_size)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.Adam(self.parameters(), lr=0.01)
