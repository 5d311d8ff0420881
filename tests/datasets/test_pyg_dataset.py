"""PyGNodeDataset wraps a PyG Data object with split masks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from lightning_zerocopy.datasets import PyGNodeDataset


def _data() -> Data:
    gen = torch.Generator().manual_seed(0)
    n = 30
    mask = torch.zeros(n, dtype=torch.bool)
    train, val, test = mask.clone(), mask.clone(), mask.clone()
    train[:20], val[20:25], test[25:] = True, True, True
    return Data(
        x=torch.randn(n, 4, generator=gen),
        y=torch.randint(0, 3, (n,), generator=gen),
        edge_index=torch.randint(0, n, (2, 90), generator=gen),
        edge_attr=torch.randn(90, 2, generator=gen),
        train_mask=train,
        val_mask=val,
        test_mask=test,
    )


def test_masks_become_index_tensors() -> None:
    data = _data()
    ds = PyGNodeDataset(data)
    assert ds.num_features == 4 and ds.num_classes == int(data.y.max()) + 1
    nd = ds.load()
    assert torch.equal(nd.train_idx, torch.arange(20))
    assert torch.equal(nd.val_idx, torch.arange(20, 25))
    assert torch.equal(nd.test_idx, torch.arange(25, 30))
    assert torch.equal(nd.edge_attr, data.edge_attr)
    assert nd.x_file is None


def test_saved_file_and_missing_split(tmp_path: Path) -> None:
    data = _data()
    torch.save(data, tmp_path / "graph.pt")
    assert PyGNodeDataset(str(tmp_path / "graph.pt"), num_classes=7).num_classes == 7
    del data.test_mask
    with pytest.raises(ValueError, match="test_mask"):
        PyGNodeDataset(data).load()


def test_double_features_become_float32() -> None:
    data = _data()
    data.x = data.x.double()
    assert PyGNodeDataset(data).load().x.dtype == torch.float32
