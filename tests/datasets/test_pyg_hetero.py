"""PyGHeteroDataset wraps a PyG HeteroData; bad fields are one-line errors naming the type, field and value."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch_geometric.data import HeteroData

from lightning_zerocopy.datasets import DatasetFileError, InputDataError, PyGHeteroDataset

WRITES = ("author", "writes", "paper")
CITES = ("paper", "cites", "paper")


def _graph() -> HeteroData:
    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["paper"].x = torch.randn(10, 4, generator=g)
    data["paper"].y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, -1])
    data["paper"].train_mask = torch.arange(10) < 6
    data["paper"].val_mask = (torch.arange(10) >= 6) & (torch.arange(10) < 8)
    data["paper"].test_mask = torch.arange(10) >= 8
    data["author"].num_nodes = 7
    data["institution"].x = torch.randn(3, 2, generator=g, dtype=torch.float64)
    data[CITES].edge_index = torch.randint(0, 10, (2, 30), generator=g)
    data[WRITES].edge_index = torch.stack([torch.randint(0, 7, (20,), generator=g), torch.randint(0, 10, (20,), generator=g)])
    data["author", "affiliated_with", "institution"].edge_index = torch.tensor([[0, 6, 3], [2, 0, 1]])
    return data


def test_wraps_every_type() -> None:
    source = _graph()
    ds = PyGHeteroDataset(source)
    assert ds.input_type == "paper" and ds.num_classes == 3
    assert ds.num_nodes == {"paper": 10, "author": 7, "institution": 3}
    assert ds.num_features == {"paper": 4, "institution": 2}
    assert ds.metadata() == source.metadata()
    data = ds.load()
    assert data.edge_types == source.edge_types
    for edge_type in source.edge_types:
        assert torch.equal(data.edge_index[edge_type], source[edge_type].edge_index)
    assert data.x["institution"].dtype == torch.float32  # float64 converted
    assert torch.equal(data.x["paper"], source["paper"].x)
    assert data.train_idx.tolist() == [0, 1, 2, 3, 4, 5] and data.val_idx.tolist() == [6, 7]
    assert data.test_idx.tolist() == [8, 9] and data.y[9] == -1
    assert ds.split_source("train") == "data['paper'].train_mask"


def test_index_splits_float_ids_and_saved_file(tmp_path: Path) -> None:
    source = _graph()
    for split in ("train", "val", "test"):
        del source["paper"][f"{split}_mask"]
    source["paper"].train_idx = torch.tensor([0.0, 1.0, 2.0])
    source["paper"].val_idx = torch.tensor([3, 4])
    source["paper"].test_idx = torch.tensor([5])
    path = tmp_path / "g.pt"
    torch.save(source, path)
    ds = PyGHeteroDataset(str(path))
    data = ds.load()
    assert data.train_idx.tolist() == [0, 1, 2] and data.train_idx.dtype == torch.int64
    assert ds.split_source("val") == "data['paper'].val_idx"


def test_input_type_default_needs_exactly_one_labeled_type() -> None:
    source = _graph()
    source["author"].y = torch.zeros(7, dtype=torch.long)
    with pytest.raises(ValueError, match=r"set `input_type`.*2 \(paper, author\)"):
        PyGHeteroDataset(source)
    assert PyGHeteroDataset(source, input_type="paper").input_type == "paper"
    with pytest.raises(ValueError, match="input_type 'venue' is not a node type"):
        PyGHeteroDataset(source, input_type="venue")
    with pytest.raises(ValueError, match="'institution' has no `y`"):
        PyGHeteroDataset(source, input_type="institution")


def _load_error(data: HeteroData) -> str:
    with pytest.raises(InputDataError) as info:
        PyGHeteroDataset(data).load()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_id_out_of_range_for_its_type() -> None:
    source = _graph()
    source[WRITES].edge_index[0, 5] = 7  # a valid paper id, but there are 7 authors
    message = _load_error(source)
    assert message == ("data['author', 'writes', 'paper'].edge_index holds the 'author' id 7 at [0, 5] (a source), "
                       "but 'author' has 7 nodes (ids 0 to 6)")  # fmt: skip
    source = _graph()
    source[CITES].edge_index[1, 3] = -1
    assert "data['paper', 'cites', 'paper'].edge_index holds the 'paper' id -1 at [1, 3]" in _load_error(source)


def test_non_integer_edge_index() -> None:
    source = _graph()
    index = source[CITES].edge_index.double()
    index[1, 4] = 2.5
    source[CITES].edge_index = index
    message = _load_error(source)
    assert message.startswith("data['paper', 'cites', 'paper'].edge_index holds 2.5 at [1, 4], which is not a node id")


def test_feature_rows_against_num_nodes_and_missing_counts() -> None:
    source = _graph()
    source["paper"].num_nodes = 11
    with pytest.raises(InputDataError, match=r"data\['paper'\].x has 10 rows but data\['paper'\].num_nodes is 11"):
        PyGHeteroDataset(source)
    source = _graph()
    source["venue", "hosts", "paper"].edge_index = torch.tensor([[0], [1]])
    message = _load_error(source)
    assert "names the node type 'venue', which has no node store" in message
    source = _graph()
    del source["author"].num_nodes
    with pytest.raises(InputDataError, match=r"data\['author'\] has neither x nor num_nodes"):
        PyGHeteroDataset(source)


def test_mask_and_label_sizes() -> None:
    source = _graph()
    source["paper"].val_mask = torch.zeros(9, dtype=torch.bool)
    assert _load_error(source) == ("data['paper'].val_mask has 9 entries but 'paper' has 10 nodes: a mask holds one "
                                   "entry per node")  # fmt: skip
    source = _graph()
    source["paper"].y = torch.zeros(8, dtype=torch.long)
    assert "data['paper'].y has 8 entries but 'paper' has 10 nodes" in _load_error(source)
    source = _graph()
    source["paper"].y = source["paper"].y.float()
    source["paper"].y[2] = 0.5
    assert "data['paper'].y holds 0.5 at [2], which is not a class" in _load_error(source)


def test_split_idx_errors() -> None:
    source = _graph()
    del source["paper"].test_mask
    with pytest.raises(ValueError, match="neither `test_mask` nor `test_idx`"):
        PyGHeteroDataset(source).load()
    source["paper"].test_idx = torch.tensor([True, False])
    assert "data['paper'].test_idx is a boolean tensor" in _load_error(source)


def test_bad_inputs(tmp_path: Path) -> None:
    from torch_geometric.data import Data

    with pytest.raises(TypeError, match="PyGNodeDataset"):
        PyGHeteroDataset(Data(x=torch.zeros(2, 1)))
    with pytest.raises(FileNotFoundError, match="saved with torch.save"):
        PyGHeteroDataset(str(tmp_path / "missing.pt"))
    (tmp_path / "bad.pt").write_bytes(b"not a pickle")
    with pytest.raises(DatasetFileError, match=r"bad.pt: cannot be loaded with torch.load"):
        PyGHeteroDataset(str(tmp_path / "bad.pt"))
