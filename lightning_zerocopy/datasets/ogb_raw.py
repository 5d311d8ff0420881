"""The ``raw/`` folder of an OGB dataset (``ogbn-*`` and ``ogbl-*`` alike), read without the ``ogb`` package.

Shared by :class:`~lightning_zerocopy.datasets.OGBNodeDataset` and
:class:`~lightning_zerocopy.datasets.OGBLinkDataset`::

    raw/edge.csv.gz             one "src,dst" line per edge
    raw/node-feat.csv.gz        one comma-separated feature row per node
    raw/num-node-list.csv.gz    the number of nodes (OGB's count file)
    raw/num-edge-list.csv.gz    the number of lines of edge.csv.gz (OGB's count file)
    raw/edge-feat.csv.gz        optional: one feature row per edge

Counts are checked against OGB's own count files, and a disagreement names the file that disagrees. Also here:
the cache stamps of the input files (:func:`file_stamp`) and the warning about caches that changed files replaced.
"""

from __future__ import annotations

import os
import warnings
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from lightning_zerocopy.datasets.base import ArrayCache, DatasetFileError, keyed_cache, write_labels_and_splits
from lightning_zerocopy.datasets.csv_gz import first_row_width
from lightning_zerocopy.datasets.csv_gz import convert_csv_to_npy, read_csv_matrix
from lightning_zerocopy.datasets.ogb_counts import EDGE_COUNT_FILE, check_count

__all__ = [
    "ConvertedOnce",
    "OGBFolder",
    "OGBLabels",
    "check_feature_dtype",
    "choose_split",
    "file_stamp",
    "find_split",
    "read_edge_attr",
    "read_edges",
    "read_labels",
    "stale_caches",
    "warn_stale_caches",
]


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


