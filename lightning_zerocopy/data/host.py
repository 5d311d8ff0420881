"""Put a dataset into host memory that every local process maps by name, and get its handles.

Node order
----------
With ``node_order="bfs"`` or ``"degree"`` the graph, the feature rows and the labels are stored renumbered
into a locality-preserving internal order (:mod:`lightning_zerocopy.graph.reorder`), so that the rows a
mini-batch reads share memory pages (the zero-copy gather is bound by pages touched, not bytes). Splits,
edge features and the graph's edge ids stay in the dataset's numbering; the two id maps go into shared
memory next to the rest (:class:`~lightning_zerocopy.data.batch.NodeOrderHandles`) and
:class:`~lightning_zerocopy.data.batch.BatchBuilder` translates at the batch boundary, so batches carry
original ids.

Computing an order and relabeling take seconds to minutes on large graphs (a progress bar shows steps that
take more than a second). For datasets with an on-disk cache (``dataset.cache``, an
:class:`~lightning_zerocopy.datasets.base.ArrayCache`) the relabeled arrays are cached next to it, in
``<dataset cache>-order-<kind>-v1`` (see :func:`node_order_cache_dir`, :func:`build_node_order_cache`), and
built once per machine; the ``mmap`` feature storage then maps the relabeled feature file. Without a disk
cache the order is computed in memory; a caller that shares the same data again (the DataModule's ``setup``
for ``fit`` then ``test``) passes the order it got the first time (:func:`shared_node_order`) back in.

Feature dtype
-------------
``feature_dtype`` (``bfloat16`` / ``float16``) stores the feature table in host memory in that dtype: half the RAM
and half the bytes every gather moves over PCIe. The cast happens once, while the host copy is built (a progress bar
shows casts that take more than a second); a finite value the dtype cannot hold (above 65504 in ``float16``) is an
error naming its node and column. ``shared_memory`` casts into the shared segment; ``mmap`` maps a converted copy of
the feature file, built once per machine in ``<dataset cache>[-order-<kind>-v1]-x-<dtype>-v1`` (the dtype is part of
its name; the node-order cache keeps the dataset's dtype, so one relabeling serves every dtype).
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from lightning_zerocopy import ops
from lightning_zerocopy.data.handles import HostGraphHandles, NodeOrderHandles
from lightning_zerocopy.datasets.base import ArrayCache, NodeData
from lightning_zerocopy.datasets.links import LinkData
from lightning_zerocopy.gather.host_table import (
    FeatureTableHandle,
    HostFeatureTable,
    cast_chunk_into,
    cast_rows_into,
    feature_dtype_name,
)
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.graph.reorder import NodeOrder, bfs_order, degree_order
from lightning_zerocopy.graph.shared_memory import (
    NpyTensorHandle,
    TensorHandle,
    create_shared_tensor,
    save_npy,
    share_tensor,
)
from lightning_zerocopy.options import FeatureStorage, NodeOrderKind, check_choice, choices

__all__ = [
    "FeatureStorage",
    "NODE_ORDERS",
    "build_node_order_cache",
    "exchange_handles",
    "feature_cache_dir",
    "feature_file",
    "node_order_cache_dir",
    "share_node_data",
    "shared_node_order",
]

#: Accepted values of ``node_order``.
NODE_ORDERS: tuple[str, ...] = choices(NodeOrderKind)

_log = logging.getLogger(__name__)
_CACHE_VERSION = 1  # part of the cache directory name: bump when the relabeled arrays change meaning
_ROW_CHUNK_BYTES = 64 * 1024 * 1024  # feature bytes relabeled per step (bounds memory, drives the bar)
_NUMPY_STORAGE = {torch.bfloat16: torch.int16}  # numpy has no bfloat16: stored as its bits


def share_node_data(
    data: "NodeData | LinkData",
    feature_storage: FeatureStorage = "shared_memory",
    *,
    node_order: NodeOrderKind = "none",
    cache_dir: Optional[os.PathLike] = None,
    order: Optional[NodeOrder] = None,
    splits: Optional[Mapping[str, torch.Tensor]] = None,
    feature_dtype: Optional[torch.dtype] = None,
    feature_dir: Optional[os.PathLike] = None,
    dtype_key: str = "feature_dtype",
) -> HostGraphHandles:
    """Build the CSC graph of ``data`` and copy graph, labels, splits (and features) into shared memory.

    One host copy for every task: a :class:`~lightning_zerocopy.datasets.base.NodeData` shares its labels and node
    splits; a :class:`~lightning_zerocopy.datasets.links.LinkData` (no node labels) shares the ``splits`` its caller
    flattened into tensors (:func:`~lightning_zerocopy.data.link_host.link_split_tensors`).

    Args:
        data: the dataset's arrays (``y`` is shared when ``data`` has it).
        feature_storage: ``"shared_memory"`` copies the features into a shared segment (RAM, can be pinned
            for the GPU); ``"mmap"`` maps the dataset's ``.npy`` feature file instead (features larger than RAM,
            shared through the page cache).
        node_order: ``"none"`` keeps the dataset's node ids; ``"bfs"`` / ``"degree"`` store graph, features and
            labels in that locality-preserving internal order (splits, edge features and edge ids are not
            renumbered; the handles carry the id maps, see the module docstring).
        cache_dir: where the relabeled arrays are cached on disk (:func:`node_order_cache_dir`), or ``None``
            to relabel in memory. Needed for ``feature_storage="mmap"`` with a node order (the relabeled
            features must be a file to be mapped).
        order: the ``node_order`` of ``data`` computed before (:func:`shared_node_order` of earlier handles), to
            relabel in memory without computing it again; ignored with ``cache_dir``.
        splits: the split tensors to share, by name (never renumbered); default: the node splits of ``data``.
        feature_dtype: the dtype the feature table is stored in (``None``: the dataset's); see the module docstring.
        feature_dir: where ``mmap`` storage keeps the features cast to ``feature_dtype`` (:func:`feature_cache_dir`);
            needed for ``mmap`` when ``feature_dtype`` differs from the dataset's.
        dtype_key: how errors name ``feature_dtype`` (e.g. its YAML key).

    Returns:
        The handles. The caller owns the segments and must call ``handles.unlink()`` once every local
        process has opened them; if this function fails, it unlinks what it had created.

    Raises:
        ValueError: a bad ``feature_storage`` / ``node_order`` / ``order`` or an impossible combination.
    """
    check_choice(feature_storage, FeatureStorage, "feature_storage")
    check_choice(node_order, NodeOrderKind, "node_order")
    if feature_storage == "mmap" and data.x_file is None:
        raise ValueError(
            "`feature_storage`='mmap' needs a dataset whose features are an .npy file (e.g. SyntheticGraph,"
            " OGBNodeDataset); use 'shared_memory' for this dataset"
        )
    if feature_storage == "mmap" and node_order != "none" and cache_dir is None:
        raise ValueError(
            f"`node_order`={node_order!r} with `feature_storage`='mmap' needs a dataset with an on-disk cache"
            " (e.g. SyntheticGraph, OGBNodeDataset) to hold the relabeled feature file; use"
            " feature_storage='shared_memory' or node_order='none'"
        )
    if order is not None and order.num_nodes != data.num_nodes:
        raise ValueError(f"`order` covers {order.num_nodes} nodes but the data has {data.num_nodes}")
    dtype = data.x.dtype if feature_dtype is None else feature_dtype
    if feature_storage == "mmap" and dtype != data.x.dtype and feature_dir is None:
        raise ValueError(
            f"{_label(dtype_key)}={feature_dtype_name(dtype)!r} with `feature_storage`='mmap' needs a dataset with an"
            f" on-disk cache (e.g. SyntheticGraph, OGBNodeDataset) to hold the converted feature file (the dataset"
            f" stores {feature_dtype_name(data.x.dtype)}); use feature_storage='shared_memory'"
        )
    with ExitStack() as undo:

        def share(tensor: torch.Tensor, name: str) -> TensorHandle:
            _, handle = share_tensor(tensor.contiguous(), name=name)
            undo.callback(handle.unlink)
            return handle

        order_handles: Optional[NodeOrderHandles] = None
        if node_order == "none":
            graph = CSCGraph.from_edge_index(data.edge_index, data.num_nodes).share()
            undo.callback(graph.unlink)
            if feature_storage == "mmap":
                source = NpyTensorHandle(data.x_file)  # type: ignore[arg-type]
                features = feature_file(source, data.x.dtype, dtype, feature_dir, dtype_key)
            else:
                features = HostFeatureTable.share(data.x.contiguous(), name="features", dtype=dtype, key=dtype_key).handle()
                undo.callback(features.unlink)
            labels = None if _labels(data) is None else share(_labels(data).to(torch.int64), "labels")
        elif cache_dir is not None:
            cache = build_node_order_cache(data, node_order, cache_dir)
            _check_cache_matches(cache, data)
            graph = CSCGraph(
                cache.tensor("indptr"), cache.tensor("indices"), cache.tensor("edge_perm"), data.num_nodes
            ).share()
            undo.callback(graph.unlink)
            x_handle = _feature_file_handle(cache, data.x.dtype)  # the node-order cache keeps the dataset's dtype
            if feature_storage == "mmap":
                features = feature_file(x_handle, data.x.dtype, dtype, feature_dir, dtype_key)
            else:
                features = HostFeatureTable.share(x_handle.open(), name="features", dtype=dtype, key=dtype_key).handle()
                undo.callback(features.unlink)
            labels = share(cache.tensor("y"), "labels") if cache.has("y") else None
            order_handles = NodeOrderHandles(
                node_order, share(cache.tensor("order"), "node_order"), share(cache.tensor("rank"), "node_rank")
            )
        else:
            with _Steps(node_order, ["building CSC", "ordering nodes", "relabeling graph", "relabeling rows"]) as steps:
                graph = CSCGraph.from_edge_index(data.edge_index, data.num_nodes)
                steps.next()
                if order is None:
                    order = _compute_order(graph, node_order)
                steps.next()
                graph = order.relabel_graph(graph).share()
                undo.callback(graph.unlink)
                steps.next()
                shared_x, x_handle = create_shared_tensor(data.x.shape, dtype, name="features")
                undo.callback(x_handle.unlink)
                features = HostFeatureTable(shared_x, handle=FeatureTableHandle(x_handle)).handle()  # checks x
                _relabel_rows_into(data.x, order.order, shared_x, steps.bar, dtype_key)
                y = _labels(data)
                labels = None if y is None else share(order.relabel_rows(y.to(torch.int64)), "labels")
                order_handles = NodeOrderHandles(
                    node_order, share(order.order, "node_order"), share(order.rank, "node_rank")
                )

        if splits is None:
            splits = {name: data.split(name) for name in ("train", "val", "test")}  # type: ignore[union-attr]
        shared_splits = {name: share(tensor, f"{name.replace('.', '_')}_idx") for name, tensor in splits.items()}
        edge_attr = share(data.edge_attr, "edge_attr") if data.edge_attr is not None else None
        handles = HostGraphHandles(
            graph=graph.handle(), features=features, labels=labels, splits=shared_splits, edge_attr=edge_attr,
            node_order=order_handles,
        )  # fmt: skip
        undo.pop_all()  # success: the caller owns the segments now
    return handles


def shared_node_order(handles: HostGraphHandles) -> Optional[NodeOrder]:
    """The node order ``handles`` are stored in, mapped (``None`` without one): give it to a later
    :func:`share_node_data` of the same data to skip computing it again. Open while the names exist."""
    if handles.node_order is None:
        return None
    return NodeOrder(handles.node_order.order.open(), handles.node_order.rank.open())


def exchange_handles(
    mine: "HostGraphHandles | Exception | None", rank: int, local_rank: int, world_size: int
) -> HostGraphHandles:
    """Give every rank the handles its machine's local rank 0 created (``mine`` there; ``None`` elsewhere).

    A failure on local rank 0 (``mine`` an exception) is raised on every rank, so none waits forever.

    Raises:
        RuntimeError: ``world_size > 1`` without an initialized process group, or local rank 0 failed.
    """
    if world_size > 1:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                f"ZeroCopyDataModule runs with world_size={world_size} but torch.distributed is not initialized"
            )
        everyone: list[Any] = [None] * world_size
        dist.all_gather_object(everyone, mine if not isinstance(mine, Exception) else RuntimeError(repr(mine)))
        if not isinstance(mine, Exception):
            mine = everyone[rank - local_rank]  # this machine's local rank 0
    if isinstance(mine, Exception):
        if local_rank == 0:
            raise mine
        raise RuntimeError(f"building the shared host memory failed on local rank 0: {mine}")
    assert mine is not None
    return mine


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


def _labels(data: Any) -> Optional[torch.Tensor]:
    """The node labels of ``data`` (``None`` for a dataset without them, e.g. a link dataset)."""
    return getattr(data, "y", None)


def _compute_order(graph: CSCGraph, node_order: str) -> NodeOrder:
    if node_order == "bfs":
        return bfs_order(graph)
    if node_order == "degree":
        return degree_order(graph)
    raise ValueError(f"`node_order` must be 'bfs' or 'degree' here, got {node_order!r}")


def _relabel_rows_into(
    x: torch.Tensor, order: torch.Tensor, out: torch.Tensor, bar: Optional[tqdm], dtype_key: str = "feature_dtype"
) -> None:
    """``out[i] = x[order[i]]`` in chunks of rows (parallel row copies; ``x`` may be memory-mapped), cast to
    ``out``'s dtype when it differs (a value it cannot hold raises, naming ``dtype_key``)."""
    if x.shape != out.shape:
        raise ValueError(f"cannot relabel features of shape {tuple(x.shape)} into {tuple(out.shape)}")
    row_bytes = max(1, x[0].numel() * x.element_size()) if x.shape[0] > 0 else 1
    rows = max(1, _ROW_CHUNK_BYTES // row_bytes)
    flat_x = x.reshape(x.shape[0], -1) if x.dim() != 2 else x
    flat_out = out.reshape(out.shape[0], -1) if out.dim() != 2 else out
    if not flat_x.is_contiguous():
        flat_x = flat_x.contiguous()
    cast = flat_x.dtype != flat_out.dtype
    for start in range(0, x.shape[0], rows):
        stop = min(start + rows, x.shape[0])
        if cast:  # gather in the source dtype, then cast the chunk
            rows_x = ops.gather_rows(flat_x, order[start:stop])
            cast_chunk_into(rows_x, flat_out[start:stop], start, "features", dtype_key)
        else:
            ops.gather_rows(flat_x, order[start:stop], flat_out[start:stop])
        if bar is not None:
            bar.set_postfix_str(f"{stop:,}/{x.shape[0]:,} rows", refresh=False)


def _label(key: str) -> str:
    """A plain argument in backticks; a YAML key (dotted) as it is."""
    return key if "." in key else f"`{key}`"


def _feature_file_handle(cache: ArrayCache, dtype: torch.dtype) -> NpyTensorHandle:
    view = None if dtype not in _NUMPY_STORAGE else str(dtype).removeprefix("torch.")
    return NpyTensorHandle(str(cache.file("x")), view)


def _check_cache_matches(cache: ArrayCache, data: "NodeData | LinkData") -> None:
    meta = cache.meta()
    if (meta.get("num_nodes"), meta.get("num_edges")) != (data.num_nodes, data.num_edges):
        raise RuntimeError(
            f"the node-order cache {cache.path} holds {meta.get('num_nodes')} nodes / {meta.get('num_edges')} edges but"
            f" the dataset has {data.num_nodes} / {data.num_edges}: delete that directory to rebuild it"
        )


class _Steps:
    """A progress bar over the named steps of one relabeling (shown only when it runs longer than a second),
    and a log line with the total time when that exceeds a second."""

    def __init__(self, node_order: str, names: list[str]) -> None:
        self.node_order = node_order
        self.names = names
        self.index = 0
        self.bar: Optional[tqdm] = None
        self.start = 0.0

    def __enter__(self) -> "_Steps":
        self.start = time.perf_counter()
        self.bar = tqdm(total=len(self.names), desc=self._desc(), unit="step", delay=1.0)
        return self

    def _desc(self) -> str:
        return f"node_order={self.node_order!r}: {self.names[min(self.index, len(self.names) - 1)]}"

    def next(self) -> None:
        self.index += 1
        assert self.bar is not None
        self.bar.set_description_str(self._desc(), refresh=False)
        self.bar.update(1)

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.bar is not None
        if exc_type is None:
            self.bar.update(len(self.names) - self.bar.n)
        self.bar.close()
        elapsed = time.perf_counter() - self.start
        if exc_type is None and elapsed > 1.0:
            _log.info("node_order=%r: relabeled graph, features and labels in %.1f s", self.node_order, elapsed)

