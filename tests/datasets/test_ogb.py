"""OGBNodeDataset reads OGB's node-property-prediction folder layout from a local directory."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_zerocopy.datasets import OGBNodeDataset


def _write_csv(path: Path, rows: np.ndarray, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in np.atleast_2d(rows.T).T if rows.ndim == 1 else rows:
            values = np.atleast_1d(row)
            f.write(",".join("nan" if np.isnan(v) else format(v, fmt) for v in values.astype(float)) + "\n")


@pytest.fixture
def ogb_folder(tmp_path: Path):
    rng = np.random.default_rng(3)
    n, e, f = 50, 200, 6
    edges = rng.integers(0, n, size=(e, 2))
    feats = rng.standard_normal((n, f)).astype(np.float32)
    labels = rng.integers(0, 4, size=n).astype(float)
    labels[[3, 7]] = np.nan  # unlabeled nodes
    edge_feat = rng.standard_normal((e, 2)).astype(np.float32)
    root = tmp_path / "ogbn_tiny"
    _write_csv(root / "raw" / "edge.csv.gz", edges, "g")
    _write_csv(root / "raw" / "node-feat.csv.gz", feats, ".9g")
    _write_csv(root / "raw" / "node-label.csv.gz", labels, "g")
    _write_csv(root / "raw" / "edge-feat.csv.gz", edge_feat, ".9g")
    _write_csv(root / "raw" / "num-node-list.csv.gz", np.array([n]), "g")
    perm = rng.permutation(n)
    for name, ids in (("train", perm[:30]), ("valid", perm[30:40]), ("test", perm[40:])):
        _write_csv(root / "split" / "random" / f"{name}.csv.gz", ids, "g")
    return root, dict(edges=edges, feats=feats, labels=labels, edge_feat=edge_feat, perm=perm)


def test_reads_the_layout(ogb_folder, tmp_path: Path) -> None:
    root, ref = ogb_folder
    ds = OGBNodeDataset(str(root), cache_dir=str(tmp_path / "cache"))
    assert ds.num_features == 6 and ds.num_classes == 4
    data = ds.load()
    assert torch.equal(data.edge_index, torch.from_numpy(ref["edges"].T))
    assert torch.equal(data.x, torch.from_numpy(ref["feats"]))
    expected_y = np.where(np.isnan(ref["labels"]), -1, ref["labels"]).astype(np.int64)
    assert torch.equal(data.y, torch.from_numpy(expected_y))
    assert torch.equal(data.edge_attr, torch.from_numpy(ref["edge_feat"]))
    assert torch.equal(data.train_idx, torch.from_numpy(ref["perm"][:30]))
    assert torch.equal(data.val_idx, torch.from_numpy(ref["perm"][30:40]))
    assert torch.equal(data.test_idx, torch.from_numpy(ref["perm"][40:]))
    assert data.x_file is not None and data.x_file.endswith(".npy")


def test_inverse_edges_and_cache(ogb_folder, tmp_path: Path) -> None:
    root, ref = ogb_folder
    ds = OGBNodeDataset(str(root), add_inverse_edges=True, cache_dir=str(tmp_path / "cache"))
    data = ds.load()
    e = ref["edges"].shape[0]
    assert data.num_edges == 2 * e
    assert torch.equal(data.edge_index[:, e:], data.edge_index[:, :e].flip(0))
    assert data.edge_attr.shape[0] == 2 * e
    # a second dataset object reads the finished cache (num_classes from its metadata)
    again = OGBNodeDataset(str(root), add_inverse_edges=True, cache_dir=str(tmp_path / "cache"))
    assert again.cache.exists() and again.num_classes == 4


def test_folder_errors_name_what_to_change(ogb_folder, tmp_path: Path) -> None:
    root, _ = ogb_folder
    with pytest.raises(FileNotFoundError, match="edge.csv.gz"):
        OGBNodeDataset(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="split 'time' not found"):
        OGBNodeDataset(str(root), split="time")
    (root / "split" / "other").mkdir()
    with pytest.raises(ValueError, match="choose one with `split`"):
        OGBNodeDataset(str(root))
