"""OGBLinkDataset reads OGB's link-property-prediction folder layout from a local directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_zerocopy.datasets import DatasetFileError, OGBLinkDataset, check_link_splits
from tests.datasets.test_ogb import _write_csv

N, F = 40, 5


def _raw(root: Path, rng: np.random.Generator, num_edges: int = 120) -> dict[str, np.ndarray]:
    edges = rng.integers(0, N, size=(num_edges, 2))
    feats = rng.standard_normal((N, F)).astype(np.float32)
    _write_csv(root / "raw" / "edge.csv.gz", edges, "g")
    _write_csv(root / "raw" / "node-feat.csv.gz", feats, ".9g")
    _write_csv(root / "raw" / "num-node-list.csv.gz", np.array([N]), "g")
    _write_csv(root / "raw" / "num-edge-list.csv.gz", np.array([num_edges]), "g")
    return dict(edges=edges, feats=feats)


@pytest.fixture
def collab(tmp_path: Path):
    """ogbl-collab's layout: 'edge' [P, 2] and a shared pool 'edge_neg' [N, 2]; one file holds numpy arrays."""
    rng = np.random.default_rng(5)
    root = tmp_path / "ogbl_tiny"
    ref = _raw(root, rng)
    split = root / "split" / "time"
    split.mkdir(parents=True)
    ref["train"] = torch.from_numpy(ref["edges"]).clone()
    torch.save({"edge": ref["train"], "weight": torch.ones(120), "year": torch.full((120,), 2019)}, split / "train.pt")
    for name, count in (("valid", 10), ("test", 12)):
        ref[name] = rng.integers(0, N, size=(count, 2))
        ref[f"{name}_neg"] = rng.integers(0, N, size=(3 * count, 2))
    torch.save({"edge": ref["valid"], "edge_neg": ref["valid_neg"]}, split / "valid.pt")  # numpy arrays
    torch.save({"edge": torch.from_numpy(ref["test"]), "edge_neg": torch.from_numpy(ref["test_neg"])}, split / "test.pt")
    return root, ref


@pytest.fixture
def citation(tmp_path: Path):
    """ogbl-citation2's layout: source_node / target_node [P] and target_node_neg [P, K]."""
    rng = np.random.default_rng(6)
    root = tmp_path / "ogbl_cite"
    ref = _raw(root, rng)
    split = root / "split" / "time"
    split.mkdir(parents=True)
    torch.save({"source_node": torch.from_numpy(ref["edges"][:, 0]), "target_node": torch.from_numpy(ref["edges"][:, 1])},
               split / "train.pt")
    for name, count in (("valid", 8), ("test", 9)):
        ref[name] = rng.integers(0, N, size=(count, 2))
        ref[f"{name}_neg"] = rng.integers(0, N, size=(count, 4))
        torch.save({"source_node": torch.from_numpy(ref[name][:, 0]), "target_node": torch.from_numpy(ref[name][:, 1]),
                    "target_node_neg": torch.from_numpy(ref[f"{name}_neg"])}, split / f"{name}.pt")
    return root, ref


def test_reads_collab_style_splits(collab, tmp_path: Path) -> None:
    root, ref = collab
    ds = OGBLinkDataset(str(root), add_inverse_edges=True, cache_dir=str(tmp_path / "cache"))
    assert ds.num_features == F and ds.split == "time"
    data = ds.load()
    edges = torch.from_numpy(ref["edges"].T)
    assert torch.equal(data.edge_index, torch.cat([edges, edges.flip(0)], 1))
    assert torch.equal(data.x, torch.from_numpy(ref["feats"])) and data.x_file.endswith("x.npy")
    assert torch.equal(data.split("train").pos_edge_index, ref["train"].T) and data.split("train").neg_edge_index is None
    for ours, theirs in (("val", "valid"), ("test", "test")):
        split = data.split(ours)
        assert torch.equal(split.pos_edge_index, torch.from_numpy(ref[theirs].T))
        assert torch.equal(split.neg_edge_index, torch.from_numpy(ref[f"{theirs}_neg"].T))
        assert split.neg_per_positive is None  # one pool for every positive (Hits@K)
    assert ds.split_source("val") == str(root / "split" / "time" / "valid.pt")
    again = OGBLinkDataset(str(root), add_inverse_edges=True, cache_dir=str(tmp_path / "cache"))
    assert again.cache.path == ds.cache.path and again.cache.exists()


