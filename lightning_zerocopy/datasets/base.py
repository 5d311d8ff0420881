"""The dataset contract (:class:`GraphDataset`), the node-classification one, and the on-disk cache of every dataset.

Every dataset, node or link, untyped or typed, is a :class:`GraphDataset`: cheap shape properties right after
``__init__`` (so LightningCLI can link them into the model), a one-time :meth:`GraphDataset.prepare` (called from
``LightningDataModule.prepare_data``, one process per machine) and :meth:`GraphDataset.load`. Its arrays are a graph
half (untyped :class:`GraphSizes`, typed ``TypedGraphViews``) and a task half (:class:`NodeSplits`, or the link
splits), checked by the functions here (:func:`check_edge_index`, :func:`check_edge_attr`), and, in every data class,
the graph's other node- and edge-level tensors for the batches (``attributes``:
:mod:`~lightning_zerocopy.datasets.attributes`). A :class:`NodeDataset` (``num_features``, ``num_classes``) returns a
:class:`NodeData`.

Cached arrays are ``.npy`` files in one directory per dataset configuration, written to a temporary
directory and renamed into place, so a reader never sees a half-written cache and concurrent builders
(several machines on a shared file system) do not corrupt each other. Large arrays are opened
memory-mapped copy-on-write: nothing is read until it is touched and nothing is ever written back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch
from tqdm.auto import tqdm

from lightning_zerocopy.datasets.cache_builds import build_folder, sweep_abandoned_builds
from lightning_zerocopy.datasets.fingerprint import FINGERPRINT_KEY, changed_file, fingerprint_folder
from lightning_zerocopy.graph.shared_memory import open_npy_memmap, save_npy

#: Environment variable that overrides the default cache root.
CACHE_ENV = "LIGHTNING_ZEROCOPY_CACHE"

_SPLITS = ("train", "val", "test")


class InputDataError(ValueError):
    """The dataset's content cannot be trained on (a damaged file, a bad split, a label or feature value); the
    message names where, and what to change. The ``lightning-zerocopy`` command prints it as one line (exit 2)."""


def out_of_range_edge(edge_index: torch.Tensor, num_nodes: int, rows: str = "the features have") -> Optional[str]:
    """What is wrong with the first node id of ``edge_index`` (edge after edge) outside ``[0, num_nodes)``, or
    ``None`` when every id is in range (``rows``: what has ``num_nodes`` rows, for the message). Reads ``edge_index``
    once (a memory-mapped one in chunks of columns)."""
    chunk = 1 << 24
    for start in range(0, int(edge_index.shape[1]), chunk):
        part = edge_index[:, start : start + chunk]
        bad = (part < 0) | (part >= num_nodes)
        if bool(bad.any()):
            column = int(bad.any(0).nonzero()[0])
            row = 0 if bool(bad[0, column]) else 1
            return (
                f"edge_index holds node id {int(part[row, column])} at edge_index[{row}, {start + column}] (a "
                f"{('source', 'destination')[row]}), but {rows} {num_nodes:,} rows (node ids 0 to "
                f"{num_nodes - 1:,})"
            )
    return None


class DatasetFileError(InputDataError):
    """An input file of a dataset cannot be used; the message names the file (and the line, where known).

    Attributes:
        path: the file.
        line: the 1-based line number, or ``None`` where the reader does not know it.
        problem: what is wrong, without the location.
    """

    def __init__(self, path: "os.PathLike[str] | str", problem: str, line: Optional[int] = None) -> None:
        self.path = Path(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}, line {line:,}" if line is not None else str(self.path)
        super().__init__(f"{where}: {problem}")


def progress_bar(total: int, desc: str, unit: str) -> tqdm:
    """The datasets' progress bar: shown only for steps that take more than a second, removed when done."""
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, delay=1.0, leave=False)


def default_cache_root() -> Path:
    """``$LIGHTNING_ZEROCOPY_CACHE`` if set, else ``~/.cache/lightning_zerocopy``."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "lightning_zerocopy")).expanduser()


class GraphSizes:
    """``num_nodes``, ``num_edges`` and ``num_features`` of ``x`` and ``edge_index``: the graph half of
    :class:`NodeData` and ``LinkData`` (the typed graphs' is ``TypedGraphViews``)."""

    x: torch.Tensor
    edge_index: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])


def check_edge_index(index: torch.Tensor, name: str = "edge_index") -> None:
    """``index`` (named ``name`` in the :class:`InputDataError`) is an int64 ``[2, E]`` tensor of node ids (a float
    id would be truncated, 2.5 -> node 2, further on)."""
    if index.dim() != 2 or index.shape[0] != 2:
        raise InputDataError(f"{name} must have shape [2, num_edges], got {tuple(index.shape)}")
    if index.dtype != torch.int64:
        raise InputDataError(f"{name} must be an int64 tensor of node ids, got {index.dtype}")


def check_edge_attr(edge_attr: Optional[torch.Tensor], edge_index: torch.Tensor) -> None:
    """``edge_attr`` (where given) has one row per edge of ``edge_index``."""
    if edge_attr is not None and edge_attr.shape[0] != edge_index.shape[1]:
        raise InputDataError(f"edge_attr has {edge_attr.shape[0]} rows but edge_index has {edge_index.shape[1]} edges")


