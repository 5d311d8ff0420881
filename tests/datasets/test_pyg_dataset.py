"""PyGNodeDataset wraps a PyG Data object with split masks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from lightning_zerocopy.datasets import InputDataError, PyGNodeDataset


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


def test_split_sources_name_the_attribute() -> None:
    data = _data()
    data.val_idx = data.val_mask.nonzero().view(-1)
    del data.val_mask
    ds = PyGNodeDataset(data)
    assert [ds.split_source(s) for s in ("train", "val", "test")] == ["data.train_mask", "data.val_idx", "data.test_mask"]


def test_a_mask_of_another_length_than_the_nodes_is_an_error() -> None:
    data = _data()
    data.train_mask = torch.cat([data.train_mask, torch.ones(5, dtype=torch.bool)])
    with pytest.raises(InputDataError, match=r"data\.train_mask has 35 entries but data\.x has 30 rows"):
        PyGNodeDataset(data).load()


def test_a_missing_or_damaged_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'nope.pt'} not found")):
        PyGNodeDataset(str(tmp_path / "nope.pt"))
    path = tmp_path / "graph.pt"
    torch.save(_data(), path)
    path.write_bytes(path.read_bytes()[:100])  # truncated
    with pytest.raises(ValueError, match=re.escape(f"{path}: cannot be loaded with torch.load")):
        PyGNodeDataset(str(path))


def test_index_tensors_must_hold_integer_ids() -> None:
    data = _data()
    del data.train_mask
    data.train_idx = torch.tensor([0.0, 3.7, 5.0])
    with pytest.raises(ValueError, match=r"data\.train_idx holds 3\.7, which is not a node id"):
        PyGNodeDataset(data).load()
    data.train_idx = torch.tensor([0.0, 3.0, 5.0])  # integral floats are ids
    assert PyGNodeDataset(data).load().train_idx.tolist() == [0, 3, 5]
    data.train_idx = torch.ones(30, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"data\.train_idx is a boolean tensor: store it as data\.train_mask"):
        PyGNodeDataset(data).load()


def test_a_float_edge_index_must_hold_integers() -> None:
    data = _data()
    data.edge_index = data.edge_index.double()
    assert torch.equal(PyGNodeDataset(data).load().edge_index, _data().edge_index)  # integral floats are ids
    data.edge_index[1, 7] = 2.5  # was truncated to node 2
    with pytest.raises(ValueError, match=re.escape("data.edge_index holds 2.5, which is not a node id (at edge_index[1, 7])")):
        PyGNodeDataset(data).load()


def test_a_float_label_must_be_an_integer() -> None:
    data = _data()
    data.y = data.y.float()
    data.y[4] = 1.5
    with pytest.raises(ValueError, match=re.escape("data.y holds 1.5, which is not a class")):
        PyGNodeDataset(data).load()



@pytest.mark.parametrize("row, column, node", [(0, 33, 30), (1, 44, -1), (1, 5, 1000)])
def test_an_edge_to_no_node_names_edge_index_and_the_first_bad_id(row: int, column: int, node: int) -> None:
    """It failed in the graph's build (``IndexError: build_csc: src holds the id 2005``), naming no dataset field."""
    data = _data()
    data.edge_index[row, column] = node
    data.edge_index[row, 60] = node + 1 if node >= 0 else -5  # a later one is not the first
    where = f"edge_index[{row}, {column}] (a {('source', 'destination')[row]})"
    with pytest.raises(InputDataError, match=re.escape(f"data.edge_index holds node id {node} at {where}, but data.x "
                                                       "has 30 rows (node ids 0 to 29)")):  # fmt: skip
        PyGNodeDataset(data).load()


def test_features_for_fewer_nodes_than_the_labels_name_x() -> None:
    """With ``*_idx`` splits this blamed the edges (``build_csc ... num_nodes=25``)."""
    data = _data()
    data.x = data.x[:25]
    for split in ("train", "val", "test"):
        data[f"{split}_idx"] = data.pop(f"{split}_mask").nonzero().view(-1)
    with pytest.raises(InputDataError, match=re.escape("data.x has 25 rows but data.y has 30 entries")):
        PyGNodeDataset(data).load()
    data.y, data.num_nodes = data.y[:25], 30
    with pytest.raises(InputDataError, match=re.escape("data.x has 25 rows but data.num_nodes is 30")):
        PyGNodeDataset(data).load()


def test_a_field_error_of_a_saved_graph_names_the_file(tmp_path: Path) -> None:
    data = _data()
    data.edge_index = data.edge_index.float()
    data.edge_index[0, 3] = 2.5
    torch.save(data, tmp_path / "graph.pt")
    with pytest.raises(InputDataError, match=re.escape(f"{tmp_path / 'graph.pt'}: data.edge_index holds 2.5")):
        PyGNodeDataset(str(tmp_path / "graph.pt")).load()
