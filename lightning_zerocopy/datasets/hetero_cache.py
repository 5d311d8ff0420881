"""The on-disk layout of a heterogeneous dataset's cache, and PyG's ``ToUndirected`` on edge dictionaries.

A cached heterogeneous dataset is an :class:`~lightning_zerocopy.datasets.base.ArrayCache` holding::

    x.<node type>.npy                       features of each node type that has them, [num_nodes[type], F_type]
    edge_index.<src>__<rel>__<dst>.npy      int64 [2, E] per edge type (PyG's string form of the type)
    y.npy                                   int64 labels of the input type (-1: unlabeled)
    train_idx.npy, val_idx.npy, test_idx.npy  int64 ids of input-type nodes
    meta.json                               node_types, edge_types (string form), num_nodes, num_features,
                                            input_type, num_classes, and the builder's own configuration

The type lists in ``meta.json`` keep the order of the types (PyG's ``metadata()`` order); the arrays are opened
memory-mapped by :func:`hetero_data_from_cache`, the feature files recorded in ``HeteroNodeData.x_files``.
Type names become file names, so :func:`check_type_name` refuses names that cannot be one.

:func:`to_undirected_types` adds reverse edges the way PyG's ``ToUndirected`` does on a ``HeteroData``: an edge type
between two different node types gets a reverse type ``(dst, "rev_<rel>", src)`` holding the transposed edges; an
edge type within one node type (``paper__cites__paper``) gets no reverse type: its edges are made undirected in
place (both directions, duplicates removed, sorted by source then destination, as ``to_undirected`` coalesces).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np
import torch

from lightning_zerocopy.datasets.base import ArrayCache, BuiltIntoCache, DatasetFileError, write_labels_and_splits
from lightning_zerocopy.datasets.hetero import (
    EdgeType,
    HeteroNodeData,
    HeteroNodeDataset,
    edge_type_str,
    parse_edge_type,
)

__all__ = [
    "CachedHeteroNodeDataset",
    "check_type_name",
    "coalesce_undirected",
    "edge_index_name",
    "hetero_data_from_cache",
    "hetero_meta",
    "open_typed_graph",
    "reverse_relation",
    "to_undirected_types",
    "typed_graph_entries",
    "typed_graph_meta",
    "with_reverse_types",
    "write_edge_index",
    "write_edge_types",
    "write_labels_and_splits",
    "x_name",
]

_SPLIT_ARRAYS = ("train_idx", "val_idx", "test_idx")
_Own = TypeVar("_Own")
_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")


def check_type_name(name: str, what: str) -> str:
    """``name`` if it can name a node type or relation in the cache (letters, digits, ``_`` and ``-``, no ``__``).

    Args:
        what: how the message names it, e.g. ``"node type"``.

    Raises:
        ValueError: naming ``name`` and what to change.
    """
    if not _NAME.match(name) or "__" in name or name.startswith("_") or name.endswith("_"):
        raise ValueError(
            f"{what} {name!r} cannot be stored: use letters, digits, '_' and '-', with no '__' (it separates the "
            "parts of an edge type) and no leading or trailing '_'"
        )
    return name


def x_name(node_type: str) -> str:
    """The cache array of ``node_type``'s features: ``x.<node type>``."""
    return f"x.{node_type}"


def edge_index_name(edge_type: EdgeType) -> str:
    """The cache array of an edge type: ``edge_index.<src>__<rel>__<dst>``."""
    return f"edge_index.{edge_type_str(edge_type)}"


def reverse_relation(edge_type: EdgeType) -> EdgeType:
    """The reverse type PyG's ``ToUndirected`` adds for an edge type between two node types:
    ``("author", "writes", "paper")`` → ``("paper", "rev_writes", "author")``."""
    src, rel, dst = edge_type
    return dst, f"rev_{rel}", src