class NodeSplits:
    """The task half of :class:`NodeData` and ``HeteroNodeData``: labels and ``train``/``val``/``test`` node ids."""

    y: torch.Tensor
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor

    def split(self, name: str) -> torch.Tensor:
        """Node ids of split ``name``: ``"train"``, ``"val"`` or ``"test"``."""
        if name not in _SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {_SPLITS}")
        return getattr(self, f"{name}_idx")

    def _check_split_ids(self, ids: str) -> None:
        """Each split is a 1-D int64 tensor (of ``ids``, for the message: ``"node ids"``, ``"'paper' ids"``)."""
        for name in ("train_idx", "val_idx", "test_idx"):
            idx = getattr(self, name)
            if idx.dim() != 1 or idx.dtype != torch.int64:
                raise InputDataError(f"{name} must be a 1-D int64 tensor of {ids}, got {idx.dtype} {tuple(idx.shape)}")


@dataclass
class NodeData(GraphSizes, NodeSplits):
    """A homogeneous graph for node classification, held on the host.

    Attributes:
        edge_index: int64 ``[2, num_edges]``; messages flow ``edge_index[0] -> edge_index[1]`` (PyG).
        x: floating ``[num_nodes, num_features]`` node features; may be backed by a memory-mapped file.
        y: int64 ``[num_nodes]`` class labels; ``-1`` marks an unlabeled node.
        train_idx: int64 ids of the training nodes.
        val_idx: int64 ids of the validation nodes.
        test_idx: int64 ids of the test nodes.
        edge_attr: optional ``[num_edges, ...]`` edge features, row ``i`` belonging to ``edge_index[:, i]``.
        x_file: the ``.npy`` file ``x`` is mapped from, if any (lets every process map the same file instead
            of copying the features into shared memory).
        attributes: the graph's other node- and edge-level tensors, which reach the batches
            (:mod:`~lightning_zerocopy.datasets.attributes`: ``AttributeKey -> Attribute``), or ``None``.
    """

    edge_index: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    edge_attr: Optional[torch.Tensor] = None
    x_file: Optional[str] = None
    attributes: Optional[dict[Any, Any]] = None

    def __post_init__(self) -> None:
        """Shapes and dtypes; a mismatch is the dataset's content, so an :class:`InputDataError`."""
        check_edge_index(self.edge_index)
        if self.x.dim() != 2:
            raise InputDataError(f"x must have shape [num_nodes, num_features], got {tuple(self.x.shape)}")
        if self.y.shape != (self.x.shape[0],):
            raise InputDataError(f"y must have shape [num_nodes] = [{self.x.shape[0]}], got {tuple(self.y.shape)}")
        check_edge_attr(self.edge_attr, self.edge_index)
        self._check_split_ids("node ids")


class GraphDataset(ABC):
    """A dataset that LightningCLI can build from ``class_path``/``init_args`` (see the module docstring); the task's
    contract adds the cheap shape properties: :class:`NodeDataset`, ``LinkDataset``, ``HeteroNodeDataset``,
    ``HeteroLinkDataset``."""

    #: How :meth:`split_source` names a split: node ids (``"split"``) or supervision edges (``"link split"``).
    _split_noun = "split"

    def prepare(self) -> None:
        """Build or convert the dataset into its cache. Safe to call more than once; the default does nothing."""

    def split_source(self, split: str) -> str:
        """Where split ``split`` (``"train"``, ``"val"`` or ``"test"``) comes from, for error messages: a file, an
        attribute, a generator. The default names the dataset class."""
        return f"the {split} {self._split_noun} of {type(self).__name__}"

    @abstractmethod
    def load(self) -> Any:
        """Return the dataset's arrays (memory-mapped where large), preparing them first if needed."""


class NodeDataset(GraphDataset):
    """A node-classification dataset (:class:`GraphDataset`): :attr:`num_features` and :attr:`num_classes` (cheap),
    :meth:`load` returns a :class:`NodeData`."""

    @property
    @abstractmethod
    def num_features(self) -> int:
        """Width of the node feature matrix."""

    @property
    @abstractmethod
    def num_classes(self) -> int:
        """Number of classes of ``y``."""

    @abstractmethod
    def load(self) -> NodeData:
        """Return the dataset's arrays (memory-mapped where large), preparing them first if needed."""


# ---------------------------------------------------------------------------------------------------------
# On-disk cache of named arrays


