"""The heterogeneous contract (HeteroNodeData's checks, edge type strings) and the shared cache layout."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from lightning_zerocopy.datasets import DatasetFileError, InputDataError
from lightning_zerocopy.datasets.base import ArrayCache
from lightning_zerocopy.datasets.hetero import HeteroNodeData, Metadata, edge_type_str, first_out_of_range, parse_edge_type
from lightning_zerocopy.datasets.hetero_cache import (
    check_type_name,
    coalesce_undirected,
    hetero_data_from_cache,
    hetero_meta,
    to_undirected_types,
    write_edge_index,
    write_labels_and_splits,
)
from lightning_zerocopy.datasets.synthetic import write_rows_chunked

WRITES = ("author", "writes", "paper")
CITES = ("paper", "cites", "paper")


def _data(**changes) -> HeteroNodeData:
    fields = dict(
        num_nodes={"paper": 4, "author": 3},
        edge_index={WRITES: torch.tensor([[0, 2], [1, 3]]), CITES: torch.tensor([[0, 1], [1, 2]])},
        x={"paper": torch.zeros(4, 2)},
        input_type="paper",
        y=torch.tensor([0, 1, 0, -1]),
        train_idx=torch.tensor([0, 1]),
        val_idx=torch.tensor([2]),
        test_idx=torch.tensor([3]),
    )
    fields.update(changes)
    return HeteroNodeData(**fields)


def test_valid_data_and_accessors() -> None:
    data = _data()
    assert data.node_types == ["paper", "author"] and data.edge_types == [WRITES, CITES]
    assert data.num_features("paper") == 2 and data.num_features("author") is None
    assert data.split("val").tolist() == [2]
    data.check_ids()
    with pytest.raises(ValueError, match="unknown split"):
        data.split("valid")


def test_unknown_node_type_in_an_edge_type() -> None:
    edges = {("venue", "hosts", "paper"): torch.tensor([[0], [1]])}
    with pytest.raises(InputDataError, match=r"edge type venue__hosts__paper names the node type 'venue', which has no"):
        _data(edge_index=edges)
    with pytest.raises(InputDataError, match="input type 'venue' is not a node type"):
        _data(input_type="venue")
    with pytest.raises(InputDataError, match="features are given for 'venue'"):
        _data(x={"venue": torch.zeros(1, 1)})


def test_ids_out_of_range_for_their_type() -> None:
    # 3 is a paper id but not an author id: the check is per type
    data = _data(edge_index={WRITES: torch.tensor([[0, 3], [1, 3]])})
    with pytest.raises(InputDataError) as info:
        data.check_ids()
    assert str(info.value) == ("edge_index of author__writes__paper holds the 'author' id 3 at [0, 1], but 'author' "
                               "has 3 nodes (ids 0 to 2)")  # fmt: skip
    assert first_out_of_range(torch.tensor([0, 1, 5, -1]), 4) == (2, 5)
    assert first_out_of_range(torch.tensor([0, 3]), 4) is None


def test_feature_rows_and_shapes() -> None:
    with pytest.raises(InputDataError, match=r"x of node type 'paper' has shape \(5, 2\), but the type has 4 nodes"):
        _data(x={"paper": torch.zeros(5, 2)})
    with pytest.raises(InputDataError, match=r"edge_index of paper__cites__paper must have shape \[2, num_edges\]"):
        _data(edge_index={CITES: torch.zeros(3, 2, dtype=torch.long)})
    with pytest.raises(InputDataError, match="must be an int64 tensor"):
        _data(edge_index={CITES: torch.zeros(2, 2)})
    with pytest.raises(InputDataError, match=r"y of the input type 'paper' must have shape \[4\]"):
        _data(y=torch.zeros(3, dtype=torch.long))
    with pytest.raises(InputDataError, match="train_idx must be a 1-D int64 tensor"):
        _data(train_idx=torch.tensor([0.0]))


def test_edge_type_strings() -> None:
    assert edge_type_str(WRITES) == "author__writes__paper"
    assert parse_edge_type("author__writes__paper") == WRITES
    assert parse_edge_type(edge_type_str(("a", "rev_b", "c"))) == ("a", "rev_b", "c")
    for bad in ("paper__cites", "a__b__c__d", "a____c", "paper"):
        with pytest.raises(ValueError, match="is not an edge type"):
            parse_edge_type(bad)


def test_type_names_must_make_file_names() -> None:
    assert check_type_name("field_of_study", "node type") == "field_of_study"
    for bad in ("a/b", "a__b", "", "_a", "a b"):
        with pytest.raises(ValueError, match="cannot be stored"):
            check_type_name(bad, "node type")


def test_to_undirected_types_matches_pyg() -> None:
    from torch_geometric.data import HeteroData
    from torch_geometric.transforms import ToUndirected

    g = torch.Generator().manual_seed(1)
    edges = {
        WRITES: torch.stack([torch.randint(0, 3, (9,), generator=g), torch.randint(0, 4, (9,), generator=g)]),
        CITES: torch.randint(0, 4, (2, 12), generator=g),
    }
    ours = to_undirected_types(edges, {"paper": 4, "author": 3})
    reference = HeteroData()
    for edge_type, index in edges.items():
        reference[edge_type].edge_index = index
    reference = ToUndirected()(reference)
    assert list(ours) == reference.edge_types == [WRITES, CITES, ("paper", "rev_writes", "author")]
    for edge_type in reference.edge_types:
        assert torch.equal(ours[edge_type], reference[edge_type].edge_index), edge_type
    assert coalesce_undirected(torch.tensor([[1, 1, 0], [0, 0, 2]]), 3).tolist() == [[0, 0, 1, 2], [1, 2, 0, 0]]


def _write_cache(out: Path) -> None:
    data = _data()
    for edge_type, index in data.edge_index.items():
        write_edge_index(out, edge_type, index.t().contiguous().t())  # a strided view is written correctly too
    write_rows_chunked(out / "x.paper.npy", 4, 2, "float32", lambda a, b: torch.arange(a, b).float()[:, None].repeat(1, 2), "x")
    write_labels_and_splits(out, data.y, {"train_idx": data.train_idx, "val_idx": data.val_idx, "test_idx": data.test_idx})


def test_cache_round_trip(tmp_path: Path) -> None:
    cache = ArrayCache(tmp_path / "c")
    cache.build(lambda out: (_write_cache(out), hetero_meta(
        {"paper": 4, "author": 3}, [WRITES, CITES], "paper", {"paper": 2}, 2, builder="test"))[1])  # fmt: skip
    meta = json.loads((cache.path / "meta.json").read_text())
    assert meta["node_types"] == ["paper", "author"] and meta["edge_types"] == ["author__writes__paper", "paper__cites__paper"]
    assert meta["builder"] == "test" and meta["num_classes"] == 2
    assert sorted(p.name for p in cache.path.iterdir()) == [
        "edge_index.author__writes__paper.npy", "edge_index.paper__cites__paper.npy", "meta.json", "test_idx.npy",
        "train_idx.npy", "val_idx.npy", "x.paper.npy", "y.npy",
    ]  # fmt: skip
    data = hetero_data_from_cache(cache)
    expected = _data()
    assert data.num_nodes == expected.num_nodes and data.edge_types == expected.edge_types
    for edge_type in expected.edge_types:
        assert torch.equal(data.edge_index[edge_type], expected.edge_index[edge_type])
    assert data.x["paper"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert data.x_files == {"paper": str(cache.path / "x.paper.npy")}
    assert torch.equal(data.y, expected.y) and torch.equal(data.val_idx, expected.val_idx)


def test_damaged_cache_names_the_file(tmp_path: Path) -> None:
    cache = ArrayCache(tmp_path / "c")
    cache.build(lambda out: (_write_cache(out), hetero_meta(
        {"paper": 4, "author": 3}, [WRITES, CITES], "paper", {"paper": 2}, 2))[1])  # fmt: skip
    (cache.path / "edge_index.paper__cites__paper.npy").unlink()
    with pytest.raises(DatasetFileError, match=r"edge_index.paper__cites__paper.npy: is missing.*delete that directory"):
        hetero_data_from_cache(cache)
    (cache.path / "meta.json").write_text(json.dumps({"node_types": ["paper"]}))
    with pytest.raises(DatasetFileError, match="meta.json: is not a heterogeneous dataset's metadata"):
        hetero_data_from_cache(cache)


def test_metadata_in_a_modules_hyperparameters_loads_with_weights_only(tmp_path: Path) -> None:
    """A module built with ``metadata=dm.metadata`` saves a :class:`Metadata`; Lightning resumes with
    ``torch.load(weights_only=True)``, which refused it (``Unsupported global: GLOBAL tuple``) when it pickled as a call
    of ``tuple``."""
    metadata = Metadata(["paper", "author"], [WRITES, CITES])
    path = tmp_path / "hparams.ckpt"
    torch.save({"hyper_parameters": {"metadata": metadata}}, path)
    loaded = torch.load(path, weights_only=True)["hyper_parameters"]["metadata"]
    assert loaded == metadata and loaded() == (["paper", "author"], [WRITES, CITES])
    assert pickle.loads(pickle.dumps(metadata)) == metadata
