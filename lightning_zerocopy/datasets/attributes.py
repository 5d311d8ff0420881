"""Every node- and edge-level attribute of a user's graph, found as PyG's loaders find them, for the batches.

PyG's ``NeighborLoader`` / ``LinkNeighborLoader`` filter the input ``Data`` / ``HeteroData`` into each batch
(``filter_data`` / ``filter_hetero_data`` in ``torch_geometric/loader/utils.py``): every attribute a store calls a
node attribute (``store.is_node_attr(key)``: its size along ``__cat_dim__`` is the store's ``num_nodes``; for an
untyped ``Data`` whose node and edge counts are equal, only a name without ``"edge"``) is indexed by ``n_id``, every
edge attribute (``is_edge_attr``) by ``e_id``. :func:`pyg_attributes` asks the user's stores exactly that and hands
the host copy a dict ``AttributeKey(level, type, name) -> Attribute`` (GraphBolt's ``FeatureKey(domain, type,
name)``); an untyped graph's keys use its one node type ``_N`` and edge type ``("_N", "_E", "_N")``.

What PyG carries and this does not (one warning naming them, at load): graph-level values (a tensor of another size,
a string, a number: PyG copies them unchanged into every batch; read them from the dataset instead), and node- or
edge-level values that are not tensors (lists; a numpy array is converted). Refused in one line: an attribute named
like a field the loader sets in every batch (``n_id``, ``e_id``, ``input_id``...; PyG would keep the user's values
under that name), unless the ``attributes`` key leaves it out.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Collection, Literal, Mapping, Optional, Union

import torch

from lightning_zerocopy.datasets.base import InputDataError
from lightning_zerocopy.graph.schema import EDGE, NODE, AttributeKey

__all__ = [
    "Attribute",
    "AttributeChoice",
    "AttributeKey",
    "BATCH_FIELDS",
    "LINK_FIELDS",
    "check_attribute_choice",
    "check_attribute_names",
    "check_attribute_rows",
    "pyg_attributes",
    "select_attributes",
    "split_is_mask",
]

#: What the ``attributes`` key of a DataModule takes: every attribute, none, or these names (of any type).
AttributeChoice = Union[Literal["all", "none"], list[str]]

#: The fields the loaders set in every batch: an attribute of the same name is refused (one line).
BATCH_FIELDS = frozenset({"n_id", "e_id", "input_id", "batch_size", "num_sampled_nodes", "num_sampled_edges",
                          "num_nodes"})  # fmt: skip
#: The fields a link batch adds (PyG's ``LinkNeighborLoader``'s).
LINK_FIELDS = frozenset({"edge_label_index", "edge_label", "edge_label_query", "src_index", "dst_pos_index",
                         "dst_neg_index"})  # fmt: skip


@dataclass(frozen=True)
class Attribute:
    """One node- or edge-level tensor of the user's graph.

    Attributes:
        value: the tensor as the user stored it (any dtype and trailing shape).
        dim: the dimension that runs over the nodes or edges (PyG's ``__cat_dim__``: ``-1`` for a name with
            ``index`` on an untyped graph or an edge store, else 0), non-negative.
    """

    value: torch.Tensor
    dim: int = 0

    @property
    def rows(self) -> torch.Tensor:
        """``value`` with the node/edge dimension first (a view): row ``i`` belongs to node or edge ``i``."""
        return self.value.movedim(self.dim, 0)


def pyg_attributes(
    data: Any, carried: Collection[str], labelled_type: Optional[str] = None, origin: str = ""
) -> dict[AttributeKey, Attribute]:
    """The node- and edge-level tensors of a PyG ``Data`` or ``HeteroData``, by PyG's rules (module docstring).

    Args:
        data: the user's graph.
        carried: names the dataset contract carries itself (e.g. ``x``, ``y``, ``edge_attr``; ``edge_index`` and
            ``num_nodes`` are never attributes); ``y`` only on ``labelled_type`` where that is given (a typed graph).
        labelled_type: the node type whose ``y`` is the labels (``None``: ``carried`` applies to every store).
        origin: prefix of the warning (e.g. the file the graph came from).

    Warns:
        UserWarning: once, naming every attribute that does not reach the batches and why.
    """
    found: dict[AttributeKey, Attribute] = {}
    skipped: list[str] = []
    typed = hasattr(data, "node_stores") and hasattr(data, "edge_types")  # HeteroData (no PyG import here)
    stores = [*data.node_stores, *data.edge_stores] if typed else [data._store]
    for store in stores:
        store_type = getattr(store, "_key", None) if typed else None
        for name in list(store.keys()):
            if name in ("edge_index", "num_nodes", "adj_t") or _carried(name, carried, store_type, labelled_type):
                continue
            level = "node" if store.is_node_attr(name) else "edge" if store.is_edge_attr(name) else None
            where = store_type if typed else EDGE if level == "edge" else NODE
            key = AttributeKey(level or "node", where, name)
            value = store[name]
            tensor = None if level is None else _as_tensor(value)
            if tensor is None:
                skipped.append(f"{key.describe()} ({_what(value)})")
                continue
            dim = data.__cat_dim__(name, value, store)
            found[key] = Attribute(tensor, int(dim) % tensor.dim())
    if skipped:
        warnings.warn(f"{origin}left out of the batches: {'; '.join(skipped)}. Only node- and edge-level tensors reach "
                      "them (PyG's loaders would copy a graph-level value unchanged into every batch and index a list "
                      "per node); read these from the dataset", UserWarning, stacklevel=3)  # fmt: skip
    return found


def _carried(name: str, carried: Collection[str], store_type: Any, labelled_type: Optional[str]) -> bool:
    if name == "y" and labelled_type is not None:
        return store_type == labelled_type
    return name in carried


def _as_tensor(value: Any) -> Optional[torch.Tensor]:
    """``value`` as a plain dense tensor (a numpy array converted), or ``None`` for what cannot be one."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            return None
        return value.as_subclass(torch.Tensor) if type(value) is not torch.Tensor else value
    if type(value).__module__ == "numpy" and hasattr(value, "dtype"):
        try:
            return torch.as_tensor(value)
        except (TypeError, RuntimeError):
            return None
    return None