def config_key(config: dict[str, Any]) -> str:
    """A short stable hash of a JSON-serialisable configuration, used to name its cache directory."""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class ArrayCache:
    """A directory of ``.npy`` arrays plus ``meta.json``, complete once ``meta.json`` exists.

    Args:
        path: the cache directory, e.g. ``<cache root>/synthetic-<config key>``.
    """

    META = "meta.json"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def exists(self) -> bool:
        return (self.path / self.META).is_file()

    def meta(self) -> dict[str, Any]:
        path = self.path / self.META
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DatasetFileError(path, f"is not valid JSON ({exc}): {self._damaged}") from exc

    @property
    def _damaged(self) -> str:
        return f"the cache {self.path} is damaged; delete that directory and it is built again"

    def build(self, write: Callable[[Path], dict[str, Any]]) -> None:
        """Run ``write(tmp_dir) -> meta`` into a temporary directory, then move it into place atomically.

        Does nothing if the cache is already complete. If another process finished first, its result is
        kept and this one's is discarded.
        """
        if self.exists():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sweep_abandoned_builds(self.path)  # the temporary folders of killed builds of this cache
        tmp = build_folder(self.path)
        try:
            meta = write(tmp)
            meta = {**meta, FINGERPRINT_KEY: fingerprint_folder(tmp)}  # checked when a file is opened
            with open(tmp / self.META, "w", encoding="utf-8") as f:
                json.dump(meta, f, indent=2, sort_keys=True)
            try:
                os.rename(tmp, self.path)
            except OSError:
                if not self.exists():  # not a lost race: a stale incomplete directory is in the way
                    shutil.rmtree(self.path, ignore_errors=True)
                    os.rename(tmp, self.path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def file(self, name: str) -> Path:
        return self.path / f"{name}.npy"

    def tensor(self, name: str) -> torch.Tensor:
        """Array ``name`` as a tensor over a copy-on-write memory map (nothing is read until touched).

        Raises:
            DatasetFileError: the file is missing, truncated, not an ``.npy`` file, or no longer matches the
                fingerprint recorded at build (:mod:`~lightning_zerocopy.datasets.fingerprint`); the message says to
                delete the cache directory.
        """
        path = self.verify(name)
        try:
            return open_npy_memmap(path)
        except (ValueError, OSError, EOFError) as exc:
            raise DatasetFileError(path, f"cannot be opened ({exc}): {self._damaged}") from exc

    def verify(self, name: str) -> Path:
        """The file of array ``name``, checked against the fingerprint its build recorded (caches built before
        fingerprints existed have none: only its presence is checked).

        Raises:
            DatasetFileError: the file is missing or has changed since the build (naming it and the fix).
        """
        path = self.file(name)
        if not path.is_file():
            raise DatasetFileError(path, f"is missing: {self._damaged}")
        changed = changed_file(path, self.meta().get(FINGERPRINT_KEY, {}).get(path.name))
        if changed is not None:
            raise DatasetFileError(path, f"{changed}: {self._damaged}")
        return path

    def has(self, name: str) -> bool:
        return self.file(name).is_file()


def keyed_cache(root: Optional[str | Path], name: str, config: dict[str, Any]) -> ArrayCache:
    """The :class:`ArrayCache` ``<root>/<name>-<config_key(config)>`` (``root`` ``None``: :func:`default_cache_root`)."""
    base = Path(root).expanduser() if root is not None else default_cache_root()
    return ArrayCache(base / f"{name}-{config_key(config)}")


class BuiltIntoCache(GraphDataset):
    """A dataset built once into an :class:`ArrayCache` (``self.cache``, set in ``__init__``) by :meth:`_write` and
    opened from it afterwards by :meth:`_open` (each cached contract names the reader of its layout)."""

    cache: ArrayCache

    @abstractmethod
    def _write(self, out: Path) -> dict[str, Any]:
        """Write the dataset's ``.npy`` arrays into ``out``; return the metadata stored with them."""

    @staticmethod
    @abstractmethod
    def _open(cache: ArrayCache) -> Any:
        """The dataset's arrays, opened from a complete ``cache``."""

    def prepare(self) -> None:
        self.cache.build(self._write)

    def load(self) -> Any:
        self.prepare()
        return self._open(self.cache)


def node_data_from_cache(cache: ArrayCache) -> NodeData:
    """Open the standard array names (``edge_index``, ``x``, ``y``, ``*_idx``, optional ``edge_attr``)."""
    optional = {"edge_attr"}
    names = {f.name for f in fields(NodeData)} - {"x_file", "attributes"}
    arrays = {name: cache.tensor(name) for name in names if name not in optional or cache.has(name)}
    return NodeData(**arrays, x_file=str(cache.file("x")))


def write_labels_and_splits(out: Path, y: torch.Tensor, splits: Mapping[str, torch.Tensor]) -> None:
    """Save the labels (of the input type, in a typed cache) and the ``train_idx``/``val_idx``/``test_idx`` arrays
    into ``out``: the node task's arrays of every node cache, untyped and typed."""
    save_npy(y.to(torch.int64).contiguous(), out / "y.npy")
    for name in ("train_idx", "val_idx", "test_idx"):
        save_npy(splits[name].to(torch.int64).contiguous(), out / f"{name}.npy")


class CachedNodeDataset(BuiltIntoCache, NodeDataset):
    """A :class:`NodeDataset` built once into an :class:`ArrayCache` and memory-mapped from it afterwards.

    Subclasses set ``self.cache`` in ``__init__`` and implement :meth:`_write`, which writes the standard
    array names (see :func:`node_data_from_cache`) into a directory and returns the cache's metadata.
    """

    _open = staticmethod(node_data_from_cache)
