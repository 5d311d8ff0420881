"""What a PyG user brings to the command: small graphs saved with ``torch.save`` (a ``Data`` with masks, an
ogbn-mag-shaped ``HeteroData`` with every type featured and every type a message destination, as
``T.ToUndirected(merge=False)`` leaves ogbn-mag), written as a user writes them."""

from __future__ import annotations

from pathlib import Path

import torch
from torch_geometric.data import Data, HeteroData

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
