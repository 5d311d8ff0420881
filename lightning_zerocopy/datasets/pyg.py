"""Any PyG ``Data`` object with train/val/test masks (or index tensors) as a :class:`NodeDataset`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import torch
from torch_geometric.data import Data, Dataset

from lightning_zerocopy.datasets.attributes import pyg_attributes, split_is_mask
from lightning_zerocopy.datasets.base import InputDataError, NodeData, NodeDataset
from lightning_zerocopy.datasets.saved_graph import GraphFile, load_saved_graph

_SPLIT_NAMES = {"train": ("train_mask", "train_idx"), "val": ("val_mask", "val_idx"), "test": ("test_mask", "test_idx")}
_SPLIT_IDS = ("train_idx", "val_idx", "test_idx")  # the splits' ids (masks are node attributes, as in PyG)


def _split_attribute(data: Data, split: str) -> str:
    """The attribute that defines ``split``: ``<split>_mask`` if present, else ``<split>_idx``."""
    mask_name, idx_name = _SPLIT_NAMES[split]
    return mask_name if mask_name in data else idx_name


def _as_ids(values: torch.Tensor, name: str, what: str = "node id", origin: str = "") -> torch.Tensor:
    """``values`` as int64, refusing a floating value that is not an integer (``2.5`` would become node 2).

    Raises:
        InputDataError: naming ``data.<name>``, the first such value and where it is.
    """
    if values.is_floating_point():
        fractional = values != values.round()  # NaN too
        if bool(fractional.any()):
            where = _first(fractional)
            raise InputDataError(
                f"{origin}data.{name} holds {float(values[where]):g}, which is not a {what} (at {name}{list(where)}): "
                "store integers"
            )
    return values.to(torch.int64)


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    """The index of the first ``True`` of ``mask``, column by column for an ``edge_index`` (edge after edge)."""
    if mask.dim() == 2 and mask.shape[0] == 2:
        column = int(mask.any(0).nonzero()[0])
        return (0 if bool(mask[0, column]) else 1, column)
    return tuple(mask.nonzero()[0].tolist())


def _check_nodes(data: Data, origin: str) -> int:
    """The node count (``data.x``'s rows), checked against ``data.num_nodes`` (when set), ``data.y`` and the node ids
    of ``data.edge_index``: the first mismatch raises :class:`InputDataError` naming the field and the value."""
    x, y = data.x, data.y
    if x.dim() != 2:
        raise InputDataError(f"{origin}data.x has shape {tuple(x.shape)}: node features are [num_nodes, num_features]")
    num_nodes = int(x.shape[0])
    stored = data.get("num_nodes")  # set by the user (PyG infers it from x otherwise)
    if stored is not None and int(stored) != num_nodes:
        raise InputDataError(
            f"{origin}data.x has {num_nodes:,} rows but data.num_nodes is {int(stored):,}: one row of features per node"
        )
    if y.numel() != num_nodes:
        raise InputDataError(
            f"{origin}data.x has {num_nodes:,} rows but data.y has {y.numel():,} entries: one row of features and one "
            "label per node"
        )
    edge_index = data.edge_index
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise InputDataError(f"{origin}data.edge_index has shape {tuple(edge_index.shape)}: it must be [2, num_edges]")
    edge_index = _as_ids(edge_index, "edge_index", origin=origin)
    if edge_index.numel():
        low, high = torch.aminmax(edge_index)
        if int(low) < 0 or int(high) >= num_nodes:
            row, column = _first((edge_index < 0) | (edge_index >= num_nodes))
            raise InputDataError(
                f"{origin}data.edge_index holds node id {int(edge_index[row, column])} at edge_index[{row}, {column}] "
                f"(a {('source', 'destination')[row]}), but data.x has {num_nodes:,} rows (node ids 0 to "
                f"{num_nodes - 1:,})"
            )
    return num_nodes


def _split_ids(data: Data, split: str, origin: str = "") -> torch.Tensor:
    mask_name, idx_name = _SPLIT_NAMES[split]
    if mask_name in data:
        mask = data[mask_name]
        if mask.dim() != 1:
            raise InputDataError(
                f"{origin}data.{mask_name} has shape {tuple(mask.shape)}; pick one column, e.g. data.{mask_name}[:, 0]"
            )
        if mask.numel() != data.x.shape[0]:
            raise InputDataError(
                f"{origin}data.{mask_name} has {mask.numel():,} entries but data.x has {data.x.shape[0]:,} rows: a mask "
                "holds one entry per node"
            )
        return mask.nonzero().view(-1)
    if idx_name in data:
        idx = torch.as_tensor(data[idx_name]).view(-1)
        if idx.dtype == torch.bool:
            raise InputDataError(
                f"{origin}data.{idx_name} is a boolean tensor: store it as data.{mask_name}, or store node ids"
            )
        return _as_ids(idx, idx_name, origin=origin)
    raise ValueError(f"the PyG Data object has neither `{mask_name}` nor `{idx_name}`: add one to define the {split} split")


def graph_of(data: Union[Data, Dataset, GraphFile], accepted: str) -> Data:
    """``data`` as one PyG ``Data``: a path is loaded with ``torch.load``, a ``Dataset`` gives its graph 0.

    Raises:
        TypeError: anything else (the message says ``data`` must be ``accepted``).
    """
    if isinstance(data, (str, Path)):
        data = load_saved_graph(Path(data), "a PyG Data object")
    if isinstance(data, Dataset):
        data = data[0]
    if not isinstance(data, Data):
        raise TypeError(f"data must be {accepted}, got {type(data)}")
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
        return f"data.{_split_attribute(self.data, split)}"

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
        _check_nodes(d, origin)
        return NodeData(
            edge_index=_as_ids(d.edge_index, "edge_index", origin=origin),
            x=d.x if d.x.dtype in (torch.float32, torch.float16, torch.bfloat16) else d.x.float(),
            y=_as_ids(d.y.view(-1), "y", "class (an integer label, -1 for unlabeled)", origin),
            train_idx=_split_ids(d, "train", origin),
            val_idx=_split_ids(d, "val", origin),
            test_idx=_split_ids(d, "test", origin),
            edge_attr=d.get("edge_attr"),
            attributes=pyg_attributes(d, ("x", "y", "edge_attr", *_SPLIT_IDS), origin=origin),
        )
