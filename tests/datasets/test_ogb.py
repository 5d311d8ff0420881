"""OGBNodeDataset reads OGB's node-property-prediction folder layout from a local directory."""

from __future__ import annotations

import gzip
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_zerocopy.datasets import DatasetFileError, OGBNodeDataset


def _csv_text(rows: np.ndarray, fmt: str) -> str:
    lines = []
    for row in np.atleast_2d(rows.T).T if rows.ndim == 1 else rows:
        values = np.atleast_1d(row)
        lines.append(",".join("nan" if np.isnan(v) else format(v, fmt) for v in values.astype(float)) + "\n")
    return "".join(lines)


def _write_csv(path: Path, rows: np.ndarray, fmt: str) -> None:
    _write_text(path, _csv_text(rows, fmt))


def _write_text(path: Path, text: str) -> None:
    """Gzip ``text`` into ``path`` uncompressed (level 0) with a fixed header, so the file's size depends only on
    the text's length: a rewrite with rows permuted has the same size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=0, mtime=0) as f:
        f.write(text.encode("ascii"))


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
    _write_csv(root / "raw" / "num-edge-list.csv.gz", np.array([e]), "g")
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


def test_an_empty_split_folder_says_what_is_missing(ogb_folder) -> None:
    root, _ = ogb_folder
    for path in (root / "split" / "random").iterdir():
        path.unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks train\.csv\.gz, valid\.csv\.gz, test\.csv\.gz"):
        OGBNodeDataset(str(root))
    (root / "split" / "random").rmdir()
    with pytest.raises(FileNotFoundError, match=r"holds no split folder: expected split/<name>/train\.csv\.gz"):
        OGBNodeDataset(str(root))
    (root / "split").rmdir()
    with pytest.raises(FileNotFoundError, match=r"split not found: .*split/<name>/train\.csv\.gz"):
        OGBNodeDataset(str(root))


# ---- the cache is keyed on every input file ------------------------------------------------------------------


def test_an_unchanged_folder_reuses_its_cache(ogb_folder, tmp_path: Path) -> None:
    root, _ = ogb_folder
    first = OGBNodeDataset(str(root), cache_dir=str(tmp_path / "cache"))
    first.prepare()
    built = (first.cache.path / "meta.json").stat().st_mtime_ns
    again = OGBNodeDataset(str(root), cache_dir=str(tmp_path / "cache"))
    assert again.cache.path == first.cache.path
    again.prepare()
    assert (again.cache.path / "meta.json").stat().st_mtime_ns == built
    assert len(list((tmp_path / "cache").iterdir())) == 1


def _rewrite_keeping_size_and_mtime(path: Path, text: str, in_place: bool) -> None:
    """Rewrite ``path`` with ``text`` (same length) and restore its modification time, as ``cp -p`` / ``rsync -t``
    leave a copied file; ``in_place`` keeps the inode (writes over the old bytes), else a new file replaces it."""
    before = path.stat()
    time.sleep(0.05)  # the kernel's timestamps can be a jiffy coarse: let the inode change time move on
    fresh = path.with_name(path.name + ".new")
    _write_text(fresh, text)
    if in_place:
        data = fresh.read_bytes()
        fresh.unlink()
        with open(path, "r+b") as f:
            f.write(data)
    else:
        os.replace(fresh, path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert (after.st_ino == before.st_ino) == in_place


@pytest.mark.parametrize(
    ("name", "array", "in_place"),
    [
        ("raw/node-label.csv.gz", "y", False),
        ("raw/node-feat.csv.gz", "x", False),
        ("raw/edge.csv.gz", "edge_index", False),
        ("raw/edge.csv.gz", "edge_index", True),
        ("raw/edge-feat.csv.gz", "edge_attr", True),
        ("split/random/train.csv.gz", "train_idx", False),
        ("split/random/valid.csv.gz", "val_idx", True),
        ("split/random/test.csv.gz", "test_idx", False),
    ],
)
def test_a_changed_input_file_invalidates_the_cache(ogb_folder, tmp_path: Path, name: str, array: str, in_place: bool) -> None:
    root, _ = ogb_folder
    cache = str(tmp_path / "cache")
    before = getattr(OGBNodeDataset(str(root), cache_dir=cache).load(), array)
    path = root / name
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines(keepends=True)
    _rewrite_keeping_size_and_mtime(path, "".join(reversed(lines)), in_place)  # rows reversed: same size
    after = getattr(OGBNodeDataset(str(root), cache_dir=cache).load(), array)
    expected = before.flip(1) if array == "edge_index" else before.flip(0)
    assert not torch.equal(after, before)
    assert torch.equal(after, expected)


# ---- damaged and malformed files name the file (and the line) -----------------------------------------------


def _edge_text(n: int = 50, rows: int = 4000) -> str:
    ids = np.random.default_rng(5).integers(0, n, size=(rows, 2))
    return "".join(f"{a},{b}\n" for a, b in ids)


def _compressed(text: str) -> bytes:
    return gzip.compress(text.encode("ascii"), compresslevel=9, mtime=0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (lambda: _compressed(_edge_text())[: len(_compressed(_edge_text())) // 2], r": is truncated: its compressed data ends after line \d+"),
        (lambda: _edge_text().encode(), r": is not a gzip file"),
        (lambda: _compressed("0,1\n2,x\n"), r", line 2: value 2 \('x'\) is not an integer"),
        (lambda: _compressed("0,1\n1,2,3\n4,5\n"), r", line 2: expected 2 comma-separated values, found 3: '1,2,3'"),
        (lambda: _compressed("0,1\n1\n"), r", line 2: expected 2 comma-separated values, found 1"),
        (lambda: _compressed("0,1\n3.7,2\n"), r", line 2: value 1 \('3.7'\) is not an integer"),
        (lambda: _compressed("0,1\n2,50\n"), r", line 2: node id 50 is out of range: the graph has 50 nodes"),
        (lambda: _compressed("0,1\n-1,2\n"), r", line 2: node id -1 is out of range"),
        (lambda: _compressed("src,dst\n0,1\n"), r", line 1: value 1 \('src'\) is not an integer"),
    ],
    ids=["truncated", "plain-text", "non-numeric", "extra-field", "missing-field", "non-integer", "id-too-large", "negative-id", "header"],
)
def test_a_bad_edge_file_is_named_with_its_line(ogb_folder, tmp_path: Path, content, message: str) -> None:
    root, _ = ogb_folder
    path = root / "raw" / "edge.csv.gz"
    path.write_bytes(content())
    ds = OGBNodeDataset(str(root), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=re.escape(str(path)) + message):
        ds.load()
    assert not ds.cache.exists()  # nothing half-converted is left to be reused


def test_a_bit_flipped_edge_file_is_named(ogb_folder, tmp_path: Path) -> None:
    root, _ = ogb_folder
    path = root / "raw" / "edge.csv.gz"
    for position in (200, 2000, 5000):  # damage at different places gives different zlib/gzip errors
        data = bytearray(_compressed(_edge_text()))
        data[position] ^= 0x5A
        path.write_bytes(bytes(data))
        with pytest.raises(ValueError, match=re.escape(str(path)) + r"(: is damaged|: holds bytes|, line \d+: )"):
            OGBNodeDataset(str(root), cache_dir=str(tmp_path / "cache")).load()


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("raw/node-label.csv.gz", "1\n2.5\n", r", line 2: label 2\.5 is not a class"),
        ("raw/node-label.csv.gz", "1\n-2\n", r", line 2: label -2 is not a class"),
        ("raw/node-label.csv.gz", "1\n2\n", r": has 2 rows, but num-node-list\.csv\.gz says 50 \(one label per node\)"),
        ("raw/node-feat.csv.gz", "0.5,1\n", r": has 1 rows, expected 50 rows, one per node"),
        ("raw/node-feat.csv.gz", "0.5,1\n0.5,abc\n", r", line 2: value 2 \('abc'\) is not a number"),
        ("raw/edge-feat.csv.gz", "0.5,1\n", r": has 1 rows, but edge\.csv\.gz has 200 edges"),
        ("raw/num-node-list.csv.gz", "", r": is empty"),
        ("split/random/train.csv.gz", "1\n4.5\n", r", line 2: value 1 \('4\.5'\) is not an integer"),
    ],
)
def test_other_bad_files_are_named(ogb_folder, tmp_path: Path, name: str, text: str, message: str) -> None:
    root, _ = ogb_folder
    path = root / name
    path.write_bytes(_compressed(text))
    with pytest.raises(ValueError, match=re.escape(str(path)) + message):
        OGBNodeDataset(str(root), cache_dir=str(tmp_path / "cache")).load()


def test_integral_float_ids_are_read_exactly(ogb_folder, tmp_path: Path) -> None:
    root, ref = ogb_folder
    text = "".join(f"{float(a)},{b}\n" for a, b in ref["edges"])  # "3.0,7": still node 3
    (root / "raw" / "edge.csv.gz").write_bytes(_compressed(text))
    data = OGBNodeDataset(str(root), cache_dir=str(tmp_path / "cache")).load()
    assert torch.equal(data.edge_index, torch.from_numpy(ref["edges"].T))


def test_a_rebuild_names_the_caches_it_replaced(ogb_folder, tmp_path: Path) -> None:
    root, _ = ogb_folder
    cache = tmp_path / "cache"
    old = OGBNodeDataset(str(root), cache_dir=str(cache))
    old.prepare()
    other_dtype = OGBNodeDataset(str(root), feature_dtype="float16", cache_dir=str(cache))
    other_dtype.prepare()  # same files, other arguments: not stale
    (cache / f"{old.cache.path.name}-order-bfs-v1").mkdir()  # a node-order cache derived from the old one
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        OGBNodeDataset(str(root), cache_dir=str(cache)).prepare()  # reused: nothing to say
    _write_csv(root / "raw" / "node-label.csv.gz", np.arange(50) % 3, "g")
    new = OGBNodeDataset(str(root), cache_dir=str(cache))
    with pytest.warns(UserWarning, match="older caches of this folder are no longer used") as record:
        new.prepare()
    message = str(record[0].message)
    assert str(old.cache.path) in message and f"{old.cache.path}-order-bfs-v1" in message
    assert str(other_dtype.cache.path) in message  # built from the old labels too
    assert str(new.cache.path) + "," not in message and message.count(str(cache)) == 4


@pytest.mark.parametrize("kept", [0, 40])
def test_an_edge_file_emptied_or_cut_short_is_named(ogb_folder, tmp_path: Path, kept: int) -> None:
    """It still parses; only OGB's num-edge-list.csv.gz (200 here) shows that lines are missing."""
    root, ref = ogb_folder
    (root / "raw" / "edge-feat.csv.gz").unlink()  # most ogbn folders have none (its row count shows a cut too)
    _write_csv(root / "raw" / "edge.csv.gz", ref["edges"][:kept], "g")
    with pytest.raises(DatasetFileError, match=rf"edge\.csv\.gz: has {kept} edges \(lines\), but num-edge-list\.csv\.gz "
                                               r"says 200: edge\.csv\.gz is too short"):
        OGBNodeDataset(str(root), cache_dir=str(tmp_path / "cache")).load()


