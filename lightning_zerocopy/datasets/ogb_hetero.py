"""Heterogeneous OGB node-property-prediction datasets (``ogbn-mag``) read from a local folder (no download).

Reads the folder the ``ogb`` package unpacks, e.g. ``ogbn_mag/``::

    raw/num-node-dict.csv.gz                             a header line of node types, then a line of their counts
    raw/triplet-type-list.csv.gz                         optional: "src,rel,dst" per edge type (their order)
    raw/relations/<src>___<rel>___<dst>/edge.csv.gz      one "src,dst" line per edge (ids local to each type)
    raw/relations/<src>___<rel>___<dst>/num-edge-list.csv.gz   optional: the number of edges (checked)
    raw/relations/<src>___<rel>___<dst>/edge_reltype.csv.gz    optional: OGB's relation id per edge (not used)
    raw/node-feat/<type>/node-feat.csv.gz                one feature row per node of the types that have features
    raw/node-label/<type>/node-label.csv.gz              one label per node of the input type ("nan": unlabeled)
    split/<split>/<type>/{train,valid,test}.csv.gz       input-type ids of each split (ogbn-mag: split/time/paper)

Other files (``node_year``, ``edge_year``, ...) are ignored. The CSVs are converted once (with progress bars) into the
heterogeneous cache layout (:mod:`lightning_zerocopy.datasets.hetero_cache`) and memory-mapped afterwards; the
features are streamed row-chunk by row-chunk into their ``.npy``. Every edge's ids are checked against its types'
counts, each edge file's row count against its ``num-edge-list.csv.gz``, each feature and label file's against
``num-node-dict.csv.gz``; a problem is a :class:`~lightning_zerocopy.datasets.base.DatasetFileError` naming the file
(and line). The cache is keyed on a stamp of every input file, as for
:class:`~lightning_zerocopy.datasets.OGBNodeDataset`, so a changed file is converted again.

With ``add_reverse_edges`` the edge types get the reverse types PyG's ``ToUndirected`` adds (``paper__cites__paper``
made undirected, ``paper__rev_writes__author`` etc.; see
:func:`~lightning_zerocopy.datasets.hetero_cache.to_undirected_types`).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from lightning_zerocopy.datasets.base import DatasetFileError
from lightning_zerocopy.datasets.csv_gz import convert_csv_to_npy, first_row_width, read_csv_matrix
from lightning_zerocopy.datasets.hetero import EdgeType
from lightning_zerocopy.datasets.hetero_cache import (
    CachedHeteroNodeDataset,
    check_type_name,
    hetero_meta,
    with_reverse_types,
    write_edge_types,
    x_name,
)
from lightning_zerocopy.datasets.ogb_counts import EDGE_COUNT_FILE, check_count
from lightning_zerocopy.datasets.ogb_raw import ConvertedOnce, OGBLabels, check_feature_dtype, choose_split

__all__ = ["OGBHeteroNodeDataset", "read_num_node_dict"]

NODE_DICT_FILE = "num-node-dict.csv.gz"
TRIPLET_FILE = "triplet-type-list.csv.gz"
_SPLIT_FILES = {"train": "train.csv.gz", "val": "valid.csv.gz", "test": "test.csv.gz"}
_GET_IT = (
    "`root` must be the unpacked ogbn-mag folder (holding raw/ and split/), as the ogb package leaves it "
    "(ogb.nodeproppred.NodePropPredDataset(name='ogbn-mag', root=...) downloads and unpacks it; this class never "
    "downloads)"
)


def _missing(path: Path, what: str) -> DatasetFileError:
    return DatasetFileError(path, f"is missing ({what}): {_GET_IT}")


def _text_lines(path: Path) -> list[str]:
    """The lines of a small gzipped text file (a type list), stripped, without empty ones at the end."""
    try:
        with gzip.open(path, "rt", encoding="ascii") as f:
            lines = [line.strip() for line in f]
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as exc:
        raise DatasetFileError(path, f"cannot be read as gzipped text ({type(exc).__name__}: {exc}); copy or "
                                     "download the dataset again") from exc  # fmt: skip
    while lines and not lines[-1]:
        lines.pop()
    return lines


def read_num_node_dict(path: Path) -> dict[str, int]:
    """OGB's ``num-node-dict.csv.gz``: a header line of node type names, then one line of their node counts.

    Raises:
        DatasetFileError: not two lines, another number of counts than names, a count that is not an integer >= 0,
            or a type name that cannot be stored.
    """
    lines = _text_lines(path)
    if len(lines) != 2:
        raise DatasetFileError(path, f"has {len(lines)} lines: expected a header line of node types and a line of "
                                     "their node counts")  # fmt: skip
    names = [n.strip() for n in lines[0].split(",")]
    values = [v.strip() for v in lines[1].split(",")]
    if len(names) != len(values):
        raise DatasetFileError(path, f"names {len(names)} node types but gives {len(values)} counts", line=2)
    counts: dict[str, int] = {}
    for name, value in zip(names, values):
        try:
            check_type_name(name, "node type")
        except ValueError as exc:
            raise DatasetFileError(path, str(exc), line=1) from None
        try:
            count = int(float(value)) if float(value).is_integer() else -1
        except ValueError:
            count = -1
        if count < 0:
            raise DatasetFileError(path, f"the count of {name!r} is {value!r}: counts are integers >= 0", line=2)
        counts[name] = count
    return counts


class OGBHeteroNodeDataset(ConvertedOnce, OGBLabels, CachedHeteroNodeDataset):
    """A heterogeneous ``ogbn-*`` dataset (``ogbn-mag``) from a local folder in OGB's layout (see the module docstring).

    Args:
        root: the dataset folder holding ``raw/`` and ``split/`` (e.g. ``.../ogbn_mag``), or the folder above it
            (then ``<root>/<name with '_' for '-'>`` is used, as the ``ogb`` package names it).
        name: the dataset's name, e.g. ``"ogbn-mag"`` (names the cache and the subfolder above).
        split: the subfolder of ``split/`` to use (``time`` for ogbn-mag); default: the only one present.
        input_type: the node type with labels and splits; default: the only one under ``raw/node-label/``.
        add_reverse_edges: add reverse edge types as PyG's ``ToUndirected`` does (``cites`` made undirected).
        feature_dtype: dtype of the converted node features, ``"float32"`` or ``"float16"``.
        num_classes: number of classes; default: the largest label + 1.
        cache_dir: cache root (default ``$LIGHTNING_ZEROCOPY_CACHE`` or ``~/.cache/lightning_zerocopy``).
    """

    def __init__(
        self,
        root: str,
        name: str = "ogbn-mag",
        split: Optional[str] = None,
        input_type: Optional[str] = None,
        add_reverse_edges: bool = False,
        feature_dtype: str = "float32",
        num_classes: Optional[int] = None,
        cache_dir: Optional[str] = None,
    ) -> None:
        self.feature_dtype = check_feature_dtype(feature_dtype)
        folder = Path(root).expanduser().resolve()
        if not (folder / "raw").is_dir() and (folder / name.replace("-", "_") / "raw").is_dir():
            folder = folder / name.replace("-", "_")
        self.root = folder
        self.raw = folder / "raw"
        if not self.raw.is_dir():
            raise _missing(self.raw, f"the raw files of {name}")
        node_dict = self.raw / NODE_DICT_FILE
        if not node_dict.is_file():
            raise _missing(node_dict, "the node count of every node type")
        self._counts = read_num_node_dict(node_dict)
        self._edge_types = self._find_edge_types()
        self._input_type = self._find_input_type(input_type)
        self.split = self._find_split(split)
        self._featured = self._find_features()
        self._num_classes = num_classes
        self.add_reverse_edges = add_reverse_edges
        inputs = [node_dict, self._label_file()] + [self._relation(t) / "edge.csv.gz" for t in self._edge_types]
        inputs += [self._relation(t) / EDGE_COUNT_FILE for t in self._edge_types]
        inputs += [self._feature_file(t) for t in self._featured] + [self._split_file(s) for s in _SPLIT_FILES]
        if (self.raw / TRIPLET_FILE).is_file():
            inputs.append(self.raw / TRIPLET_FILE)
        self._key_cache(inputs, "ogb-hetero", cache_dir, name=name, input_type=self._input_type,
                        add_reverse_edges=add_reverse_edges, feature_dtype=feature_dtype, num_classes=num_classes,
                        version=1)  # fmt: skip

    # the folder ----------------------------------------------------------------------------------------------

    def _relation(self, edge_type: EdgeType) -> Path:
        return self.raw / "relations" / "___".join(edge_type)

    def _label_file(self) -> Path:
        return self.raw / "node-label" / self._input_type / "node-label.csv.gz"

    def _feature_file(self, node_type: str) -> Path:
        return self.raw / "node-feat" / node_type / "node-feat.csv.gz"

    def _split_file(self, split: str) -> Path:
        return self.root / "split" / self.split / self._input_type / _SPLIT_FILES[split]

    def _find_edge_types(self) -> list[EdgeType]:
        relations = self.raw / "relations"
        if not relations.is_dir():
            raise _missing(relations, "one folder <src>___<relation>___<dst> per edge type")
        triplets = self.raw / TRIPLET_FILE
        if triplets.is_file():
            found = []
            for line, text in enumerate(_text_lines(triplets), start=1):
                parts = tuple(p.strip() for p in text.split(","))
                if len(parts) != 3 or not all(parts):
                    raise DatasetFileError(triplets, f"{text!r} is not 'source type,relation,destination type'", line)
                found.append(parts)
        else:
            found = []
            for folder in sorted(p for p in relations.iterdir() if p.is_dir() and not p.name.startswith(".")):
                parts = tuple(folder.name.split("___"))
                if len(parts) != 3 or not all(parts):
                    raise DatasetFileError(folder, "is not named <source type>___<relation>___<destination type>: "
                                                   "rename or remove it")  # fmt: skip
                found.append(parts)
        if not found:
            raise DatasetFileError(relations, "holds no edge type folder <src>___<relation>___<dst>: " + _GET_IT)
        edge_types: list[EdgeType] = []
        for src, rel, dst in found:
            where = relations / "___".join((src, rel, dst))
            for node_type in (src, dst):
                if node_type not in self._counts:
                    raise DatasetFileError(where, f"names the node type {node_type!r}, which {NODE_DICT_FILE} does not "
                                                  f"count (node types: {', '.join(self._counts)})")  # fmt: skip
            try:
                check_type_name(rel, "relation")
            except ValueError as exc:
                raise DatasetFileError(where, str(exc)) from None
            if not (where / "edge.csv.gz").is_file():
                raise _missing(where / "edge.csv.gz", f"the edges of {src}__{rel}__{dst}")
            edge_types.append((src, rel, dst))
        return edge_types

    def _find_input_type(self, input_type: Optional[str]) -> str:
        labels = self.raw / "node-label"
        if input_type is None:
            found = []
            if labels.is_dir():
                found = sorted(p.name for p in labels.iterdir() if (p / "node-label.csv.gz").is_file())
            if len(found) != 1:
                if not found:
                    raise _missing(labels / "<type>" / "node-label.csv.gz", "the labels of the input type")
                raise ValueError(f"{labels} holds labels of {len(found)} node types ({', '.join(found)}): choose one "
                                 "with `input_type`")  # fmt: skip
            input_type = found[0]
        if input_type not in self._counts:
            raise ValueError(f"input_type {input_type!r} is not a node type of {self.raw / NODE_DICT_FILE} (node "
                             f"types: {', '.join(self._counts)})")  # fmt: skip
        path = labels / input_type / "node-label.csv.gz"
        if not path.is_file():
            raise _missing(path, f"the labels of the input type {input_type!r}")
        return input_type

    def _find_split(self, split: Optional[str]) -> str:
        split_root = self.root / "split"
        if not split_root.is_dir():
            raise _missing(split_root, f"the splits, as split/<name>/{self._input_type}/train.csv.gz, valid.csv.gz, "
                                       "test.csv.gz")  # fmt: skip
        split = choose_split(split_root, split)
        for name in _SPLIT_FILES.values():
            path = split_root / split / self._input_type / name
            if not path.is_file():
                raise _missing(path, f"the {self._input_type!r} ids of a split, one per line")
        return split

    def _find_features(self) -> list[str]:
        return [t for t in self._counts if self._feature_file(t).is_file()]

    # cheap shape properties ----------------------------------------------------------------------------------

    @property
    def node_types(self) -> list[str]:
        return list(self._counts)

    @property
    def edge_types(self) -> list[EdgeType]:
        return with_reverse_types(self._edge_types) if self.add_reverse_edges else list(self._edge_types)

    @property
    def num_nodes(self) -> dict[str, int]:
        return dict(self._counts)

    @property
    def input_type(self) -> str:
        return self._input_type

    @property
    def num_features(self) -> dict[str, int]:
        return {t: first_row_width(self._feature_file(t)) for t in self._featured}

    def split_source(self, split: str) -> str:
        """The split's file, e.g. ``<root>/split/time/paper/valid.csv.gz``."""
        return str(self._split_file(split))

    # the conversion ------------------------------------------------------------------------------------------

    def _write(self, out: Path) -> dict[str, Any]:
        counts = self._counts
        y = self._read_labels()
        if y.shape[0] != counts[self._input_type]:
            raise DatasetFileError(
                self._label_file(),
                f"has {y.shape[0]:,} rows, but {NODE_DICT_FILE} says {counts[self._input_type]:,} "
                f"{self._input_type!r} nodes (one label per node)",
            )
        num_edges: dict[str, int] = {}
        for edge_type in self._edge_types:
            index = torch.from_numpy(np.ascontiguousarray(self._read_edges(edge_type).T))
            num_edges.update(write_edge_types(out, edge_type, index, counts, self.add_reverse_edges))
            del index
        for node_type in self._featured:
            convert_csv_to_npy(
                self._feature_file(node_type), out / f"{x_name(node_type)}.npy", counts[node_type], self.feature_dtype,
                f"ogb: {node_type} features", what=f"rows, one per {node_type!r} node ({NODE_DICT_FILE} says "
                f"{counts[node_type]:,})",
            )  # fmt: skip
        num_classes = self._write_node_task(out, y)
        return hetero_meta(
            counts, self.edge_types, self._input_type, self.num_features, num_classes,
            **{k: v for k, v in self.config.items() if k not in ("input_type", "num_classes")}, num_edges=num_edges,
        )  # fmt: skip

    def _read_edges(self, edge_type: EdgeType) -> np.ndarray:
        """``edge.csv.gz`` of ``edge_type`` as int64 ``[E, 2]``, each column's ids checked against its type's count,
        the rows against ``num-edge-list.csv.gz`` where present."""
        folder = self._relation(edge_type)
        path = folder / "edge.csv.gz"
        edges = read_csv_matrix(path, np.int64, f"ogb: {'__'.join(edge_type)}", width=2)
        check_count(path, edges.shape[0], folder / EDGE_COUNT_FILE, "edges")
        for column, node_type in ((0, edge_type[0]), (1, edge_type[2])):
            count = self._counts[node_type]
            ids = edges[:, column]
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= count):
                row = int(np.flatnonzero((ids < 0) | (ids >= count))[0])
                raise DatasetFileError(
                    path, f"the {('source', 'destination')[column]} {int(ids[row])} is not a {node_type!r} id: "
                    f"{NODE_DICT_FILE} says {node_type!r} has {count:,} nodes (ids 0 to {count - 1:,})", line=row + 1,
                )  # fmt: skip
        return edges
