"""OGB node-property-prediction datasets read from a local folder (no download).

Reads the folder layout that the ``ogb`` package downloads and unpacks, e.g. ``ogbn_products/``::

    raw/edge.csv.gz             one "src,dst" line per edge
    raw/node-feat.csv.gz        one comma-separated feature row per node
    raw/node-label.csv.gz       one label per node ("nan" for unlabeled nodes)
    raw/num-node-list.csv.gz    optional: the number of nodes
    raw/edge-feat.csv.gz        optional: one feature row per edge (becomes ``edge_attr``)
    split/<split>/{train,valid,test}.csv.gz   node ids of each split

The CSVs are converted once (with a progress bar) into ``.npy`` files in the cache; the features are
written row-chunk by row-chunk into a memory-mapped ``.npy``, so a feature matrix larger than RAM converts
and later trains from disk through the page cache.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from lightning_zerocopy.datasets.base import (
    ArrayCache,
    CachedNodeDataset,
    config_key,
    default_cache_root,
)
from lightning_zerocopy.graph.shared_memory import save_npy

_BLOCK_BYTES = 1 << 24


def _parse_lines(text: str, dtype: np.dtype) -> np.ndarray:
    values = np.fromstring(text.replace("\n", ","), sep=",", dtype=np.float64)
    return values.astype(dtype, copy=False) if dtype != np.float64 else values


def _csv_blocks(path: Path, desc: str) -> Iterator[tuple[str, int]]:
    """Yield ``(text, num_lines)`` blocks of whole lines of a gzipped CSV, with a progress bar in bytes."""
    total = os.path.getsize(path)
    with open(path, "rb") as raw, gzip.open(raw, "rt", encoding="ascii") as f, tqdm(
        total=total, desc=desc, unit="B", unit_scale=True, delay=1.0, leave=False
    ) as bar:
        tail = ""
        while True:
            block = f.read(_BLOCK_BYTES)
            if not block:
                break
            block = tail + block
            cut = block.rfind("\n") + 1
            block, tail = block[:cut], block[cut:]
            bar.update(raw.tell() - bar.n)
            if block:
                yield block, block.count("\n")
        if tail.strip():
            yield tail + "\n", 1


def _first_row_width(path: Path) -> int:
    with gzip.open(path, "rt", encoding="ascii") as f:
        return len(f.readline().strip().split(","))


def read_csv_matrix(path: Path, dtype: Any, desc: str) -> np.ndarray:
    """Read a gzipped numeric CSV into an in-memory ``[rows, cols]`` array of ``dtype``."""
    width = _first_row_width(path)
    parts = [_parse_lines(text, np.dtype(dtype)).reshape(-1, width) for text, _ in _csv_blocks(path, desc)]
    return np.concatenate(parts) if parts else np.empty((0, width), dtype=dtype)


def convert_csv_to_npy(path: Path, out: Path, rows: int, dtype: Any, desc: str) -> None:
    """Stream a gzipped numeric CSV of ``rows`` rows into the memory-mapped ``.npy`` file ``out``."""
    width = _first_row_width(path)
    target = np.lib.format.open_memmap(out, mode="w+", dtype=np.dtype(dtype), shape=(rows, width))
    filled = 0
    for text, _ in _csv_blocks(path, desc):
        block = _parse_lines(text, np.dtype(dtype)).reshape(-1, width)
        if filled + block.shape[0] > rows:
            raise ValueError(f"{path} has more than the expected {rows} rows")
        target[filled : filled + block.shape[0]] = block
        filled += block.shape[0]
    if filled != rows:
        raise ValueError(f"{path} has {filled} rows, expected {rows}")
    target.flush()
    del target


class OGBNodeDataset(CachedNodeDataset):
    """An ``ogbn-*`` dataset from a local folder in OGB's layout (see the module docstring).

    Args:
        root: the dataset folder, the one holding ``raw/`` and ``split/`` (e.g. ``.../ogbn_products``).
        split: the subfolder of ``split/`` to use (e.g. ``sales_ranking``); default: the only one present.
        add_inverse_edges: also store every edge reversed (OGB does this for e.g. ogbn-products and
            ogbn-proteins; for ogbn-arxiv/papers100M it makes the graph undirected).
        feature_dtype: dtype of the converted node features, ``"float32"`` or ``"float16"``.
        num_classes: number of classes; default: the largest label + 1.
        cache_dir: cache root (default ``$LIGHTNING_ZEROCOPY_CACHE`` or ``~/.cache/lightning_zerocopy``).
    """

    def __init__(
        self,
        root: str,
        split: Optional[str] = None,
        add_inverse_edges: bool = False,
        feature_dtype: str = "float32",
        num_classes: Optional[int] = None,
        cache_dir: Optional[str] = None,
    ) -> None:
        self.root = Path(root).expanduser().resolve()
        self.raw = self.root / "raw"
        for name in ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz"):
            if not (self.raw / name).is_file():
                raise FileNotFoundError(
                    f"{self.raw / name} not found: `root` must be an OGB node dataset folder holding raw/ and split/"
                )
        splits = sorted(p.name for p in (self.root / "split").glob("*") if p.is_dir())
        if split is None:
            if len(splits) != 1:
                raise ValueError(f"{self.root / 'split'} holds splits {splits}: choose one with `split`")
            split = splits[0]
        if split not in splits:
            raise ValueError(f"split {split!r} not found under {self.root / 'split'}; available: {splits}")
        if feature_dtype not in ("float32", "float16"):
            raise ValueError(f"feature_dtype must be 'float32' or 'float16', got {feature_dtype!r}")
        self.split = split
        self.add_inverse_edges = add_inverse_edges
        self.feature_dtype = feature_dtype
        self._num_classes = num_classes
        edge_file = self.raw / "edge.csv.gz"
        self.config: dict[str, Any] = dict(
            root=str(self.root),
            source_stamp=[os.path.getsize(edge_file), int(os.path.getmtime(edge_file))],
            split=split,
            add_inverse_edges=add_inverse_edges,
            feature_dtype=feature_dtype,
            version=1,
        )
        cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
        self.cache = ArrayCache(cache_root / f"ogb-{self.root.name}-{config_key(self.config)}")

    @property
    def num_features(self) -> int:
        return _first_row_width(self.raw / "node-feat.csv.gz")

    @property
    def num_classes(self) -> int:
        if self._num_classes is None:
            if self.cache.exists():
                self._num_classes = int(self.cache.meta()["num_classes"])
            else:
                labels = read_csv_matrix(self.raw / "node-label.csv.gz", np.float64, "ogb: labels")
                self._num_classes = int(np.nanmax(labels)) + 1
        return self._num_classes

    def _write(self, out: Path) -> dict[str, Any]:
        labels = read_csv_matrix(self.raw / "node-label.csv.gz", np.float64, "ogb: labels")[:, 0]
        num_nodes = self._num_nodes(default=labels.shape[0])
        y = np.where(np.isnan(labels), -1, labels).astype(np.int64)
        np.save(out / "y.npy", y)

        edges = read_csv_matrix(self.raw / "edge.csv.gz", np.int64, "ogb: edges").T
        edge_attr_path = self.raw / "edge-feat.csv.gz"
        edge_attr = read_csv_matrix(edge_attr_path, np.float32, "ogb: edge features") if edge_attr_path.is_file() else None
        if self.add_inverse_edges:
            edges = np.concatenate([edges, edges[::-1]], axis=1)
            edge_attr = np.concatenate([edge_attr, edge_attr]) if edge_attr is not None else None
        np.save(out / "edge_index.npy", np.ascontiguousarray(edges))
        if edge_attr is not None:
            np.save(out / "edge_attr.npy", edge_attr)
        del edges, edge_attr

        convert_csv_to_npy(self.raw / "node-feat.csv.gz", out / "x.npy", num_nodes, self.feature_dtype, "ogb: node features")

        split_dir = self.root / "split" / self.split
        for ours, theirs in (("train", "train"), ("val", "valid"), ("test", "test")):
            idx = read_csv_matrix(split_dir / f"{theirs}.csv.gz", np.int64, f"ogb: {theirs} split")[:, 0]
            save_npy(torch.from_numpy(np.ascontiguousarray(idx)), out / f"{ours}_idx.npy")
        num_classes = self._num_classes if self._num_classes is not None else int(y.max()) + 1
        return dict(self.config, num_nodes=num_nodes, num_classes=num_classes)

    def _num_nodes(self, default: int) -> int:
        path = self.raw / "num-node-list.csv.gz"
        if not path.is_file():
            return default
        return int(read_csv_matrix(path, np.int64, "ogb: num nodes")[0, 0])


__all__: list[str] = ["OGBNodeDataset", "read_csv_matrix", "convert_csv_to_npy"]
