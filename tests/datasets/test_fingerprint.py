"""Cached arrays overwritten with well-formed wrong values (noise over ``x.npy``, a permuted ``y.npy``) are refused,
naming the file and the fix: each file's size and a checksum of sampled blocks are recorded at build
(``datasets/fingerprint.py``). They trained silently before (val acc 0.34 instead of 0.94)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.datasets.base import DatasetFileError, InputDataError
from lightning_zerocopy.datasets.fingerprint import BLOCK_BYTES, BLOCKS, fingerprint


def _graph(tmp_path: Path) -> SyntheticGraph:
    dataset = SyntheticGraph(num_nodes=30000, avg_degree=4, num_features=16, num_classes=4,
                             cache_dir=str(tmp_path / "cache"))  # fmt: skip
    dataset.prepare()
    return dataset


def test_noise_over_x_is_refused_naming_the_file_and_the_fix(tmp_path: Path) -> None:
    dataset = _graph(tmp_path)
    x_path = dataset.cache.file("x")
    assert x_path.stat().st_size > BLOCKS * BLOCK_BYTES  # sampled blocks, not the whole file
    dataset.load()
    x = np.load(x_path, mmap_mode="r+")
    x[:] = np.random.default_rng(0).standard_normal(x.shape).astype(x.dtype)  # same shape and dtype: well-formed
    x.flush()
    del x
    with pytest.raises(DatasetFileError) as info:
        dataset.load()
    message = str(info.value)
    assert str(x_path) in message and "holds other bytes than when its cache was built" in message
    assert "delete that directory" in message and "\n" not in message


def test_a_permuted_label_file_fails_the_setup_in_one_line(tmp_path: Path) -> None:
    dataset = _graph(tmp_path)
    y_path = dataset.cache.file("y")
    y = np.load(y_path, mmap_mode="r+")
    y[:] = np.random.default_rng(1).permutation(np.asarray(y))
    y.flush()
    del y
    dm = ZeroCopyDataModule(dataset, fanouts=[3], batch_size=64)
    with pytest.raises(InputDataError, match=r"y\.npy: holds other bytes"):
        dm.setup("fit")


def test_a_node_order_cache_whose_features_changed_is_refused(tmp_path: Path) -> None:
    dataset = _graph(tmp_path)
    dm = ZeroCopyDataModule(dataset, fanouts=[3], batch_size=64, node_order="degree")
    dm.prepare_data()
    ordered = next(p for p in (tmp_path / "cache").iterdir() if p.name.endswith("-order-degree-v1"))
    meta = json.loads((ordered / "meta.json").read_text())
    assert set(meta["fingerprint"]) >= {"x.npy", "y.npy", "indptr.npy"}
    with open(ordered / "x.npy", "r+b") as f:  # one block the sample reads: the first
        f.seek(200)
        f.write(b"\x7f" * 64)
    with pytest.raises(InputDataError, match=r"x\.npy: holds other bytes.*delete that directory"):
        dm.setup("fit")


def test_a_file_of_another_size_is_named_with_both_sizes(tmp_path: Path) -> None:
    path = tmp_path / "a.npy"
    np.save(path, np.arange(10))
    recorded = fingerprint(path)
    np.save(path, np.arange(11))
    from lightning_zerocopy.datasets.fingerprint import changed_file

    assert changed_file(path, recorded) == f"has {path.stat().st_size:,} bytes, {recorded['size']:,} when its cache was built"
    assert changed_file(path, None) is None