def coalesce_undirected(index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """``index`` ``[2, E]`` of one node type with every edge in both directions, each pair once, sorted by source
    then destination (PyG's ``to_undirected``; self-loops are kept once)."""
    if index.numel() == 0:
        return index.clone()
    key = torch.cat([index[0] * num_nodes + index[1], index[1] * num_nodes + index[0]])
    key = torch.unique(key)  # sorted
    return torch.stack([key // num_nodes, key % num_nodes])


def to_undirected_types(
    edge_index: Mapping[EdgeType, torch.Tensor], num_nodes: Mapping[str, int]
) -> dict[EdgeType, torch.Tensor]:
    """The edge types of ``edge_index`` with reverse edges added as PyG's ``ToUndirected`` adds them (see the
    module docstring): the given types first, in their order (a same-type one made undirected), then the
    ``rev_`` types in the order of the types they reverse. A ``rev_`` type that is already present is kept as
    given and not added again.
    """
    result: dict[EdgeType, torch.Tensor] = {}
    reverse: dict[EdgeType, torch.Tensor] = {}
    for edge_type, index in edge_index.items():
        src, _, dst = edge_type
        if src == dst:
            result[edge_type] = coalesce_undirected(index, num_nodes[src])
        else:
            result[edge_type] = index
            rev = reverse_relation(edge_type)
            if rev not in edge_index:
                reverse[rev] = torch.stack([index[1], index[0]])
    result.update(reverse)
    return result


def with_reverse_types(edge_types: Sequence[EdgeType]) -> list[EdgeType]:
    """``edge_types`` and, after them, the reverse types :func:`to_undirected_types` adds (those not present)."""
    present = set(edge_types)
    extra = [reverse_relation(t) for t in edge_types if t[0] != t[2] and reverse_relation(t) not in present]
    return list(edge_types) + extra


def write_edge_types(
    out: Path, edge_type: EdgeType, index: torch.Tensor, num_nodes: Mapping[str, int], add_reverse: bool
) -> dict[str, int]:
    """Save the edges ``index`` of ``edge_type`` into ``out`` (:func:`write_edge_index`), with ``add_reverse`` as
    :func:`to_undirected_types` makes them; return the edges written per type (``src__rel__dst``)."""
    types = to_undirected_types({edge_type: index}, num_nodes) if add_reverse else {edge_type: index}
    del index
    written = {}
    for written_type, written_index in types.items():
        write_edge_index(out, written_type, written_index)
        written[edge_type_str(written_type)] = int(written_index.shape[1])
    return written


def write_edge_index(out: Path, edge_type: EdgeType, index: torch.Tensor) -> None:
    """Save ``index`` (int64 ``[2, E]``, any strides) as the cache array of ``edge_type`` in the directory ``out``,
    row by row (no contiguous copy of a transposed or flipped ``index``)."""
    target = np.lib.format.open_memmap(
        out / f"{edge_index_name(edge_type)}.npy", mode="w+", dtype=np.int64, shape=(2, int(index.shape[1]))
    )
    view = torch.from_numpy(target)
    view[0] = index[0]
    view[1] = index[1]
    target.flush()
    del view, target


def typed_graph_entries(
    num_nodes: Mapping[str, int], edge_types: Sequence[EdgeType], num_features: Mapping[str, int], **entries: Any
) -> dict[str, Any]:
    """The ``meta.json`` of a heterogeneous cache (node or link): the graph's entries (the type lists in order, the
    node counts and the feature widths, read back by :func:`typed_graph_meta`) and the task's ``entries`` (a link
    cache's: ``edge_type``, in string form, and each split's :func:`~lightning_zerocopy.datasets.links.save_link_split`
    entry under ``splits``; a node cache's: :func:`hetero_meta`'s), with the builder's configuration."""
    return dict(
        node_types=list(num_nodes),
        edge_types=[edge_type_str(t) for t in edge_types],
        num_nodes={k: int(v) for k, v in num_nodes.items()},
        num_features={k: int(v) for k, v in num_features.items()},
        **entries,
    )


def hetero_meta(
    num_nodes: Mapping[str, int],
    edge_types: Sequence[EdgeType],
    input_type: str,
    num_features: Mapping[str, int],
    num_classes: int,
    **extra: Any,
) -> dict[str, Any]:
    """The ``meta.json`` of a heterogeneous node cache: :func:`typed_graph_entries`, the input type and the classes,
    plus ``extra`` (the builder's configuration)."""
    return typed_graph_entries(num_nodes, edge_types, num_features, **extra, input_type=input_type,
                               num_classes=int(num_classes))  # fmt: skip


def typed_graph_meta(meta: dict[str, Any]) -> tuple[list[str], list[EdgeType], dict[str, int], list[str]]:
    """The node types, edge types, node counts and featured types of a heterogeneous cache's ``meta.json``
    (node or link).

    Raises:
        KeyError, TypeError, ValueError: ``meta`` lacks one of them or holds it in another form.
    """
    node_types = list(meta["node_types"])
    edge_types = [parse_edge_type(t) for t in meta["edge_types"]]
    counts = {t: int(meta["num_nodes"][t]) for t in node_types}
    return node_types, edge_types, counts, list(meta["num_features"])


def open_typed_graph(
    cache: ArrayCache, kind: str, own: Callable[[dict[str, Any]], _Own]
) -> tuple[dict[str, Any], _Own]:
    """The graph of a heterogeneous cache (node or link), every array memory-mapped copy-on-write: the data class's
    ``num_nodes``, ``edge_index``, ``x`` and ``x_files``; and what ``own`` reads from ``meta.json`` for the task.

    Args:
        kind: what the cache holds, for the message (``"a heterogeneous dataset"``).

    Raises:
        DatasetFileError: ``meta.json`` lacks a key (``own`` raising ``KeyError``, ``TypeError`` or ``ValueError``
            too), or an array is missing or damaged; the message says to delete the cache directory.
    """
    meta = cache.meta()
    try:
        _, edge_types, counts, featured = typed_graph_meta(meta)
        task = own(meta)
    except (KeyError, TypeError, ValueError) as exc:
        raise DatasetFileError(
            cache.path / ArrayCache.META,
            f"is not {kind}'s metadata ({type(exc).__name__}: {exc}): the cache {cache.path} is "
            "damaged or of another kind; delete that directory and it is built again",
        ) from exc
    graph = dict(
        num_nodes=counts,
        edge_index={t: cache.tensor(edge_index_name(t)) for t in edge_types},
        x={t: cache.tensor(x_name(t)) for t in featured},
        x_files={t: str(cache.file(x_name(t))) for t in featured},
    )
    return graph, task


def hetero_data_from_cache(cache: ArrayCache) -> HeteroNodeData:
    """Open a heterogeneous cache (the layout of the module docstring) as a :class:`HeteroNodeData`, every array
    memory-mapped copy-on-write.

    Raises:
        DatasetFileError: ``meta.json`` lacks a key, or an array is missing or damaged (the message says to delete
            the cache directory).
    """
    graph, input_type = open_typed_graph(cache, "a heterogeneous dataset", lambda meta: str(meta["input_type"]))
    splits = {name: cache.tensor(name) for name in _SPLIT_ARRAYS}
    return HeteroNodeData(**graph, input_type=input_type, y=cache.tensor("y"), **splits)


class CachedHeteroNodeDataset(BuiltIntoCache, HeteroNodeDataset):
    """A :class:`HeteroNodeDataset` built once into an :class:`ArrayCache` (``self.cache``) by ``_write`` and
    memory-mapped from it afterwards (:func:`hetero_data_from_cache`).

    ``_write(out)`` writes the arrays of the module docstring's layout into ``out`` and returns
    :func:`hetero_meta`'s dictionary.
    """

    _open = staticmethod(hetero_data_from_cache)
