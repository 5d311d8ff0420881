"""OGB node-property-prediction datasets read from a local folder (no download).

Reads the folder layout that the ``ogb`` package downloads and unpacks, e.g. ``ogbn_products/``::

    raw/edge.csv.gz             one "src,dst" line per edge
    raw/node-feat.csv.gz        one comma-separated feature row per node
    raw/node-label.csv.gz       one label per node ("nan" for unlabeled nodes)
    raw/num-node-list.csv.gz    optional: the number of nodes
    raw/num-edge-list.csv.gz    optional: the number of edges (lines of edge.csv.gz)
    raw/edge-feat.csv.gz        optional: one feature row per edge (becomes ``edge_attr``)
    split/<split>/{train,valid,test}.csv.gz   node ids of each split

The CSVs are converted once (with a progress bar) into ``.npy`` files in the cache; the features are
written row-chunk by row-chunk into a memory-mapped ``.npy``, so a feature matrix larger than RAM converts
and later trains from disk through the page cache. A damaged or malformed file fails the conversion with a
:class:`~lightning_zerocopy.datasets.base.DatasetFileError` naming the file and, where known, the line
(:mod:`lightning_zerocopy.datasets.csv_gz`); the cache is only published once every file converted. Where OGB's
count files are present, the node and edge files must hold as many rows as they say
(:mod:`lightning_zerocopy.datasets.ogb_counts`): an emptied or cut-short ``edge.csv.gz`` is an error.

The cache is keyed on every input file (see :func:`file_stamp`): changing any of them -- labels, features,
edges, edge features, the node count or a split file -- converts the folder again.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from lightning_zerocopy.datasets.base import (
    ArrayCache,
    CachedNodeDataset,
    DatasetFileError,
    config_key,
    default_cache_root,
)
from lightning_zerocopy.datasets.csv_gz import convert_csv_to_npy, first_row_width, read_csv_matrix
from lightning_zerocopy.datasets.ogb_counts import EDGE_COUNT_FILE, NODE_COUNT_FILE, check_count, read_count
from lightning_zerocopy.graph.shared_memory import save_npy

_REQUIRED = ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz")
_OPTIONAL = (NODE_COUNT_FILE, EDGE_COUNT_FILE, "edge-feat.csv.gz")
_SPLIT_FILES = {"train": "train.csv.gz", "val": "valid.csv.gz", "test": "test.csv.gz"}
_SPLIT_LAYOUT = "split/<name>/train.csv.gz, valid.csv.gz and test.csv.gz (one node id per line)"


def file_stamp(path: Path) -> Optional[list[int]]:
    """``[size, st_mtime_ns, st_ctime_ns, st_ino]`` of ``path``, or ``None`` where it does not exist.

    A cache keyed on this stamp is rebuilt whenever the file may have changed, without reading it (a full
    hash of gigabytes of ``.csv.gz`` would take minutes on every start). The inode change time ``st_ctime``
    is what no user tool can set back: the kernel sets it to the current time on every write, ``chmod``,
    rename and ``utime`` of the inode, and there is no system call to choose it (``utimensat``, used by
    ``touch -d``, ``cp -p`` and ``rsync -t``, sets only the access and modification times -- and thereby
    moves ``st_ctime`` to now). A copy is a new inode with a fresh ``st_ctime``; a rewrite in place keeps
    the inode but moves ``st_ctime``. So a file rewritten with the same size and a restored ``st_mtime``
    still gets a new stamp. Limits: changing the system clock, or editing the disk under the file system,
    could; and a rebuild happens also when nothing changed but the inode did (``chmod``, moving the
    folder), which is the safe side.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _find_split(root: Path, split: Optional[str]) -> str:
    """The split folder to use, checked to hold its three files; errors say what the layout should be."""
    split_root = root / "split"
    if not split_root.is_dir():
        raise FileNotFoundError(f"{split_root} not found: an OGB node dataset folder holds its splits as {_SPLIT_LAYOUT}")
    splits = sorted(p.name for p in split_root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not splits:
        raise FileNotFoundError(
            f"{split_root} holds no split folder: expected {_SPLIT_LAYOUT}, e.g. split/random/train.csv.gz"
        )
    if split is None:
        if len(splits) != 1:
            raise ValueError(f"{split_root} holds {len(splits)} splits {splits}: choose one with `split`")
        split = splits[0]
    if split not in splits:
        raise ValueError(f"split {split!r} not found under {split_root}; available: {splits}")
    missing = [name for name in _SPLIT_FILES.values() if not (split_root / split / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{split_root / split} lacks {', '.join(missing)}: a split folder holds train.csv.gz, valid.csv.gz and"
            " test.csv.gz (one node id per line)"
        )
    return split


def _first_bad_row(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad.reshape(bad.shape[0], -1).any(axis=1))[0])


class OGBNodeDataset(CachedNodeDataset):
    """An ``ogbn-*`` dataset from a local folder in OGB's layout (see the module docstring).

    The cache directory is keyed on the arguments and on a stamp of every input file (:func:`file_stamp`:
    size, modification and inode change time in nanoseconds, inode), so a changed file is converted again.

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
        for name in _REQUIRED:
            if not (self.raw / name).is_file():
                raise FileNotFoundError(
                    f"{self.raw / name} not found: `root` must be an OGB node dataset folder holding raw/ and split/"
                )
        split = _find_split(self.root, split)
        if feature_dtype not in ("float32", "float16"):
            raise ValueError(f"feature_dtype must be 'float32' or 'float16', got {feature_dtype!r}")
        self.split = split
        self.add_inverse_edges = add_inverse_edges
        self.feature_dtype = feature_dtype
        self._num_classes = num_classes
        inputs = [self.raw / name for name in _REQUIRED + _OPTIONAL]
        inputs += [self._split_file(name) for name in _SPLIT_FILES]
        self.config: dict[str, Any] = dict(
            root=str(self.root),
            inputs={str(path.relative_to(self.root)): file_stamp(path) for path in inputs},
            split=split,
            add_inverse_edges=add_inverse_edges,
            feature_dtype=feature_dtype,
            version=3,
        )
        cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
        self.cache = ArrayCache(cache_root / f"ogb-{self.root.name}-{config_key(self.config)}")

    @property
    def num_features(self) -> int:
        return first_row_width(self.raw / "node-feat.csv.gz")

    @property
    def num_classes(self) -> int:
        if self._num_classes is None:
            if self.cache.exists():
                self._num_classes = int(self.cache.meta()["num_classes"])
            else:
                self._num_classes = int(self._read_labels().max(initial=-1)) + 1
        return self._num_classes

    def prepare(self) -> None:
        """Convert the folder into the cache if no cache matches the files; warn about caches this replaced."""
        if self.cache.exists():
            return
        super().prepare()
        stale = self._stale_caches()
        if stale:
            size = sum(f.stat().st_size for d in stale for f in d.rglob("*") if f.is_file())
            warnings.warn(
                f"the files under {self.root} changed, so they were converted again into {self.cache.path}; older "
                f"caches of this folder are no longer used: {', '.join(str(d) for d in stale)} ({size / 2**30:.2f} GiB"
                " in all): delete them to free the space",
                stacklevel=2,
            )

    def _stale_caches(self) -> list[Path]:
        """Complete caches of this folder built from other versions of its files (another raw file, or another
        version of this split's files), with their node-order caches."""
        ours = self.config["inputs"]
        found: list[Path] = []
        for path in sorted(self.cache.path.parent.glob(f"ogb-{self.root.name}-*")):
            if path == self.cache.path or "-order-" in path.name or not ArrayCache(path).exists():
                continue
            try:
                meta = ArrayCache(path).meta()
            except ValueError:
                continue
            theirs = meta.get("inputs")
            if meta.get("root") != str(self.root) or not isinstance(theirs, dict):
                continue
            same_split = meta.get("split") == self.split
            if any(theirs.get(name) != stamp for name, stamp in ours.items() if same_split or name.startswith("raw/")):
                found.append(path)
                found += sorted(path.parent.glob(f"{path.name}-order-*"))
        return found

    def split_source(self, split: str) -> str:
        """The split's file, e.g. ``<root>/split/random/train.csv.gz``."""
        return str(self._split_file(split))

    def _split_file(self, split: str) -> Path:
        return self.root / "split" / self.split / _SPLIT_FILES[split]

    def _write(self, out: Path) -> dict[str, Any]:
        y = self._read_labels()
        num_nodes, nodes_from = self._num_nodes(default=y.shape[0])
        if y.shape[0] != num_nodes:
            raise DatasetFileError(
                self.raw / "node-label.csv.gz", f"has {y.shape[0]:,} rows, but {nodes_from} (one label per node)"
            )
        np.save(out / "y.npy", y)

        edges = self._read_edges(num_nodes, nodes_from)
        edge_attr = self._read_edge_attr(edges.shape[1])
        if self.add_inverse_edges:
            edges = np.concatenate([edges, edges[::-1]], axis=1)
            edge_attr = np.concatenate([edge_attr, edge_attr]) if edge_attr is not None else None
        np.save(out / "edge_index.npy", np.ascontiguousarray(edges))
        if edge_attr is not None:
            np.save(out / "edge_attr.npy", edge_attr)
        del edges, edge_attr

        convert_csv_to_npy(
            self.raw / "node-feat.csv.gz",
            out / "x.npy",
            num_nodes,
            self.feature_dtype,
            "ogb: node features",
            what=f"rows, one per node ({nodes_from})",
        )
        for ours in _SPLIT_FILES:
            path = self._split_file(ours)
            idx = read_csv_matrix(path, np.int64, f"ogb: {path.name}", width=1)[:, 0]
            save_npy(torch.from_numpy(np.ascontiguousarray(idx)), out / f"{ours}_idx.npy")
        num_classes = self._num_classes if self._num_classes is not None else int(y.max(initial=-1)) + 1
        return dict(self.config, num_nodes=num_nodes, num_classes=num_classes)

    def _read_labels(self) -> np.ndarray:
        """``node-label.csv.gz`` as int64, ``nan`` (unlabeled) as ``-1``; other labels must be integers >= 0."""
        path = self.raw / "node-label.csv.gz"
        labels = read_csv_matrix(path, np.float64, "ogb: labels", width=1)[:, 0]
        labeled = ~np.isnan(labels)
        bad = labeled & ~((labels >= 0) & (labels == np.round(labels)) & np.isfinite(labels))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DatasetFileError(
                path, f"label {float(labels[row]):g} is not a class: labels are integers >= 0, or nan for an unlabeled node", line=row + 1
            )
        return np.where(labeled, labels, -1).astype(np.int64)

    def _read_edges(self, num_nodes: int, nodes_from: str) -> np.ndarray:
        """``edge.csv.gz`` as an int64 ``[2, num_edges]`` array, every id checked against ``num_nodes``."""
        path = self.raw / "edge.csv.gz"
        edges = read_csv_matrix(path, np.int64, "ogb: edges", width=2)
        if edges.size and (int(edges.min()) < 0 or int(edges.max()) >= num_nodes):
            row = _first_bad_row((edges < 0) | (edges >= num_nodes))
            value = next(int(v) for v in edges[row] if not 0 <= v < num_nodes)
            raise DatasetFileError(
                path, f"node id {value} is out of range: the graph has {num_nodes:,} nodes ({nodes_from})", line=row + 1
            )
        check_count(path, edges.shape[0], self.raw / EDGE_COUNT_FILE, "edges (lines)")  # emptied or cut short
        return edges.T

    def _read_edge_attr(self, num_edges: int) -> Optional[np.ndarray]:
        path = self.raw / "edge-feat.csv.gz"
        if not path.is_file():
            return None
        edge_attr = read_csv_matrix(path, np.float32, "ogb: edge features")
        if edge_attr.shape[0] != num_edges:
            raise DatasetFileError(
                path, f"has {edge_attr.shape[0]:,} rows, but edge.csv.gz has {num_edges:,} edges (one row per edge)"
            )
        return edge_attr

    def _num_nodes(self, default: int) -> tuple[int, str]:
        """The number of nodes and where it came from (for messages)."""
        count = read_count(self.raw / NODE_COUNT_FILE)
        if count is None:
            return default, f"node-label.csv.gz has {default:,} rows"
        return count, f"{NODE_COUNT_FILE} says {count:,}"


__all__: list[str] = ["OGBNodeDataset", "file_stamp", "read_csv_matrix", "convert_csv_to_npy"]
