"""Heterogeneous batches through the pipeline's slots: a ``HeteroData`` travels as a flat ``Data`` and back.

The pipeline's slots, their growth, the producer's writes and the trainer's views are keyed by a batch's field names
(:mod:`lightning_zerocopy.pipeline.slots`). A heterogeneous batch names the same field (``x``, ``n_id``,
``edge_index``...) once per node or edge type, so the producer flattens it (:func:`flatten_hetero`): each store's
field becomes ``n<i>/<field>`` (node type ``i``) or ``e<i>/<field>`` (edge type ``i``), and the types themselves ride
along as the scalar :data:`HETERO_TYPES` (with the other scalars: ``batch_size``, the per-hop counts). Every flat
field has an axis of its own (:func:`is_typed_field`: the slot layout does not match its length against other
fields', which belong to other types); an edge store's fields with ``index`` in their name (``edge_index``,
``edge_label_index``, a user's ``[2, E]`` attribute) vary along their last dimension, as PyG concatenates them. The
trainer's side rebuilds the ``HeteroData`` of slot views (:func:`unflatten_hetero`), with the stores in the batch's type order.
"""

from __future__ import annotations

from typing import Any, Union

from torch_geometric.data import Data, HeteroData

__all__ = ["HETERO_TYPES", "flatten_hetero", "is_typed_field", "typed_var_dim", "unflatten_hetero"]

#: The scalar of a flattened heterogeneous batch that holds ``(node types, edge types)``.
HETERO_TYPES = "hetero_types"

_SEP = "/"


def is_typed_field(name: str) -> bool:
    """Whether ``name`` is a field of a flattened heterogeneous batch (``n<i>/...`` or ``e<i>/...``)."""
    return _SEP in name


def typed_var_dim(name: str, ndim: int) -> int:
    """The dimension along which a flattened field of ``ndim`` dimensions varies, by PyG's ``HeteroData.__cat_dim__``:
    the last one for an edge store's field with ``index`` in its name (``edge_index``, a link batch's
    ``edge_label_index``, a user's ``[2, E]`` edge attribute), else 0."""
    prefix, field = name.split(_SEP, 1)
    return ndim - 1 if prefix.startswith("e") and "index" in field else 0


def flatten_hetero(batch: HeteroData) -> Data:
    """``batch`` as a flat ``Data`` of the same tensors (no copy) and scalars, plus :data:`HETERO_TYPES`."""
    flat = Data()
    node_types, edge_types = batch.node_types, batch.edge_types
    for prefix, types in (("n", node_types), ("e", edge_types)):
        for index, key in enumerate(types):
            for field, value in batch[key].items():
                flat[f"{prefix}{index}{_SEP}{field}"] = value
    flat[HETERO_TYPES] = (tuple(node_types), tuple(tuple(et) for et in edge_types))
    return flat


def unflatten_hetero(batch: Data) -> Union[Data, HeteroData]:
    """The ``HeteroData`` a flat batch of :func:`flatten_hetero` stands for (its tensors, e.g. slot views, as they
    are); any other batch unchanged."""
    types: Any = batch.get(HETERO_TYPES) if isinstance(batch, Data) else None
    if types is None:
        return batch
    node_types, edge_types = types
    out = HeteroData()
    for key in (*node_types, *edge_types):
        out[key]  # creates the store: the types keep their order
    for name, value in batch.items():
        if name == HETERO_TYPES:
            continue
        prefix, field = name.split(_SEP, 1)
        index = int(prefix[1:])
        key = node_types[index] if prefix[0] == "n" else edge_types[index]
        out[key][field] = value
    return out
