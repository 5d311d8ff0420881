"""OGB node-property-prediction datasets read from a local folder (no download).

Reads the folder layout that the ``ogb`` package downloads and unpacks, e.g. ``ogbn_products/``::

    raw/edge.csv.gz             one "src,dst" line per edge
    raw/node-feat.csv.gz        one comma-separated feature row per node
    raw/node-label.csv.gz       one label per node ("nan" for unlabeled nodes)
    raw/num-node-list.csv.gz    optional: the number of nodes
    raw/num-edge-list.csv.gz    optional: the number of edges (checked against edge.csv.gz)
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

from pathlib import Path
from typing import Any, Optional

from lightning_zerocopy.datasets.base import CachedNodeDataset, DatasetFileError
from lightning_zerocopy.datasets.csv_gz import convert_csv_to_npy, read_csv_matrix  # noqa: F401 (re-exported)
from lightning_zerocopy.datasets.ogb_raw import (  # noqa: F401 (file_stamp re-exported)
    OGBFolder,
    OGBLabels,
    file_stamp,
)
from lightning_zerocopy.datasets.ogb_counts import EDGE_COUNT_FILE, NODE_COUNT_FILE, read_count

_REQUIRED = ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz")
_OPTIONAL = (NODE_COUNT_FILE, EDGE_COUNT_FILE, "edge-feat.csv.gz")
_SPLIT_FILES = {"train": "train.csv.gz", "val": "valid.csv.gz", "test": "test.csv.gz"}
_SPLIT_LAYOUT = "split/<name>/train.csv.gz, valid.csv.gz and test.csv.gz (one node id per line)"


class OGBNodeDataset(OGBFolder, OGBLabels, CachedNodeDataset):
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
        self._num_classes = num_classes
        self.add_inverse_edges = add_inverse_edges
        self._open_folder(
            root, split, "node", _REQUIRED, _OPTIONAL, _SPLIT_FILES, _SPLIT_LAYOUT, feature_dtype, "ogb", cache_dir,
            add_inverse_edges=add_inverse_edges, version=3,
        )

    def _label_file(self) -> Path:
        return self.raw / "node-label.csv.gz"

    def _write(self, out: Path) -> dict[str, Any]:
        y = self._read_labels()
        num_nodes, nodes_from = self._num_nodes(default=y.shape[0])
        if y.shape[0] != num_nodes:
            raise DatasetFileError(self._label_file(), f"has {y.shape[0]:,} rows, but {nodes_from} (one label per node)")
        self._write_graph(out, num_nodes, nodes_from, with_edge_attr=True)
        num_classes = self._write_node_task(out, y)
        return dict(self.config, num_nodes=num_nodes, num_classes=num_classes)

    def _num_nodes(self, default: int) -> tuple[int, str]:
        """The number of nodes and where it came from (for messages)."""
        count = read_count(self.raw / NODE_COUNT_FILE)
        if count is None:
            return default, f"node-label.csv.gz has {default:,} rows"
        return count, f"{NODE_COUNT_FILE} says {count:,}"


__all__: list[str] = ["OGBNodeDataset", "file_stamp", "read_csv_matrix", "convert_csv_to_npy"]