def test_a_count_file_of_several_graphs_is_named(ogb_folder, tmp_path: Path) -> None:
    root, _ = ogb_folder
    _write_text(root / "raw" / "num-edge-list.csv.gz", "100\n100\n")
    with pytest.raises(DatasetFileError, match=r"num-edge-list\.csv\.gz: holds 2 counts \(one per graph\)"):
        OGBNodeDataset(str(root), cache_dir=str(tmp_path / "cache")).load()


def test_the_count_check_is_reusable(tmp_path: Path) -> None:
    from lightning_zerocopy.datasets.ogb_counts import check_count, read_count

    _write_text(tmp_path / "num-node-list.csv.gz", "7\n")
    assert read_count(tmp_path / "num-node-list.csv.gz") == 7 and read_count(tmp_path / "absent.csv.gz") is None
    check_count(tmp_path / "x.csv.gz", 7, tmp_path / "num-node-list.csv.gz", "rows")
    check_count(tmp_path / "x.csv.gz", 3, tmp_path / "absent.csv.gz", "rows")  # nothing to compare with
    with pytest.raises(DatasetFileError, match=r"x\.csv\.gz: has 9 rows, but num-node-list\.csv\.gz says 7: x\.csv\.gz is too long"):
        check_count(tmp_path / "x.csv.gz", 9, tmp_path / "num-node-list.csv.gz", "rows")
