"""OGBHeteroNodeDataset reads a (tiny, fake) ogbn-mag folder in the ogb package's raw layout."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_zerocopy.datasets import DatasetFileError, OGBHeteroNodeDataset

COUNTS = {"author": 30, "field_of_study": 7, "institution": 4, "paper": 20}
RELATIONS = {
    ("author", "affiliated_with", "institution"): 25,
    ("author", "writes", "paper"): 60,
    ("paper", "cites", "paper"): 50,
    ("paper", "has_topic", "field_of_study"): 40,
}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="ascii") as f:
        f.write(text)


def _rows(values: np.ndarray) -> str:
    values = values.reshape(values.shape[0], -1)
    return "".join(",".join("nan" if np.isnan(v) else format(v, ".9g") for v in row.astype(float)) + "\n" for row in values)


@pytest.fixture
def mag(tmp_path: Path) -> dict:
    """A fake ogbn-mag: every relation, paper features and labels (two unlabeled), a time split."""
    rng = np.random.default_rng(0)
    root = tmp_path / "ogbn_mag"
    raw = root / "raw"
    _write(raw / "num-node-dict.csv.gz", ",".join(COUNTS) + "\n" + ",".join(str(v) for v in COUNTS.values()) + "\n")
    edges = {}
    for (src, rel, dst), count in RELATIONS.items():
        e = np.stack([rng.integers(0, COUNTS[src], count), rng.integers(0, COUNTS[dst], count)], axis=1)
        folder = raw / "relations" / f"{src}___{rel}___{dst}"
        _write(folder / "edge.csv.gz", _rows(e))
        _write(folder / "num-edge-list.csv.gz", f"{count}\n")
        _write(folder / "edge_reltype.csv.gz", "0\n" * count)
        edges[(src, rel, dst)] = e
    x = rng.standard_normal((COUNTS["paper"], 5)).astype(np.float32)
    _write(raw / "node-feat" / "paper" / "node-feat.csv.gz", _rows(x))
    y = rng.integers(0, 3, COUNTS["paper"]).astype(float)
    y[[4, 9]] = np.nan
    _write(raw / "node-label" / "paper" / "node-label.csv.gz", _rows(y))
    _write(raw / "node_year" / "paper" / "node_year.csv.gz", "2019\n" * COUNTS["paper"])  # ignored
    split = root / "split" / "time" / "paper"
    _write(split / "train.csv.gz", _rows(np.arange(0, 12)))
    _write(split / "valid.csv.gz", _rows(np.arange(12, 16)))
    _write(split / "test.csv.gz", _rows(np.arange(16, 20)))
    return dict(root=root, edges=edges, x=x, y=y, cache=tmp_path / "cache")


def test_reads_every_type_and_relation(mag: dict) -> None:
    ds = OGBHeteroNodeDataset(str(mag["root"]), cache_dir=str(mag["cache"]))
    assert ds.num_nodes == COUNTS and ds.input_type == "paper" and ds.num_features == {"paper": 5}
    assert ds.num_classes == int(np.nanmax(mag["y"])) + 1
    assert ds.edge_types == sorted(RELATIONS)  # no triplet list: the folders in name order
    data = ds.load()
    assert data.num_nodes == COUNTS and data.input_type == "paper"
    for edge_type, e in mag["edges"].items():
        assert torch.equal(data.edge_index[edge_type], torch.from_numpy(e.T)), edge_type
    assert torch.allclose(data.x["paper"], torch.from_numpy(mag["x"]))
    assert set(data.x) == {"paper"} and data.x_files["paper"].endswith("x.paper.npy")
    assert data.y[4] == -1 and data.y[9] == -1 and data.y[0] == int(mag["y"][0])
    assert data.train_idx.tolist() == list(range(12)) and data.test_idx.tolist() == list(range(16, 20))
    assert ds.split_source("val").endswith("split/time/paper/valid.csv.gz")
    data.check_ids()


def test_root_may_be_the_folder_above(mag: dict) -> None:
    ds = OGBHeteroNodeDataset(str(mag["root"].parent), name="ogbn-mag", cache_dir=str(mag["cache"]))
    assert ds.root == mag["root"].resolve()


def test_triplet_list_sets_the_order(mag: dict) -> None:
    order = [("paper", "cites", "paper"), ("author", "writes", "paper"),
             ("paper", "has_topic", "field_of_study"), ("author", "affiliated_with", "institution")]  # fmt: skip
    _write(mag["root"] / "raw" / "triplet-type-list.csv.gz", "".join(",".join(t) + "\n" for t in order))
    ds = OGBHeteroNodeDataset(str(mag["root"]), cache_dir=str(mag["cache"]))
    assert ds.edge_types == order and ds.load().edge_types == order


def test_reverse_edges_as_pyg_to_undirected(mag: dict) -> None:
    from torch_geometric.data import HeteroData
    from torch_geometric.transforms import ToUndirected

    ds = OGBHeteroNodeDataset(str(mag["root"]), add_reverse_edges=True, cache_dir=str(mag["cache"]))
    data = ds.load()
    assert data.edge_types == ds.edge_types
    assert ("paper", "rev_writes", "author") in data.edge_index
    assert ("paper", "rev_cites", "paper") not in data.edge_index
    reference = HeteroData()
    for edge_type, e in mag["edges"].items():
        reference[edge_type].edge_index = torch.from_numpy(e.T).contiguous()
    reference = ToUndirected()(reference)
    assert sorted(reference.edge_types) == sorted(data.edge_types)
    for edge_type in reference.edge_types:
        assert torch.equal(reference[edge_type].edge_index, data.edge_index[edge_type]), edge_type


def test_converted_once_then_memory_mapped(mag: dict) -> None:
    first = OGBHeteroNodeDataset(str(mag["root"]), cache_dir=str(mag["cache"]))
    first.prepare()
    entries = sorted(p.name for p in mag["cache"].iterdir())
    stamp = (first.cache.path / "meta.json").stat().st_mtime_ns
    again = OGBHeteroNodeDataset(str(mag["root"]), cache_dir=str(mag["cache"]))
    assert again.cache.path == first.cache.path
    again.load()
    assert sorted(p.name for p in mag["cache"].iterdir()) == entries
    assert (first.cache.path / "meta.json").stat().st_mtime_ns == stamp
    names = sorted(p.name for p in first.cache.path.iterdir())
    assert "x.paper.npy" in names and "edge_index.author__writes__paper.npy" in names and "y.npy" in names


def test_a_changed_file_converts_again(mag: dict) -> None:
    first = OGBHeteroNodeDataset(str(mag["root"]), cache_dir=str(mag["cache"]))
    first.prepare()
    _write(mag["root"] / "split" / "time" / "paper" / "test.csv.gz", _rows(np.arange(17, 20)))
    second = OGBHeteroNodeDataset(str(mag["root"]), cache_dir=str(mag["cache"]))
    assert second.cache.path != first.cache.path
    with pytest.warns(UserWarning, match="no longer used"):
        assert second.load().test_idx.tolist() == [17, 18, 19]


def test_missing_folder_and_files_name_them(mag: dict, tmp_path: Path) -> None:
    with pytest.raises(DatasetFileError, match=r"empty[/\\]raw: is missing.*never downloads"):
        OGBHeteroNodeDataset(str(tmp_path / "empty"))
    (mag["root"] / "raw" / "relations" / "author___writes___paper" / "edge.csv.gz").unlink()
    with pytest.raises(DatasetFileError, match=r"author___writes___paper[/\\]edge.csv.gz: is missing"):
        OGBHeteroNodeDataset(str(mag["root"]))


def test_missing_split_file_names_it(mag: dict) -> None:
    (mag["root"] / "split" / "time" / "paper" / "valid.csv.gz").unlink()
    with pytest.raises(DatasetFileError, match=r"paper[/\\]valid.csv.gz: is missing"):
        OGBHeteroNodeDataset(str(mag["root"]))


def test_id_out_of_range_for_its_type_names_file_and_line(mag: dict) -> None:
    folder = mag["root"] / "raw" / "relations" / "author___affiliated_with___institution"
    e = mag["edges"][("author", "affiliated_with", "institution")].copy()
    e[6, 1] = 4  # institution has 4 nodes; fine as an author id
    _write(folder / "edge.csv.gz", _rows(e))
    ds = OGBHeteroNodeDataset(str(mag["root"]), cache_dir=str(mag["cache"]))
    with pytest.raises(DatasetFileError, match=r"line 7: the destination 4 is not a 'institution' id.*4 nodes"):
        ds.load()
    assert not ds.cache.exists()


def test_edge_count_checked_against_its_count_file(mag: dict) -> None:
    folder = mag["root"] / "raw" / "relations" / "paper___cites___paper"
    _write(folder / "edge.csv.gz", _rows(mag["edges"][("paper", "cites", "paper")][:45]))
    with pytest.raises(DatasetFileError, match=r"cites___paper[/\\]edge.csv.gz: has 45 edges, but num-edge-list"):
        OGBHeteroNodeDataset(str(mag["root"]), cache_dir=str(mag["cache"])).load()


def test_feature_and_label_rows_checked_against_the_node_dict(mag: dict) -> None:
    _write(mag["root"] / "raw" / "node-feat" / "paper" / "node-feat.csv.gz", _rows(mag["x"][:19]))
    with pytest.raises(DatasetFileError, match=r"node-feat.csv.gz: has 19 rows, expected 20 rows, one per 'paper'"):
        OGBHeteroNodeDataset(str(mag["root"]), cache_dir=str(mag["cache"])).load()
    _write(mag["root"] / "raw" / "node-label" / "paper" / "node-label.csv.gz", _rows(mag["y"][:18]))
    with pytest.raises(DatasetFileError, match=r"node-label.csv.gz: has 18 rows, but num-node-dict.csv.gz says 20"):
        OGBHeteroNodeDataset(str(mag["root"]), cache_dir=str(mag["cache"])).load()


def test_bad_node_dict_and_unknown_type(mag: dict) -> None:
    raw = mag["root"] / "raw"
    _write(raw / "num-node-dict.csv.gz", "author,paper\n30\n")
    with pytest.raises(DatasetFileError, match=r"num-node-dict.csv.gz, line 2: names 2 node types but gives 1"):
        OGBHeteroNodeDataset(str(mag["root"]))
    _write(raw / "num-node-dict.csv.gz", "author,paper,institution,field_of_study\n30,20,4,x\n")
    with pytest.raises(DatasetFileError, match=r"count of 'field_of_study' is 'x'"):
        OGBHeteroNodeDataset(str(mag["root"]))
    _write(raw / "num-node-dict.csv.gz", "author,paper,institution\n30,20,4\n")
    with pytest.raises(DatasetFileError, match=r"has_topic___field_of_study: names the node type 'field_of_study'"):
        OGBHeteroNodeDataset(str(mag["root"]))


def test_bad_label_names_line(mag: dict) -> None:
    y = mag["y"].copy()
    y[3] = 1.5
    _write(mag["root"] / "raw" / "node-label" / "paper" / "node-label.csv.gz", _rows(y))
    with pytest.raises(DatasetFileError, match=r"line 4: label 1.5 is not a class"):
        OGBHeteroNodeDataset(str(mag["root"]), num_classes=3, cache_dir=str(mag["cache"])).load()