def find_split(root: Path, split: Optional[str], files: dict[str, str], layout: str, kind: str) -> str:
    """The subfolder of ``root/split`` to use, checked to hold its three ``files``; errors say what ``layout`` is.

    Args:
        split: the folder asked for; ``None``: the only one present.
        files: the split files by split name (``{"train": "train.csv.gz", ...}``).
        layout: how a split folder looks, for the messages.
        kind: ``"node"`` or ``"link"``, for the messages.
    """
    split_root = root / "split"
    if not split_root.is_dir():
        raise FileNotFoundError(f"{split_root} not found: an OGB {kind} dataset folder holds its splits as {layout}")
    if not any(p.is_dir() and not p.name.startswith(".") for p in split_root.iterdir()):
        example = next(iter(files.values()))
        raise FileNotFoundError(f"{split_root} holds no split folder: expected {layout}, e.g. split/random/{example}")
    split = choose_split(split_root, split)
    missing = [name for name in files.values() if not (split_root / split / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{split_root / split} lacks {', '.join(missing)}: expected {layout}")
    return split


def choose_split(split_root: Path, split: Optional[str]) -> str:
    """``split`` (``None``: the only one) among the folders of ``split_root``; a ``ValueError`` naming those there
    are."""
    splits = sorted(p.name for p in split_root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if split is None:
        if len(splits) != 1:
            raise ValueError(f"{split_root} holds {len(splits)} splits {splits}: choose one with `split`")
        split = splits[0]
    if split not in splits:
        raise ValueError(f"split {split!r} not found under {split_root}; available: {splits}")
    return split


def check_feature_dtype(feature_dtype: str) -> str:
    """``feature_dtype`` if the converted features can take it (``"float32"``, ``"float16"``), else a ``ValueError``."""
    if feature_dtype not in ("float32", "float16"):
        raise ValueError(f"feature_dtype must be 'float32' or 'float16', got {feature_dtype!r}")
    return feature_dtype


def _first_bad_row(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad.reshape(bad.shape[0], -1).any(axis=1))[0])


def read_edges(raw: Path, num_nodes: int, nodes_from: str) -> np.ndarray:
    """``raw/edge.csv.gz`` as an int64 ``[2, num_edges]`` array, every id checked against ``num_nodes``, the count
    against ``raw/num-edge-list.csv.gz`` where present.

    Args:
        nodes_from: where ``num_nodes`` came from, for the messages (``"num-node-list.csv.gz says 2,000"``).

    Raises:
        DatasetFileError: a malformed line, an id out of range, or a count other than OGB's count file's.
    """
    path = raw / "edge.csv.gz"
    edges = read_csv_matrix(path, np.int64, "ogb: edges", width=2)
    if edges.size and (int(edges.min()) < 0 or int(edges.max()) >= num_nodes):
        row = _first_bad_row((edges < 0) | (edges >= num_nodes))
        value = next(int(v) for v in edges[row] if not 0 <= v < num_nodes)
        raise DatasetFileError(
            path, f"node id {value} is out of range: the graph has {num_nodes:,} nodes ({nodes_from})", line=row + 1
        )
    check_count(path, edges.shape[0], raw / EDGE_COUNT_FILE, "edges (lines)")  # emptied or cut short
    return edges.T


def read_edge_attr(raw: Path, num_edges: int) -> Optional[np.ndarray]:
    """``raw/edge-feat.csv.gz`` as float32 ``[num_edges, width]``, or ``None`` where the folder has none."""
    path = raw / "edge-feat.csv.gz"
    if not path.is_file():
        return None
    edge_attr = read_csv_matrix(path, np.float32, "ogb: edge features")
    if edge_attr.shape[0] != num_edges:
        raise DatasetFileError(
            path, f"has {edge_attr.shape[0]:,} rows, but edge.csv.gz has {num_edges:,} edges (one row per edge)"
        )
    return edge_attr


def stale_caches(cache: ArrayCache, pattern: str, root: Path, inputs: dict, split: str) -> list[Path]:
    """Complete caches matching ``pattern`` (a glob beside ``cache``) of the folder ``root`` built from other
    versions of its files (another raw file, or another version of this split's files), with their node-order
    caches."""
    found: list[Path] = []
    for path in sorted(cache.path.parent.glob(pattern)):
        if path == cache.path or "-order-" in path.name or not ArrayCache(path).exists():
            continue
        try:
            meta = ArrayCache(path).meta()
        except ValueError:
            continue
        theirs = meta.get("inputs")
        if meta.get("root") != str(root) or not isinstance(theirs, dict):
            continue
        same_split = meta.get("split") == split
        if any(theirs.get(name) != stamp for name, stamp in inputs.items() if same_split or name.startswith("raw/")):
            found.append(path)
            found += sorted(path.parent.glob(f"{path.name}-order-*"))
    return found


def warn_stale_caches(root: Path, cache: ArrayCache, stale: list[Path]) -> None:
    """Warn that the files under ``root`` changed and ``stale`` caches are no longer used (their size in GiB)."""
    if not stale:
        return
    size = sum(f.stat().st_size for d in stale for f in d.rglob("*") if f.is_file())
    warnings.warn(
        f"the files under {root} changed, so they were converted again into {cache.path}; older "
        f"caches of this folder are no longer used: {', '.join(str(d) for d in stale)} ({size / 2**30:.2f} GiB"
        " in all): delete them to free the space",
        stacklevel=3,
    )


def read_labels(path: Path) -> np.ndarray:
    """An OGB ``node-label.csv.gz`` as int64, ``nan`` (unlabeled) as ``-1``.

    Raises:
        DatasetFileError: a label that is not an integer >= 0 (naming the line).
    """
    labels = read_csv_matrix(path, np.float64, "ogb: labels", width=1)[:, 0]
    labeled = ~np.isnan(labels)
    bad = labeled & ~((labels >= 0) & (labels == np.round(labels)) & np.isfinite(labels))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DatasetFileError(path, f"label {float(labels[row]):g} is not a class: labels are integers >= 0, or nan "
                                     "for an unlabeled node", line=row + 1)  # fmt: skip
    return np.where(labeled, labels, -1).astype(np.int64)


class ConvertedOnce:
    """The cache half of every OGB folder dataset (node, link, typed): ``prepare`` converts the folder only where no
    cache matches its files' stamps (``config["inputs"]``), then warns about the caches of this folder that changed
    files replaced.

    Mixed in before the cached dataset base class, whose ``prepare`` builds the cache.
    """

    root: Path
    split: str
    config: dict[str, Any]
    cache: ArrayCache
    _cache_name: str

    def _key_cache(self, inputs: list[Path], cache_name: str, cache_dir: Optional[str], **settings: Any) -> None:
        """Set ``config`` (``root``, the stamps of the ``inputs`` files, ``split`` and ``settings``) and key the cache
        ``<cache_name>-<root name>-<key>`` on it."""
        self.config = dict(
            root=str(self.root),
            inputs={str(path.relative_to(self.root)): file_stamp(path) for path in inputs},
            split=self.split,
            **settings,
        )
        self._cache_name = f"{cache_name}-{self.root.name}"
        self.cache = keyed_cache(cache_dir, self._cache_name, self.config)

    def prepare(self) -> None:
        """Convert the folder into the cache if no cache matches the files; warn about caches this replaced."""
        if self.cache.exists():
            return
        super().prepare()  # type: ignore[misc]  # the cached dataset base class builds the cache
        stale = stale_caches(self.cache, f"{self._cache_name}-*", self.root, self.config["inputs"], self.split)
        warn_stale_caches(self.root, self.cache, stale)


class OGBLabels(ABC):
    """The labels half of the OGB node datasets (untyped and typed): ``num_classes`` from the ``num_classes``
    argument, else the cache's metadata, else the label file (``_label_file()``) read once; and the conversion of
    the labels and the split files (``_split_file(split)``) into the cache."""

    cache: ArrayCache
    _num_classes: Optional[int]

    @abstractmethod
    def _label_file(self) -> Path:
        """The ``node-label.csv.gz`` of the labelled type."""

    @property
    def num_classes(self) -> int:
        if self._num_classes is None:
            if self.cache.exists():
                self._num_classes = int(self.cache.meta()["num_classes"])
            else:
                self._num_classes = int(self._read_labels().max(initial=-1)) + 1
        return self._num_classes

    @abstractmethod
    def _split_file(self, split: str) -> Path:
        """The file of ``split``'s ids (one per line)."""

    def _read_labels(self) -> np.ndarray:
        return read_labels(self._label_file())

    def _write_node_task(self, out: Path, y: np.ndarray) -> int:
        """Save the labels ``y`` and the split files' ids into ``out``
        (:func:`~lightning_zerocopy.datasets.base.write_labels_and_splits`); return the number of classes."""
        splits = {}
        for split in ("train", "val", "test"):
            path = self._split_file(split)
            idx = read_csv_matrix(path, np.int64, f"ogb: {path.name}", width=1)[:, 0]
            splits[f"{split}_idx"] = torch.from_numpy(np.ascontiguousarray(idx))
        write_labels_and_splits(out, torch.from_numpy(y), splits)
        return self._num_classes if self._num_classes is not None else int(y.max(initial=-1)) + 1


class OGBFolder(ConvertedOnce):
    """The folder half of :class:`~lightning_zerocopy.datasets.OGBNodeDataset` and
    :class:`~lightning_zerocopy.datasets.OGBLinkDataset`: the checked ``raw/`` files, the ``split/`` subfolder and
    the cache keyed on a stamp of every input file (:class:`ConvertedOnce`).
    """

    raw: Path
    feature_dtype: str
    add_inverse_edges: bool
    _split_files: dict[str, str]

    def _open_folder(
        self,
        root: str,
        split: Optional[str],
        kind: str,
        required: tuple[str, ...],
        optional: tuple[str, ...],
        split_files: dict[str, str],
        layout: str,
        feature_dtype: str,
        cache_name: str,
        cache_dir: Optional[str],
        missing_notes: Optional[dict[str, str]] = None,
        **settings: Any,
    ) -> None:
        """Check the folder, find the split and key the cache ``<cache_name>-<root name>-<key>`` on ``settings``
        (with the root, the input files' stamps, the split and ``feature_dtype``)."""
        self.root = Path(root).expanduser().resolve()
        self.raw = self.root / "raw"
        for name in required:
            if not (self.raw / name).is_file():
                raise FileNotFoundError(
                    f"{self.raw / name} not found: `root` must be an OGB {kind} dataset folder holding raw/ and split/"
                    f"{(missing_notes or {}).get(name, '')}"
                )
        self._split_files = split_files
        self.split = find_split(self.root, split, split_files, layout, kind)
        self.feature_dtype = check_feature_dtype(feature_dtype)
        inputs = [self.raw / name for name in required + optional] + [self._split_file(s) for s in split_files]
        self._key_cache(inputs, cache_name, cache_dir, feature_dtype=feature_dtype, **settings)

    def _write_graph(self, out: Path, num_nodes: int, nodes_from: str, with_edge_attr: bool) -> int:
        """Convert ``raw/``'s edges (reversed too with ``add_inverse_edges``), edge features (with ``with_edge_attr``,
        where present) and node features into ``out``; return the number of edges."""
        edges = read_edges(self.raw, num_nodes, nodes_from)
        edge_attr = read_edge_attr(self.raw, edges.shape[1]) if with_edge_attr else None
        if self.add_inverse_edges:
            edges = np.concatenate([edges, edges[::-1]], axis=1)
            edge_attr = np.concatenate([edge_attr, edge_attr]) if edge_attr is not None else None
        np.save(out / "edge_index.npy", np.ascontiguousarray(edges))
        if edge_attr is not None:
            np.save(out / "edge_attr.npy", edge_attr)
        num_edges = int(edges.shape[1])
        del edges, edge_attr
        convert_csv_to_npy(self.raw / "node-feat.csv.gz", out / "x.npy", num_nodes, self.feature_dtype,
                           "ogb: node features", what=f"rows, one per node ({nodes_from})")  # fmt: skip
        return num_edges

    @property
    def num_features(self) -> int:
        return first_row_width(self.raw / "node-feat.csv.gz")

    def split_source(self, split: str) -> str:
        """The split's file, e.g. ``<root>/split/time/valid.pt``."""
        return str(self._split_file(split))

    def _split_file(self, split: str) -> Path:
        return self.root / "split" / self.split / self._split_files[split]
