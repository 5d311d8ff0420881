"""Put a dataset into host memory that every local process maps by name, and get its handles.

:func:`share_host_data` builds the host copy of any dataset over its :class:`~lightning_zerocopy.graph.schema.GraphSchema`
(one CSC per edge type, one feature table per featured node type, the input type's labels, the splits) in shared
segments on a machine's local rank 0; :func:`exchange_handles` gives every rank its machine's handles. An untyped
dataset is the one-type case (:func:`typed_arrays`).

One CSC per edge type
---------------------
Every edge type ``(s, r, d)`` gets its own CSC (the ``build_csc`` op): targets are ``d``-type ids, ``indices`` hold
``s``-type ids, ``edge_perm`` maps back to that type's own edge list (a batch's ``e_id`` is a position in
``edge_index[(s, r, d)]``, as PyG's). The CSC is built over ``max(num_nodes[s], num_nodes[d])`` ids (``build_csc``
range-checks both endpoints against one count), so ``indptr`` has a flat tail past the last ``d`` id that no seed
reads, and the sampler kernel's bounds, which cap a hop's new nodes at the graph's node count, hold for the ``s`` side
too (8 bytes per id of the larger type per edge type). Those CSCs serve the cache ranking, the link tasks, the
layer-wise path and the cost model; the sampler of a typed graph of several types reads one more CSC, of every edge
type with edge-type offsets (:mod:`lightning_zerocopy.graph.fused_csc`, GraphBolt's layout), built here once from them
into shared memory, so one kernel call draws a hop for every edge type; only that one is ever placed on a GPU.

Node order (one node type)
--------------------------
With ``node_order="bfs"`` or ``"degree"`` the graph, the feature rows and the labels are stored renumbered into a
locality-preserving internal order (:mod:`lightning_zerocopy.graph.reorder`), so that the rows a mini-batch reads
share memory pages (the zero-copy gather is bound by pages touched, not bytes). Splits, edge features and the graph's
edge ids stay in the dataset's numbering; the two id maps go into shared memory next to the rest
(:class:`~lightning_zerocopy.data.handles.NodeOrderHandles`) and the builder translates at the batch boundary, so
batches carry the dataset's ids. For datasets with an on-disk cache (``dataset.cache``, an
:class:`~lightning_zerocopy.datasets.base.ArrayCache`) the relabeled arrays are cached next to it, in ``<dataset
cache>-order-<kind>-v1`` (:func:`~.disk_cache.node_order_cache_dir`, :func:`~.disk_cache.build_node_order_cache`),
built once per machine; without one the order is computed in memory, and a caller that shares the same data again
passes the order it got the first time (:func:`shared_node_order`) back in. A typed graph has no node order: a
per-type order would renumber both endpoints of every edge type and carry per-type maps through the sampler and
the assembly.

Feature dtype
-------------
``feature_dtype`` (``bfloat16`` / ``float16``) stores every feature table in that dtype: half the RAM and half the
bytes every gather moves over PCIe. The cast happens once, here; a finite value the dtype cannot hold (above 65504 in
``float16``) is an error naming its node type (typed graphs), node and column. ``shared_memory`` casts into the
segment; ``mmap`` maps a converted copy of the feature file, built once per machine in ``<dataset
cache>[-order-<kind>-v1]-x-<dtype>-v1`` (``...-v1-<node type>`` per type of a typed graph;
:func:`~.disk_cache.feature_file`).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from lightning_zerocopy.data.handles import AttributeHandle, HostGraphHandles, NodeOrderHandles
from lightning_zerocopy.data.host.disk_cache import (
    _check_cache_matches,
    _feature_file_handle,
    build_node_order_cache,
    feature_file,
)
from lightning_zerocopy.data.host.relabel import _compute_order, _labels, _relabel_rows_into, _Steps
from lightning_zerocopy.datasets.attributes import Attribute, AttributeKey
from lightning_zerocopy.gather.host_table import (
    FeatureOverflowError,
    FeatureTableHandle,
    HostFeatureTable,
    feature_dtype_name,
)
from lightning_zerocopy.gather.precision_loss import FeatureUnderflowError
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.graph.fused_csc import FusedCSCHandle, edge_perm_views, fuse_csc
from lightning_zerocopy.graph.reorder import NodeOrder
from lightning_zerocopy.graph.schema import EDGE, NODE, EdgeType, GraphSchema
from lightning_zerocopy.graph.shared_memory import NpyTensorHandle, TensorHandle, create_shared_tensor, share_tensor
from lightning_zerocopy.options import FeatureStorage, NodeOrderKind, check_choice, choices

__all__ = [
    "FeatureStorage",
    "NODE_ORDERS",
    "TypedArrays",
    "exchange_handles",
    "share_hetero_data",
    "share_host_data",
    "share_node_data",
    "shared_node_order",
    "type_feature_dir",
    "typed_arrays",
]

#: Accepted values of ``node_order``.
NODE_ORDERS: tuple[str, ...] = choices(NodeOrderKind)


@dataclass
class TypedArrays:
    """A loaded dataset's arrays keyed by type (an untyped dataset's under :data:`NODE` / :data:`EDGE`).

    Attributes:
        schema: its types (``input_type``: the labelled type; ``None`` for a typed link dataset).
        num_nodes: nodes per type.
        edge_index: per edge type, int64 ``[2, E]`` (row 0 source ids).
        x: features of the featured types.
        x_files: the ``.npy`` file each type's ``x`` is mapped from, where there is one.
        y: the input type's labels, or ``None``.
        data: the dataset's own object (node-order caches and splits read it).
        attributes: its other node- and edge-level tensors (an untyped dataset's ``edge_attr`` among them).
    """

    schema: GraphSchema
    num_nodes: dict[str, int]
    edge_index: dict[EdgeType, torch.Tensor]
    x: dict[str, torch.Tensor]
    x_files: dict[str, str]
    y: Optional[torch.Tensor]
    data: Any
    attributes: dict[AttributeKey, Attribute]


def typed_arrays(data: Any) -> TypedArrays:
    """The arrays of a loaded dataset keyed by type: a typed one's as they are, an untyped one's as its one type."""
    attributes = dict(getattr(data, "attributes", None) or {})
    if isinstance(data.edge_index, Mapping):  # HeteroNodeData / HeteroLinkData
        input_type = getattr(data, "input_type", None)
        schema = GraphSchema.typed(list(data.num_nodes), list(data.edge_index), input_type)
        return TypedArrays(schema, dict(data.num_nodes), {tuple(k): v for k, v in data.edge_index.items()},
                           dict(data.x), dict(data.x_files), _labels(data), data, attributes)  # fmt: skip
    files = {} if data.x_file is None else {NODE: data.x_file}
    if getattr(data, "edge_attr", None) is not None:  # the untyped contract's edge features: one more attribute
        attributes[AttributeKey("edge", EDGE, "edge_attr")] = Attribute(data.edge_attr)
    return TypedArrays(GraphSchema.untyped(), {NODE: int(data.num_nodes)}, {EDGE: data.edge_index}, {NODE: data.x},
                       files, _labels(data), data, attributes)  # fmt: skip


def type_feature_dir(base: Optional[os.PathLike], schema: GraphSchema, node_type: str) -> Optional[Path]:
    """Where ``mmap`` storage keeps ``node_type``'s converted features: ``base`` itself for an untyped graph."""
    if base is None:
        return None
    base = Path(base)
    return base if not schema.is_typed else base.parent / f"{base.name}-{node_type}"


def share_host_data(
    data: Any,
    feature_storage: FeatureStorage = "shared_memory",
    *,
    node_order: NodeOrderKind = "none",
    cache_dir: Optional[os.PathLike] = None,
    order: Optional[NodeOrder] = None,
    splits: Optional[Mapping[str, torch.Tensor]] = None,
    feature_dtype: Optional[torch.dtype] = None,
    feature_dir: Optional[os.PathLike] = None,
    dtype_key: str = "feature_dtype",
    attributes: Optional[Mapping[AttributeKey, Attribute]] = None,
) -> HostGraphHandles:
    """Build the CSC of every edge type of ``data`` and copy graphs, features, labels and splits into shared memory.

    Args:
        data: the dataset's arrays (``NodeData``, ``LinkData``, ``HeteroNodeData``, ``HeteroLinkData``); labels are
            shared when it has them.
        feature_storage: ``"shared_memory"`` copies the features into shared segments (RAM, can be pinned for the
            GPU); ``"mmap"`` maps the dataset's ``.npy`` feature files instead (larger than RAM, page cache).
        node_order: ``"none"`` keeps the dataset's ids; ``"bfs"`` / ``"degree"`` store graph, features and labels of
            a one-type graph in that order (see the module docstring).
        cache_dir: where the relabeled arrays are cached on disk, or ``None`` to relabel in memory (needed for
            ``mmap`` with a node order).
        order: the ``node_order`` of ``data`` computed before (:func:`shared_node_order`); ignored with ``cache_dir``.
        splits: the split tensors to share, by name (never renumbered); default: the node splits of ``data``.
        feature_dtype: the dtype the feature tables are stored in (``None``: the dataset's).
        feature_dir: where ``mmap`` storage keeps the features cast to ``feature_dtype`` (a typed graph's in
            ``<feature_dir>-<node type>``); needed for ``mmap`` when ``feature_dtype`` differs from the dataset's.
        dtype_key: how errors name ``feature_dtype`` (e.g. its YAML key).
        attributes: the node- and edge-level attributes to share (rows first, in the dataset's ids; each one
            segment); default: all of :func:`typed_arrays`'.

    Returns:
        The handles. The caller owns the segments and must call ``handles.unlink()`` once every local process has
        opened them; if this function fails, it unlinks what it had created.

    Raises:
        ValueError: a bad ``feature_storage`` / ``node_order`` / ``order`` or an impossible combination.
        FeatureOverflowError: a value does not fit ``feature_dtype`` (naming the node type of a typed graph).
    """
    check_choice(feature_storage, FeatureStorage, "feature_storage")
    check_choice(node_order, NodeOrderKind, "node_order")
    arrays = typed_arrays(data)
    schema = arrays.schema
    _check_options(arrays, feature_storage, node_order, cache_dir, order, feature_dtype, feature_dir, dtype_key)
    with ExitStack() as undo:

        def share(tensor: torch.Tensor, name: str) -> TensorHandle:
            _, handle = share_tensor(tensor.contiguous(), name=name)
            undo.callback(handle.unlink)
            return handle

        def table(node_type: str, source: Any, stored: torch.dtype) -> FeatureTableHandle:
            """One type's table: a mapped (converted) file, or a shared segment of ``source``'s rows."""
            dtype = stored if feature_dtype is None else feature_dtype
            try:
                if feature_storage == "mmap":
                    return feature_file(source, stored, dtype, type_feature_dir(feature_dir, schema, node_type), dtype_key)
                name = f"x_{node_type}" if schema.is_typed else "features"
                rows = source.open() if isinstance(source, NpyTensorHandle) else source.contiguous()
                handle = HostFeatureTable.share(rows, name=name, dtype=dtype, key=dtype_key).handle()
            except FeatureOverflowError as exc:
                if not schema.is_typed:
                    raise
                raise FeatureOverflowError(f"features of {node_type!r}", exc.node, exc.column, exc.value, dtype,
                                           dtype_key) from exc  # fmt: skip
            except FeatureUnderflowError as exc:
                if not schema.is_typed:
                    raise
                raise FeatureUnderflowError(f"features of {node_type!r}", exc.loss, dtype, dtype_key) from exc
            undo.callback(handle.unlink)
            return handle

        def source_of(node_type: str) -> Any:
            x_file = arrays.x_files.get(node_type)
            return NpyTensorHandle(x_file) if feature_storage == "mmap" and x_file else arrays.x[node_type]

        order_handles: Optional[NodeOrderHandles] = None
        y = arrays.y
        if node_order == "none":
            graphs = {}
            for edge_type, edge_index in arrays.edge_index.items():
                src, _, dst = edge_type
                ids = max(arrays.num_nodes[src], arrays.num_nodes[dst])  # one id space covering both endpoints
                graphs[edge_type] = CSCGraph.from_edge_index(edge_index, ids).share()
                undo.callback(graphs[edge_type].unlink)
            tables = {t: table(t, source_of(t), x.dtype) for t, x in arrays.x.items()}
            labels = None if y is None else share(y.to(torch.int64), "labels")
        elif cache_dir is not None:
            cache = build_node_order_cache(arrays.data, node_order, cache_dir)
            _check_cache_matches(cache, arrays.data)
            x = arrays.data.x
            graph = CSCGraph(cache.tensor("indptr"), cache.tensor("indices"), cache.tensor("edge_perm"),
                             arrays.data.num_nodes).share()  # fmt: skip
            undo.callback(graph.unlink)
            graphs = {schema.edge_types[0]: graph}
            tables = {schema.node_types[0]: table(schema.node_types[0], _feature_file_handle(cache, x.dtype), x.dtype)}
            labels = share(cache.tensor("y"), "labels") if cache.has("y") else None
            order_handles = NodeOrderHandles(
                node_order, share(cache.tensor("order"), "node_order"), share(cache.tensor("rank"), "node_rank")
            )
        else:
            (edge_type,), (node_type,) = schema.edge_types, schema.node_types
            x = arrays.x[node_type]
            with _Steps(node_order, ["building CSC", "ordering nodes", "relabeling graph", "relabeling rows"]) as steps:
                graph = CSCGraph.from_edge_index(arrays.edge_index[edge_type], arrays.num_nodes[node_type])
                steps.next()
                if order is None:
                    order = _compute_order(graph, node_order)
                steps.next()
                graphs = {edge_type: order.relabel_graph(graph).share()}
                undo.callback(graphs[edge_type].unlink)
                steps.next()
                dtype = x.dtype if feature_dtype is None else feature_dtype
                shared_x, x_handle = create_shared_tensor(x.shape, dtype, name="features")
                undo.callback(x_handle.unlink)
                tables = {node_type: HostFeatureTable(shared_x, handle=FeatureTableHandle(x_handle)).handle()}
                _relabel_rows_into(x, order.order, shared_x, steps.bar, dtype_key)
                labels = None if y is None else share(order.relabel_rows(y.to(torch.int64)), "labels")
                order_handles = NodeOrderHandles(
                    node_order, share(order.order, "node_order"), share(order.rank, "node_rank")
                )

        graph_handles = {et: graphs[et].handle() for et in schema.edge_types}
        fused: Optional[FusedCSCHandle] = None
        if schema.is_typed and not schema.one_type:

            def segment(name: str, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, TensorHandle]:
                tensor, handle = create_shared_tensor((numel,), dtype, name=name)
                undo.callback(handle.unlink)
                return tensor, handle

            in_order = {et: graphs[et] for et in schema.edge_types}
            fused = fuse_csc(in_order, arrays.num_nodes, schema.node_types, allocate=segment).handle()
            graph_handles = edge_perm_views(fused, graph_handles)  # the edge ids once, in the fused CSC
            for graph in in_order.values():
                graph.handle().edge_perm.unlink()  # type: ignore[union-attr]
            in_order, graphs = {}, {}  # drop this process's mappings of those segments
        if splits is None:
            splits = {name: arrays.data.split(name).to(torch.int64) for name in ("train", "val", "test")}
        shared_splits = {name: share(tensor, f"{name.replace('.', '_')}_idx") for name, tensor in splits.items()}
        chosen = arrays.attributes if attributes is None else attributes
        shared_attributes = tuple((key, AttributeHandle(share(a.rows, f"attr_{index}"), a.dim))
                                  for index, (key, a) in enumerate(chosen.items()))  # fmt: skip
        handles = HostGraphHandles(
            schema=schema,
            num_nodes=tuple((t, int(n)) for t, n in arrays.num_nodes.items()),
            graphs=tuple((et, graph_handles[et]) for et in schema.edge_types),
            tables=tuple(tables.items()),  # the dataset's order of featured types
            labels=labels,
            splits=shared_splits,
            attributes=shared_attributes,
            node_order=order_handles,
            fused=fused,
        )
        undo.pop_all()  # success: the caller owns the segments now
    return handles


def _check_options(
    arrays: TypedArrays,
    feature_storage: str,
    node_order: str,
    cache_dir: Optional[os.PathLike],
    order: Optional[NodeOrder],
    feature_dtype: Optional[torch.dtype],
    feature_dir: Optional[os.PathLike],
    dtype_key: str,
) -> None:
    """Refuse option combinations the host copy cannot build (one line each)."""
    schema = arrays.schema
    if feature_storage == "mmap":
        missing = [t for t in arrays.x if t not in arrays.x_files]
        if missing and not schema.is_typed:
            raise ValueError(
                "`feature_storage`='mmap' needs a dataset whose features are an .npy file (e.g. SyntheticGraph,"
                " OGBNodeDataset); use 'shared_memory' for this dataset"
            )
        if missing:
            raise ValueError(f"`feature_storage`='mmap' needs an .npy feature file for every featured node type; "
                             f"{missing} have none (use 'shared_memory')")  # fmt: skip
    if node_order != "none" and not schema.one_type:
        raise ValueError(f"`node_order`={node_order!r} needs a graph of one node type and one edge type; this one "
                         f"has {len(schema.node_types)} node types (use 'none')")  # fmt: skip
    if feature_storage == "mmap" and node_order != "none" and cache_dir is None:
        raise ValueError(
            f"`node_order`={node_order!r} with `feature_storage`='mmap' needs a dataset with an on-disk cache"
            " (e.g. SyntheticGraph, OGBNodeDataset) to hold the relabeled feature file; use"
            " feature_storage='shared_memory' or node_order='none'"
        )
    if order is not None and order.num_nodes != arrays.num_nodes[schema.node_types[0]]:
        raise ValueError(f"`order` covers {order.num_nodes} nodes but the data has {arrays.num_nodes[schema.node_types[0]]}")
    if feature_storage == "mmap" and feature_dtype is not None and feature_dir is None:
        homeless = [t for t, x in arrays.x.items() if x.dtype != feature_dtype]
        if homeless:
            what = f" of {homeless[0]!r}" if schema.is_typed else ""
            raise ValueError(
                f"`{dtype_key}`={feature_dtype_name(feature_dtype)!r} with `feature_storage`='mmap' needs a "
                f"dataset with an on-disk cache (e.g. SyntheticGraph, OGBNodeDataset) to hold the converted feature "
                f"file{what} (the dataset stores {feature_dtype_name(arrays.x[homeless[0]].dtype)}); use "
                "feature_storage='shared_memory'"
            )


#: The names this function had for untyped and typed data.
share_node_data = share_hetero_data = share_host_data


def shared_node_order(handles: HostGraphHandles) -> Optional[NodeOrder]:
    """The node order ``handles`` are stored in, mapped (``None`` without one): give it to a later
    :func:`share_host_data` of the same data to skip computing it again. Open while the names exist."""
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