def test_reads_citation2_style_splits_grouped_per_positive(citation, tmp_path: Path) -> None:
    root, ref = citation
    data = OGBLinkDataset(str(root), cache_dir=str(tmp_path / "cache")).load()
    assert torch.equal(data.edge_index, torch.from_numpy(ref["edges"].T))
    assert torch.equal(data.split("train").pos_edge_index, torch.from_numpy(ref["edges"].T))
    for ours, theirs in (("val", "valid"), ("test", "test")):
        split = data.split(ours)
        assert split.neg_per_positive == 4
        assert torch.equal(split.pos_edge_index, torch.from_numpy(ref[theirs].T))
        src = torch.from_numpy(ref[theirs][:, 0]).repeat_interleave(4)
        assert torch.equal(split.neg_edge_index, torch.stack([src, torch.from_numpy(ref[f"{theirs}_neg"].reshape(-1))]))


def test_the_check_names_the_split_file(collab, tmp_path: Path) -> None:
    root, ref = collab
    neg = ref["test_neg"].copy()
    neg[2] = ref["test"][0]
    torch.save({"edge": ref["test"], "edge_neg": neg}, root / "split" / "time" / "test.pt")
    ds = OGBLinkDataset(str(root), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"the test split \(.*split/time/test.pt\) lists 1 positive edge among its"):
        check_link_splits(ds.load(), {s: ds.split_source(s) for s in ("train", "val", "test")})


def test_a_changed_split_file_is_converted_again(collab, tmp_path: Path) -> None:
    root, ref = collab
    first = OGBLinkDataset(str(root), cache_dir=str(tmp_path / "cache"))
    first.prepare()
    torch.save({"edge": ref["valid"][:5], "edge_neg": ref["valid_neg"]}, root / "split" / "time" / "valid.pt")
    second = OGBLinkDataset(str(root), cache_dir=str(tmp_path / "cache"))
    assert second.cache.path != first.cache.path
    with pytest.warns(UserWarning, match="converted again"):
        second.prepare()
    assert second.load().split("val").num_positives == 5


@pytest.mark.parametrize(
    "content, message",
    [
        ({"head": torch.zeros(3, dtype=torch.long)}, r"holds the keys \['head'\]; an ogbl split file holds 'edge'"),
        ({"edge": torch.zeros(3, 3, dtype=torch.long)}, r"'edge' has shape \(3, 3\); OGB stores edges as \[P, 2\]"),
        ({"edge": torch.tensor([[0.0, 2.5]])}, r"'edge' holds 2.5, which is not a node id"),
        ([1, 2], r"holds a list, not OGB's dict of edges"),
    ],
)
def test_a_bad_split_file_is_named(collab, tmp_path: Path, content, message: str) -> None:
    root, _ = collab
    torch.save(content, root / "split" / "time" / "valid.pt")
    with pytest.raises(DatasetFileError, match=rf"split/time/valid.pt: {message}"):
        OGBLinkDataset(str(root), cache_dir=str(tmp_path / "cache")).load()


def test_a_split_file_that_would_run_code_is_refused(collab, tmp_path: Path) -> None:
    root, _ = collab
    torch.save({"edge": torch.zeros(1, 2, dtype=torch.long), "hook": Path("x")}, root / "split" / "time" / "test.pt")
    with pytest.raises(DatasetFileError, match="test.pt: cannot be loaded with torch.load"):
        OGBLinkDataset(str(root), cache_dir=str(tmp_path / "cache")).load()


def test_folder_errors_name_what_to_change(collab, tmp_path: Path) -> None:
    root, _ = collab
    with pytest.raises(FileNotFoundError, match="edge.csv.gz not found: `root` must be an OGB link dataset folder"):
        OGBLinkDataset(str(tmp_path / "nowhere"))
    (root / "split" / "time" / "test.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks test.pt: expected split/<name>/train.pt, valid.pt and test.pt"):
        OGBLinkDataset(str(root))
    (root / "raw" / "node-feat.csv.gz").unlink()
    with pytest.raises(FileNotFoundError, match="node-feat.csv.gz not found.*ogbl-ddi"):
        OGBLinkDataset(str(root))


def test_a_cut_edge_file_disagrees_with_its_count_file(collab, tmp_path: Path) -> None:
    root, ref = collab
    _write_csv(root / "raw" / "edge.csv.gz", ref["edges"][:40], "g")
    with pytest.raises(DatasetFileError, match=r"edge.csv.gz: has 40 edges \(lines\), but num-edge-list.csv.gz says 120"):
        OGBLinkDataset(str(root), cache_dir=str(tmp_path / "cache")).load()
