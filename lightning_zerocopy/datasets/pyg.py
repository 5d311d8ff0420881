"""Any PyG ``Data`` object with train/val/test masks (or index tensors) as a :class:`NodeDataset`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch_geometric.data import Data, Dataset

from lightning_zerocopy.datasets.attributes import pyg_attributes, split_is_mask
from lightning_zerocopy.datasets.base import InputDataError, NodeData, NodeDataset, out_of_range_edge
from lightning_zerocopy.datasets.saved_graph import GraphFile, load_saved_graph

_SPLIT_NAMES = {"train": ("train_mask", "train_idx"), "val": ("val_mask", "val_idx"), "test": ("test_mask", "test_idx")}
_SPLIT_IDS = ("train_idx", "val_idx", "test_idx")  # the splits' ids (masks are node attributes, as in PyG)


def split_attribute(store: Any, split: str) -> str:
    """The attribute of a PyG store that defines ``split``: ``<split>_mask`` if present, else ``<split>_idx``."""
    mask_name, idx_name = _SPLIT_NAMES[split]
    return mask_name if mask_name in store else idx_name


def as_features(x: torch.Tensor) -> torch.Tensor:
    """Node features as the batches carry them: float32, float16 and bfloat16 as they are, others as float32."""
    return x if x.dtype in (torch.float32, torch.float16, torch.bfloat16) else x.float()


def as_ids(
    values: torch.Tensor, field: str, what: str = "node id", origin: str = "", at: Optional[str] = None
) -> torch.Tensor:
    """``values`` as int64, refusing a floating value that is not an integer (``2.5`` would become node 2).

    Args:
        field: how the message names the tensor, e.g. ``data.train_idx`` or ``data['paper'].train_idx``.
        at: the name the message gives the position (``(at edge_index[1, 7])``); ``None``: ``at [1, 7]``.

    Raises:
        InputDataError: naming ``field``, the first such value and where it is.
    """
    if values.is_floating_point():
        fractional = values != values.round()  # NaN too
        if bool(fractional.any()):
            where = _first(fractional)
            held = f"{origin}{field} holds {float(values[where]):g}"
            if at is not None:
                raise InputDataError(f"{held}, which is not a {what} (at {at}{list(where)}): store integers")
            raise InputDataError(f"{held} at {list(where)}, which is not a {what}: store integers")
    return values.to(torch.int64)


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    """The index of the first ``True`` of ``mask``, column by column for an ``edge_index`` (edge after edge)."""
    if mask.dim() == 2 and mask.shape[0] == 2:
        column = int(mask.any(0).nonzero()[0])
        return (0 if bool(mask[0, column]) else 1, column)
    return tuple(mask.nonzero()[0].tolist())


def node_count(store: Any, node: str, origin: str) -> Optional[int]:
    """Nodes of a PyG store (``node`` names it in messages): ``x``'s rows, checked against ``num_nodes`` where both are
    set; else ``num_nodes``; ``None`` where neither is.

    Raises:
        InputDataError: ``x`` is not 2-D, or ``num_nodes`` disagrees with its rows.
    """
    x, stored = store.get("x"), store.get("num_nodes")  # num_nodes: set by the user (PyG infers it from x otherwise)
    if x is None:
        return None if stored is None else int(stored)
    if x.dim() != 2:
        raise InputDataError(f"{origin}{node}.x has shape {tuple(x.shape)}: node features are [num_nodes, num_features]")
    if stored is not None and int(stored) != int(x.shape[0]):
        raise InputDataError(f"{origin}{node}.x has {int(x.shape[0]):,} rows but {node}.num_nodes is {int(stored):,}: "
                             "one row of features per node")  # fmt: skip
    return int(x.shape[0])


def _checked_edges(data: Data, origin: str) -> torch.Tensor:
    """``data.edge_index`` as int64, after checking the node count (``data.x``'s rows) against ``data.num_nodes`` (when
    set) and ``data.y``, and the edges' node ids against it: the first mismatch raises :class:`InputDataError` naming
    the field and the value."""
    num_nodes = node_count(data, "data", origin)
    if data.y.numel() != num_nodes:
        raise InputDataError(
            f"{origin}data.x has {num_nodes:,} rows but data.y has {data.y.numel():,} entries: one row of features and "
            "one label per node"
        )
    edge_index = data.edge_index
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise InputDataError(f"{origin}data.edge_index has shape {tuple(edge_index.shape)}: it must be [2, num_edges]")
    edge_index = as_ids(edge_index, "data.edge_index", origin=origin, at="edge_index")
    problem = out_of_range_edge(edge_index, num_nodes, "data.x has")
    if problem is not None:
        raise InputDataError(f"{origin}data.{problem}")
    return edge_index


def split_ids(
    store: Any, split: str, count: int, rows: str, origin: str, node: str = "data", what: str = "node id",
    owner: str = "the PyG Data object",
) -> torch.Tensor:  # fmt: skip
    """The ids of ``split`` of a PyG store (``node`` names it in messages): its boolean ``<split>_mask`` (one entry
    per node: ``count``; ``rows`` says whose rows that is) or its ``<split>_idx`` (of ``what``).

    Raises:
        InputDataError: a mask of another shape, a boolean ``<split>_idx``, ids that are not integers.
        ValueError: the store (``owner``) has neither.
    """
    mask_name, idx_name = _SPLIT_NAMES[split]
    if mask_name in store:
        mask = store[mask_name]
        if mask.dim() != 1:
            raise InputDataError(f"{origin}{node}.{mask_name} has shape {tuple(mask.shape)}; pick one column, e.g. "
                                 f"{node}.{mask_name}[:, 0]")  # fmt: skip
        if mask.numel() != count:
            raise InputDataError(f"{origin}{node}.{mask_name} has {mask.numel():,} entries but {rows}: a mask holds one "
                                 "entry per node")  # fmt: skip
        return mask.nonzero().view(-1)
    typed = node != "data"
    if idx_name in store:
        idx = torch.as_tensor(store[idx_name]).view(-1)
        if idx.dtype == torch.bool:
            raise InputDataError(f"{origin}{node}.{idx_name} is a boolean tensor: store it as {node}.{mask_name}, or "
                                 "store node ids")  # fmt: skip
        return as_ids(idx, f"{node}.{idx_name}", what, origin, at=None if typed else idx_name)
    raise ValueError(f"{owner} has neither `{mask_name}` nor `{idx_name}`: add one {f'to {node} ' if typed else ''}to "
                     f"define the {split} split")  # fmt: skip


def graph_of(data: Any, accepted: str, kind: type = Data, hint: str = "") -> Any:
    """``data`` as one PyG ``kind`` (``Data`` or ``HeteroData``): a path is loaded with ``torch.load``, a ``Dataset``
    gives its graph 0.

    Raises:
        TypeError: anything else (the message says ``data`` must be ``accepted``, then ``hint``).
    """
    if isinstance(data, (str, Path)):
        data = load_saved_graph(Path(data), f"a PyG {kind.__name__} object")
    if isinstance(data, Dataset):
        data = data[0]
    if not isinstance(data, kind):
        raise TypeError(f"data must be {accepted}, got {type(data)}{hint}")
    return data


class PyGNodeDataset(NodeDataset):
    """Wraps a PyG ``Data`` (or the first graph of a PyG ``Dataset``, or a ``torch.save``d ``Data`` file).

    The graph needs ``x`` (float64 or integer features are converted to float32), ``y``, ``edge_index`` and, per split, a boolean ``<split>_mask`` or an index
    tensor ``<split>_idx`` (``train``, ``val``, ``test``). Every other node- and edge-level tensor (``edge_attr``,
    ``edge_weight``, masks, ...) reaches the batches, as PyG's loaders carry it (:mod:`~.attributes`).

    Args:
        data: the ``Data`` object, a PyG ``Dataset`` (its graph 0 is used) or the path of a ``.pt`` file.
        num_classes: number of classes; default: the largest label + 1.
    """

    def __init__(self, data: Union[Data, Dataset, GraphFile], num_classes: Optional[int] = None) -> None:
        self._origin = f"{data}: " if isinstance(data, (str, Path)) else ""  # errors name the file
        data = graph_of(data, "a torch_geometric Data, Dataset or a path to a saved Data")
        for key in ("x", "y", "edge_index"):
            if data.get(key) is None:
                raise ValueError(f"the PyG Data object has no `{key}`")
        self.data = data
        y = data.y.view(-1)
        self._num_classes = int(num_classes) if num_classes is not None else int(y.max()) + 1

    @property
    def num_features(self) -> int:
        return int(self.data.x.shape[1])

    @property
    def num_classes(self) -> int:
        return self._num_classes

    def split_source(self, split: str) -> str:
        """The ``Data`` attribute that defines the split, e.g. ``data.train_mask``."""
        return f"data.{split_attribute(self.data, split)}"

    def split_is_mask(self, split: str) -> bool:
        """Whether ``split`` is a boolean mask (batches' ``input_id`` then holds node ids, as in PyG)."""
        return split_is_mask(self.data, split)

    def load(self) -> NodeData:
        """The graph's arrays.

        Raises:
            InputDataError: a field that cannot be trained on (naming the field and its first bad value): a
                non-integer or out-of-range node id in ``edge_index``, ``x`` with another row count than ``y`` (or
                ``num_nodes``, or a mask), a non-integer label.
        """
        d, origin = self.data, self._origin
        edge_index = _checked_edges(d, origin)
        rows = f"data.x has {d.x.shape[0]:,} rows"
        return NodeData(
            edge_index=edge_index,
            x=as_features(d.x),
            y=as_ids(d.y.view(-1), "data.y", "class (an integer label, -1 for unlabeled)", origin, at="y"),
            train_idx=split_ids(d, "train", d.x.shape[0], rows, origin),
            val_idx=split_ids(d, "val", d.x.shape[0], rows, origin),
            test_idx=split_ids(d, "test", d.x.shape[0], rows, origin),
            edge_attr=d.get("edge_attr"),
            attributes=pyg_attributes(d, ("x", "y", "edge_attr", *_SPLIT_IDS), origin=origin),
        )
