"""OGB link-property-prediction datasets (``ogbl-*``) read from a local folder (no download).

Reads the folder layout that the ``ogb`` package downloads and unpacks, e.g. ``ogbl_collab/``::

    raw/edge.csv.gz, raw/node-feat.csv.gz, raw/num-node-list.csv.gz, raw/num-edge-list.csv.gz
                                (the message-passing graph, as for ogbn-*: see ogb_raw.py)
    split/<type>/train.pt, valid.pt, test.pt    the supervision edges, dicts saved with torch.save:

* ``ogbl-collab``, ``-ppa``, ``-ddi``, ``-vessel``: ``edge`` ``[P, 2]`` positives and, for valid/test, ``edge_neg``
  ``[N, 2]``, one pool of negatives scored against every positive (Hits@K): ``neg_per_positive`` is ``None``;
* ``ogbl-citation2``: ``source_node`` / ``target_node`` ``[P]`` and, for valid/test, ``target_node_neg`` ``[P, K]``,
  ``K`` negatives per positive with its source (MRR): ``neg_per_positive = K``.

Other keys (collab's ``weight``, ``year``) are not read; train negatives, where a file has them, are not either (the
DataModule draws train negatives per batch). Tensors and numpy arrays are both accepted, loaded with
``torch.load(weights_only=True)`` (numpy arrays allowed), so a split file cannot run code. The raw edges are OGB's
training graph (val/test edges are not in it); the knowledge graphs (``head``/``tail``/``relation``) are not read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from lightning_zerocopy.datasets.base import DatasetFileError
from lightning_zerocopy.datasets.links import CachedLinkDataset, LinkSplit, save_link_split
from lightning_zerocopy.datasets.ogb_counts import NODE_COUNT_FILE, read_count
from lightning_zerocopy.datasets.ogb_raw import OGBFolder

__all__ = ["OGBLinkDataset"]

_REQUIRED = ("edge.csv.gz", "node-feat.csv.gz", "num-node-list.csv.gz")
_OPTIONAL = ("num-edge-list.csv.gz",)
_SPLIT_FILES = {"train": "train.pt", "val": "valid.pt", "test": "test.pt"}
_SPLIT_LAYOUT = "split/<name>/train.pt, valid.pt and test.pt (dicts of edges saved with torch.save)"


def _numpy_globals() -> list[Any]:
    """What ``torch.load(weights_only=True)`` must allow to read numpy arrays (numpy 1 and 2 spellings)."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    allowed: list[Any] = [np.ndarray, np.dtype]
    allowed += [(_reconstruct, f"{module}.multiarray._reconstruct") for module in ("numpy.core", "numpy._core")]
    dtypes = getattr(np, "dtypes", None)
    allowed += [getattr(dtypes, name) for name in dir(dtypes) if name.endswith("DType")] if dtypes else []
    return allowed


def _load_split_file(path: Path) -> dict[str, torch.Tensor]:
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            loaded = torch.load(path, weights_only=True)
    except Exception as exc:  # a damaged or foreign file: unpickling raises many kinds of errors
        raise DatasetFileError(path, f"cannot be loaded with torch.load ({type(exc).__name__}: {exc})") from exc
    if not isinstance(loaded, dict):
        raise DatasetFileError(path, f"holds a {type(loaded).__name__}, not OGB's dict of edges ({_SPLIT_LAYOUT})")
    return {key: torch.as_tensor(value) for key, value in loaded.items() if isinstance(value, (torch.Tensor, np.ndarray))}


def _ids(path: Path, entries: dict[str, torch.Tensor], key: str, shape: str) -> torch.Tensor:
    """Entry ``key`` as int64 node ids; floats must be whole numbers."""
    ids = entries[key]
    if ids.dtype == torch.bool or ids.is_complex():
        raise DatasetFileError(path, f"'{key}' holds {ids.dtype} values, not node ids")
    if ids.is_floating_point():
        bad = ~torch.isfinite(ids) | (ids != ids.round())
        if bool(bad.any()):
            raise DatasetFileError(path, f"'{key}' holds {float(ids[bad][0]):g}, which is not a node id: ids are integers")
    if shape == "[P, 2]" and (ids.dim() != 2 or ids.shape[1] != 2):
        raise DatasetFileError(path, f"'{key}' has shape {tuple(ids.shape)}; OGB stores edges as {shape} (source, destination)")
    return ids.to(torch.int64)


