"""The on-disk caches a host copy is built from, each built once per machine (safe to race) next to the dataset's.

* the node-order cache (:func:`build_node_order_cache`, in :func:`node_order_cache_dir`): the dataset's graph,
  features and labels relabeled into a locality-preserving node order, with the two id maps;
* the cast feature file (:func:`feature_file`, in :func:`feature_cache_dir`): the ``.npy`` feature file (the
  dataset's, or the node-order cache's) converted to a ``feature_dtype``, for ``mmap`` feature storage.

:func:`~lightning_zerocopy.data.host.share.share_node_data` copies or maps these into the host copy; why node
orders and feature dtypes exist is its module's docstring (:mod:`lightning_zerocopy.data.host.share`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from lightning_zerocopy.data.host.relabel import _compute_order, _labels, _relabel_rows_into, _Steps
from lightning_zerocopy.datasets.base import ArrayCache, NodeData
from lightning_zerocopy.datasets.links import LinkData
from lightning_zerocopy.gather.host_table import FeatureTableHandle, cast_rows_into, feature_dtype_name
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.graph.shared_memory import NpyTensorHandle, save_npy
from lightning_zerocopy.options import NodeOrderKind, check_choice

__all__ = [
    "build_node_order_cache",
    "feature_cache_dir",
    "feature_file",
    "node_order_cache_dir",
]

_CACHE_VERSION = 1  # part of the cache directory name: bump when the relabeled arrays change meaning
_NUMPY_STORAGE = {torch.bfloat16: torch.int16}  # numpy has no bfloat16: stored as its bits


def node_order_cache_dir(dataset: Any, node_order: NodeOrderKind) -> Optional[Path]:
    """Where the arrays of ``dataset`` relabeled into ``node_order`` are cached, or ``None``.

    ``None`` for ``node_order="none"`` and for datasets without an on-disk cache (no ``cache`` attribute holding
    an :class:`~lightning_zerocopy.datasets.base.ArrayCache`, e.g. ``PyGNodeDataset``). The directory sits next
    to the dataset's cache and is named after it, so it changes with the dataset's configuration.
    """
    check_choice(node_order, NodeOrderKind, "node_order")
    cache = getattr(dataset, "cache", None)
    if node_order == "none" or not isinstance(cache, ArrayCache):
        return None
    return cache.path.parent / f"{cache.path.name}-order-{node_order}-v{_CACHE_VERSION}"


def feature_cache_dir(dataset: Any, node_order: NodeOrderKind, feature_dtype: Optional[torch.dtype]) -> Optional[Path]:
    """Where ``mmap`` storage keeps the features of ``dataset`` cast to ``feature_dtype`` (in ``node_order``), or
    ``None`` (no dtype asked for, or a dataset without an on-disk cache).

    The directory sits next to the cache it converts (the dataset's, or its node-order cache) and is named after it
    and the dtype: ``<that cache>-x-<dtype>-v1``. It is only built when the dtype differs from the dataset's.
    """
    base = node_order_cache_dir(dataset, node_order) if node_order != "none" else getattr(dataset, "cache", None)
    if isinstance(base, ArrayCache):
        base = base.path
    if feature_dtype is None or not isinstance(base, Path):
        return None
    return base.parent / f"{base.name}-x-{feature_dtype_name(feature_dtype)}-v{_CACHE_VERSION}"


def feature_file(
    source: NpyTensorHandle,
    source_dtype: torch.dtype,
    dtype: torch.dtype,
    feature_dir: Optional[os.PathLike],
    dtype_key: str = "feature_dtype",
) -> FeatureTableHandle:
    """The ``mmap`` feature table of ``source`` (a ``.npy`` feature file) in ``dtype``: the file itself when it
    holds that dtype, else a copy cast to ``dtype`` in ``feature_dir``, built once (safe to race) with a progress bar.

    Raises:
        ValueError: a cast is needed and ``feature_dir`` is ``None``.
        FeatureOverflowError: a value does not fit ``dtype`` (naming ``dtype_key``).
    """
    if dtype == source_dtype:
        return FeatureTableHandle(source)
    if feature_dir is None:
        raise ValueError(f"{_label(dtype_key)}: casting the mmap feature file {source.path} needs a cache directory")
    cache = ArrayCache(Path(feature_dir))

    def write(out: Path) -> dict[str, Any]:
        x = source.open()
        storage = _NUMPY_STORAGE.get(dtype, dtype)
        np_dtype = torch.empty((), dtype=storage).numpy().dtype
        x_out = np.lib.format.open_memmap(out / "x.npy", mode="w+", dtype=np_dtype, shape=tuple(x.shape))
        cast_rows_into(x, torch.from_numpy(x_out).view(dtype), what=f"features of {source.path}", key=dtype_key)
        x_out.flush()
        del x_out
        return {
            "source": str(source.path),
            "num_nodes": int(x.shape[0]),
            "num_features": int(x.shape[1]) if x.dim() > 1 else 1,
            "source_dtype": feature_dtype_name(source_dtype),
            "feature_dtype": feature_dtype_name(dtype),
            "version": _CACHE_VERSION,
        }

    cache.build(write)
    meta, shape = cache.meta(), tuple(np.load(source.path, mmap_mode="r").shape)
    if (meta.get("num_nodes"), meta.get("feature_dtype")) != (shape[0], feature_dtype_name(dtype)):
        raise RuntimeError(
            f"the converted feature cache {cache.path} holds {meta.get('num_nodes')} {meta.get('feature_dtype')} rows"
            f" but {source.path} has {shape[0]} to store as {feature_dtype_name(dtype)}: delete that directory to"
            " rebuild it"
        )
    return FeatureTableHandle(_feature_file_handle(cache, dtype))


def build_node_order_cache(data: "NodeData | LinkData", node_order: NodeOrderKind, cache_dir: os.PathLike) -> ArrayCache:
    """Relabel ``data`` into ``node_order`` and write the result to ``cache_dir`` (once; safe to race).

    The cache holds ``order``/``rank`` (int64 id maps, ``order[internal] = original``), the relabeled CSC graph
    (``indptr``, ``indices``, ``edge_perm`` -- edge ids still point into ``data.edge_index``), ``x`` and ``y``
    (when ``data`` has node labels) in internal row order. Nothing is done when the cache is already complete.

    Returns:
        The (complete) cache.
    """
    check_choice(node_order, NodeOrderKind, "node_order")
    if node_order == "none":
        raise ValueError("node_order='none' has nothing to cache")
    cache = ArrayCache(Path(cache_dir))
    if cache.exists():
        return cache

    def write(out: Path) -> dict[str, Any]:
        steps_names = ["building CSC", "ordering nodes", "relabeling graph", "relabeling rows", "writing maps"]
        with _Steps(node_order, steps_names) as steps:
            graph = CSCGraph.from_edge_index(data.edge_index, data.num_nodes)
            steps.next()
            order = _compute_order(graph, node_order)
            steps.next()
            relabeled = order.relabel_graph(graph)
            del graph
            for name in ("indptr", "indices", "edge_perm"):
                save_npy(getattr(relabeled, name), out / f"{name}.npy")
            del relabeled
            steps.next()
            x = data.x
            storage = _NUMPY_STORAGE.get(x.dtype, x.dtype)
            np_dtype = torch.empty((), dtype=storage).numpy().dtype
            x_out = np.lib.format.open_memmap(out / "x.npy", mode="w+", dtype=np_dtype, shape=tuple(x.shape))
            _relabel_rows_into(x, order.order, torch.from_numpy(x_out).view(x.dtype), steps.bar)
            x_out.flush()
            del x_out
            if _labels(data) is not None:
                save_npy(order.relabel_rows(_labels(data).to(torch.int64)), out / "y.npy")
            steps.next()
            save_npy(order.order, out / "order.npy")
            save_npy(order.rank, out / "rank.npy")
        return {
            "node_order": node_order,
            "num_nodes": data.num_nodes,
            "num_edges": data.num_edges,
            "num_features": data.num_features,
            "feature_dtype": str(x.dtype).removeprefix("torch."),
            "version": _CACHE_VERSION,
        }

    cache.build(write)
    return cache


# ---------------------------------------------------------------------------------------------- internals


def _label(key: str) -> str:
    """A plain argument in backticks; a YAML key (dotted) as it is."""
    return key if "." in key else f"`{key}`"


def _feature_file_handle(cache: ArrayCache, dtype: torch.dtype) -> NpyTensorHandle:
    view = None if dtype not in _NUMPY_STORAGE else str(dtype).removeprefix("torch.")
    return NpyTensorHandle(str(cache.verify("x")), view)  # (a file changed since the build is refused)


def _check_cache_matches(cache: ArrayCache, data: "NodeData | LinkData") -> None:
    meta = cache.meta()
    if (meta.get("num_nodes"), meta.get("num_edges")) != (data.num_nodes, data.num_edges):
        raise RuntimeError(
            f"the node-order cache {cache.path} holds {meta.get('num_nodes')} nodes / {meta.get('num_edges')} edges but"
            f" the dataset has {data.num_nodes} / {data.num_edges}: delete that directory to rebuild it"
        )
