"""Put a dataset into host memory that every local process maps by name, and get its handles.

:func:`share_node_data` builds the host copy (graph, features, labels, splits) in shared segments on a machine's
local rank 0; :func:`exchange_handles` gives every rank its machine's handles. The arrays it copies from may come
from the on-disk caches of :mod:`~lightning_zerocopy.data.host.disk_cache` (relabeled into a node order, features
cast to a dtype); relabeling in memory is :mod:`~lightning_zerocopy.data.host.relabel`.

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
``<dataset cache>-order-<kind>-v1`` (see :func:`~lightning_zerocopy.data.host.disk_cache.node_order_cache_dir`,
:func:`~lightning_zerocopy.data.host.disk_cache.build_node_order_cache`), and built once per machine; the ``mmap``
feature storage then maps the relabeled feature file. Without a disk cache the order is computed in memory; a caller
that shares the same data again (the DataModule's ``setup`` for ``fit`` then ``test``) passes the order it got the
first time (:func:`shared_node_order`) back in.

Feature dtype
-------------
``feature_dtype`` (``bfloat16`` / ``float16``) stores the feature table in host memory in that dtype: half the RAM
and half the bytes every gather moves over PCIe. The cast happens once, while the host copy is built (a progress bar
shows casts that take more than a second); a finite value the dtype cannot hold (above 65504 in ``float16``) is an
error naming its node and column. ``shared_memory`` casts into the shared segment; ``mmap`` maps a converted copy of
the feature file, built once per machine in ``<dataset cache>[-order-<kind>-v1]-x-<dtype>-v1`` (the dtype is part of
its name; the node-order cache keeps the dataset's dtype, so one relabeling serves every dtype;
:func:`~lightning_zerocopy.data.host.disk_cache.feature_file`).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from typing import Any, Mapping, Optional

import torch

from lightning_zerocopy.data.handles import HostGraphHandles, NodeOrderHandles
from lightning_zerocopy.data.host.disk_cache import (
    _check_cache_matches,
    _feature_file_handle,
    _label,
    build_node_order_cache,
    feature_file,
)
from lightning_zerocopy.data.host.relabel import _compute_order, _labels, _relabel_rows_into, _Steps
from lightning_zerocopy.datasets.base import NodeData
from lightning_zerocopy.datasets.links import LinkData
from lightning_zerocopy.gather.host_table import FeatureTableHandle, HostFeatureTable, feature_dtype_name
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.graph.reorder import NodeOrder
from lightning_zerocopy.graph.shared_memory import NpyTensorHandle, TensorHandle, create_shared_tensor, share_tensor
from lightning_zerocopy.options import FeatureStorage, NodeOrderKind, check_choice, choices

__all__ = [
    "FeatureStorage",
    "NODE_ORDERS",
    "exchange_handles",
    "share_node_data",
    "shared_node_order",
]

#: Accepted values of ``node_order``.
NODE_ORDERS: tuple[str, ...] = choices(NodeOrderKind)


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
    flattened into tensors (:func:`~lightning_zerocopy.data.host.links.link_split_tensors`).

    Args:
        data: the dataset's arrays (``y`` is shared when ``data`` has it).
        feature_storage: ``"shared_memory"`` copies the features into a shared segment (RAM, can be pinned
            for the GPU); ``"mmap"`` maps the dataset's ``.npy`` feature file instead (features larger than RAM,
            shared through the page cache).
        node_order: ``"none"`` keeps the dataset's node ids; ``"bfs"`` / ``"degree"`` store graph, features and
            labels in that locality-preserving internal order (splits, edge features and edge ids are not
            renumbered; the handles carry the id maps, see the module docstring).
        cache_dir: where the relabeled arrays are cached on disk
            (:func:`~lightning_zerocopy.data.host.disk_cache.node_order_cache_dir`), or ``None``
            to relabel in memory. Needed for ``feature_storage="mmap"`` with a node order (the relabeled
            features must be a file to be mapped).
        order: the ``node_order`` of ``data`` computed before (:func:`shared_node_order` of earlier handles), to
            relabel in memory without computing it again; ignored with ``cache_dir``.
        splits: the split tensors to share, by name (never renumbered); default: the node splits of ``data``.
        feature_dtype: the dtype the feature table is stored in (``None``: the dataset's); see the module docstring.
        feature_dir: where ``mmap`` storage keeps the features cast to ``feature_dtype``
            (:func:`~lightning_zerocopy.data.host.disk_cache.feature_cache_dir`);
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