def read_link_split(path: Path, name: str) -> LinkSplit:
    """One of OGB's ``split/<type>/*.pt`` files as a :class:`LinkSplit` (see the module docstring for the keys)."""
    entries = _load_split_file(path)
    keep_negatives = name != "train"
    if "edge" in entries:
        pos = _ids(path, entries, "edge", "[P, 2]").T.contiguous()
        neg = None
        if keep_negatives and "edge_neg" in entries:
            neg = _ids(path, entries, "edge_neg", "[P, 2]").T.contiguous()
        return LinkSplit(pos_edge_index=pos, neg_edge_index=neg)
    if "source_node" in entries and "target_node" in entries:
        src, dst = _ids(path, entries, "source_node", "[P]").view(-1), _ids(path, entries, "target_node", "[P]").view(-1)
        if src.numel() != dst.numel():
            raise DatasetFileError(path, f"has {src.numel():,} source_node but {dst.numel():,} target_node entries")
        if not keep_negatives or "target_node_neg" not in entries:
            return LinkSplit(pos_edge_index=torch.stack([src, dst]))
        neg_dst = _ids(path, entries, "target_node_neg", "[P, K]")
        if neg_dst.dim() != 2 or neg_dst.shape[0] != src.numel():
            raise DatasetFileError(
                path, f"'target_node_neg' has shape {tuple(neg_dst.shape)}; expected [{src.numel():,}, K] (K per positive)"
            )
        k = int(neg_dst.shape[1])
        neg = torch.stack([src.repeat_interleave(k), neg_dst.reshape(-1)])
        return LinkSplit(pos_edge_index=torch.stack([src, dst]), neg_edge_index=neg, neg_per_positive=k)
    raise DatasetFileError(
        path,
        f"holds the keys {sorted(entries)}; an ogbl split file holds 'edge' (and 'edge_neg'), or 'source_node', "
        "'target_node' (and 'target_node_neg'); knowledge graphs (head/tail/relation) are not supported",
    )


class OGBLinkDataset(OGBFolder, CachedLinkDataset):
    """An ``ogbl-*`` dataset from a local folder in OGB's layout (see the module docstring).

    The cache directory is keyed on the arguments and on a stamp of every input file
    (:func:`~lightning_zerocopy.datasets.ogb_raw.file_stamp`), so a changed file is converted again.

    Args:
        root: the dataset folder, the one holding ``raw/`` and ``split/`` (e.g. ``.../ogbl_collab``).
        split: the subfolder of ``split/`` to use (e.g. ``time``); default: the only one present.
        add_inverse_edges: also store every raw edge reversed; OGB does this for ogbl-collab, -ppa and -ddi
            (undirected), not for ogbl-citation2 (directed citations).
        feature_dtype: dtype of the converted node features, ``"float32"`` or ``"float16"``.
        cache_dir: cache root (default ``$LIGHTNING_ZEROCOPY_CACHE`` or ``~/.cache/lightning_zerocopy``).
    """

    def __init__(
        self,
        root: str,
        split: Optional[str] = None,
        add_inverse_edges: bool = False,
        feature_dtype: str = "float32",
        cache_dir: Optional[str] = None,
    ) -> None:
        self.add_inverse_edges = add_inverse_edges
        self._open_folder(
            root, split, "link", _REQUIRED, _OPTIONAL, _SPLIT_FILES, _SPLIT_LAYOUT, feature_dtype, "ogb-link", cache_dir,
            missing_notes={"node-feat.csv.gz": " (ogbl-ddi ships no node features and is not supported)"},
            add_inverse_edges=add_inverse_edges, version=1,
        )

    def _write(self, out: Path) -> dict[str, Any]:
        num_nodes = read_count(self.raw / NODE_COUNT_FILE)
        if num_nodes is None:
            raise DatasetFileError(self.raw / NODE_COUNT_FILE, "is missing: an ogbl-* folder states its node count there")
        num_edges = self._write_graph(out, num_nodes, f"num-node-list.csv.gz says {num_nodes:,}", with_edge_attr=False)
        splits = {name: save_link_split(out, name, read_link_split(self._split_file(name), name)) for name in _SPLIT_FILES}
        return dict(self.config, num_nodes=num_nodes, num_edges=num_edges, splits=splits)