def _what(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if hasattr(value, "shape"):
        return f"a {type(value).__name__} of shape {list(value.shape)}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def split_is_mask(store: Any, split: str) -> bool:
    """Whether ``split`` of a PyG store is given as a boolean ``<split>_mask`` (then a batch's ``input_id`` holds node
    ids, as PyG's ``get_input_nodes`` makes them) rather than an index tensor ``<split>_idx`` (positions)."""
    return f"{split}_mask" in store


def check_attribute_choice(choice: Any, key: str) -> None:
    """``choice`` is ``"all"``, ``"none"`` or a list of names.

    Raises:
        ValueError: anything else (naming ``key``).
    """
    if choice in ("all", "none"):
        return
    if isinstance(choice, (list, tuple)) and all(isinstance(name, str) and name for name in choice):
        return
    raise ValueError(f"{key} must be 'all', 'none' or a list of attribute names (e.g. [edge_weight, train_mask]), "
                     f"got {choice!r}")  # fmt: skip


def select_attributes(
    attributes: Mapping[AttributeKey, Attribute], choice: AttributeChoice, key: str
) -> dict[AttributeKey, Attribute]:
    """The attributes ``choice`` keeps (a list keeps those names, of every type).

    Raises:
        InputDataError: a name in the list that no attribute has (naming ``key`` and those there are).
    """
    if choice == "all":
        return dict(attributes)
    if choice == "none":
        return {}
    names = set(choice)
    unknown = sorted(names - {k.name for k in attributes})
    if unknown:
        have = sorted({k.name for k in attributes})
        raise InputDataError(f"{key} names {unknown}, but the dataset has no such node or edge attribute (it has: "
                             f"{', '.join(have) if have else 'none'})")  # fmt: skip
    return {k: a for k, a in attributes.items() if k.name in names}


def check_attribute_names(
    attributes: Mapping[AttributeKey, Attribute], where: str, opt_out: str, link: bool = False
) -> None:
    """No attribute is named like a field the loader sets in every batch (a link batch's fields too, for ``link``).

    Raises:
        InputDataError: one line naming the attribute and ``opt_out`` (the key that leaves it out).
    """
    fields = BATCH_FIELDS | LINK_FIELDS if link else BATCH_FIELDS
    for key in attributes:
        if key.name in fields:
            raise InputDataError(f"{where}: {key.describe()} is named like the batch field {key.name!r} the loader "
                                 f"sets; rename it, or leave it out with {opt_out}")  # fmt: skip


def check_attribute_rows(
    attributes: Mapping[AttributeKey, Attribute], num_nodes: Mapping[str, int], num_edges: Mapping[Any, int], where: str
) -> None:
    """Every attribute has one row per node or edge of its type (a dataset's own attributes; PyG's are by rule).

    Raises:
        InputDataError: one line naming the attribute, its rows and the count it needs.
    """
    for key, attribute in attributes.items():
        counts = num_nodes if key.level == "node" else num_edges
        if key.type not in counts:
            raise InputDataError(f"{where}: {key.describe()} is a {key.level} attribute of {key.type!r}, which is not "
                                 f"a {key.level} type of the graph")  # fmt: skip
        rows, need = int(attribute.value.shape[attribute.dim]), int(counts[key.type])
        if rows != need:
            raise InputDataError(f"{where}: {key.describe()} has {rows:,} rows along dim {attribute.dim}, but there "
                                 f"are {need:,} {key.level}s: one row per {key.level}")  # fmt: skip
