"""A ring of preallocated batch buffers ("slots") shared once between a producer and the trainer.

A mini-batch is a PyG :class:`~torch_geometric.data.Data` whose tensors grow along one *axis* each: node-level
fields (``x``, ``y``, ``n_id``) along the number of sampled nodes, edge-level fields (``edge_index`` along its
second dimension, ``e_id``, ``edge_attr``) along the number of sampled edges, ``input_id`` along the number of
seeds, and small per-hop counters (``num_sampled_nodes``...) along their own length. A :class:`SlotLayout`
records that structure once (inferred from one real batch); a :class:`SlotRing` holds ``depth`` slots of that
layout, each with a capacity per axis. After the slots are shared, a batch crosses the process boundary as
``(slot index, axis sizes, small scalars)``: :meth:`SlotRing.view` turns those back into a ``Data`` of views, each
contiguous as in PyG's loaders (a field varying along a later dimension, ``edge_index``, is stored flat:
:meth:`FieldSpec.buffer`).

Slots live in GPU memory when the ring is on a CUDA device (shared with a worker over CUDA IPC) and in shared
host memory otherwise (``Tensor.share_memory_``: a file descriptor, never a name under ``/dev/shm``).

A ``HeteroData`` batch travels as a flat ``Data`` and back. The layout, the growth, the producer's writes and the
trainer's views are keyed by field names, and a heterogeneous batch names the same field (``x``, ``n_id``,
``edge_index``...) once per node or edge type, so the producer flattens it (:func:`flatten_hetero`): each store's
field becomes ``n<i>/<field>`` (node type ``i``) or ``e<i>/<field>`` (edge type ``i``), and the types themselves ride
along as the scalar :data:`HETERO_TYPES` (with the other scalars: ``batch_size``, the per-hop counts). Every flat
field has an axis of its own (:func:`is_typed_field`: the layout does not match its length against other fields',
which belong to other types); an edge store's fields with ``index`` in their name (``edge_index``,
``edge_label_index``, a user's ``[2, E]`` attribute) vary along their last dimension, as PyG concatenates them. The
trainer's side rebuilds the ``HeteroData`` of slot views (:func:`unflatten_hetero`), with the stores in the batch's
type order.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import torch
from torch_geometric.data import Data, HeteroData

from lightning_zerocopy.options import check_depth
from lightning_zerocopy.sampling.neighbor_sampler import node_keyed_bound, sample_bound

#: Axis names used by :class:`SlotLayout`; any other tensor field gets an axis named after itself.
NODES = "nodes"
EDGES = "edges"
SEEDS = "seeds"

_NODE_FIELDS = frozenset({"x", "y", "n_id", "node_id", "pos", "batch"})
_EDGE_FIELDS = frozenset({"e_id", "edge_attr", "edge_weight", "edge_type"})
_SEED_FIELDS = frozenset({"input_id", "seed_time", "src_index", "dst_pos_index", "dst_neg_index"})
#: Supervision edges of a link batch (PyG ``LinkNeighborLoader``): positives and negatives, one axis.
LABELS = "edge_labels"
_LABEL_FIELDS = frozenset({"edge_label", "edge_label_query", "edge_label_time"})

# ---- a heterogeneous batch as a flat one (see the module docstring) ------------------------------------------------

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


@dataclass(frozen=True)
class FieldSpec:
    """One tensor field of a batch: its dtype, the shape around its variable dimension, and that axis.

    Attributes:
        name: attribute name on the ``Data`` batch (``"x"``, ``"edge_index"``...).
        dtype: element type.
        shape: full shape of the field with the variable dimension's entry set to 0.
        var_dim: index of the dimension whose length varies from batch to batch.
        axis: the named length that dimension follows (:data:`NODES`, :data:`EDGES`, :data:`SEEDS`, or the
            field's own name).
        scalar: the field is a 0-dim tensor (stored as one element).
    """

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    var_dim: int
    axis: str
    scalar: bool = False

    def alloc_shape(self, capacity: int) -> tuple[int, ...]:
        shape = list(self.shape)
        shape[self.var_dim] = capacity
        return tuple(shape)

    def buffer(self, capacity: int, device: torch.device) -> torch.Tensor:
        """A slot buffer for ``capacity`` entries along the variable dimension. A field that varies along a later
        dimension (``edge_index``: ``[2, E]``) is stored flat, so that its batches are contiguous, as PyG's loaders
        give them (a narrowed ``[2, capacity]`` buffer is not: ``edge_index.view(-1)`` fails on it)."""
        shape = self.alloc_shape(capacity)
        return torch.empty(shape if self.var_dim == 0 else math.prod(shape), dtype=self.dtype, device=device)

    def capacity(self, buffer: torch.Tensor) -> int:
        """How many entries along the variable dimension ``buffer`` (from :meth:`buffer`) holds."""
        if self.var_dim == 0:
            return int(buffer.size(0))
        per_entry = math.prod(self.alloc_shape(1))
        return int(buffer.numel()) // per_entry if per_entry else sys.maxsize

    def view(self, buffer: torch.Tensor, n: int) -> torch.Tensor:
        """The first ``n`` entries of ``buffer`` (from :meth:`buffer`), a contiguous tensor of the field's shape."""
        if self.var_dim == 0:
            return buffer.narrow(0, 0, n)
        shape = self.alloc_shape(n)
        return buffer.narrow(0, 0, math.prod(shape)).view(shape)


def _tensor_items(data: Data) -> Iterable[tuple[str, Any]]:
    for key in data.keys():
        yield key, data[key]


def batch_axes(data: Data) -> dict[str, int]:
    """The node, edge and seed counts of a batch (the lengths most fields follow)."""
    axes: dict[str, int] = {}
    if HETERO_TYPES in data:  # a flattened heterogeneous batch: every field has an axis of its own
        return axes
    if data.num_nodes is not None:
        axes[NODES] = int(data.num_nodes)
    edge_index = getattr(data, "edge_index", None)
    if isinstance(edge_index, torch.Tensor):
        axes[EDGES] = int(edge_index.size(1))
    batch_size = getattr(data, "batch_size", None)
    if isinstance(batch_size, int):
        axes[SEEDS] = batch_size
    return axes


@dataclass(frozen=True)
class SlotLayout:
    """The tensor fields of a batch (:class:`FieldSpec`) and the names of its non-tensor attributes."""

    fields: tuple[FieldSpec, ...]

    @staticmethod
    def from_batch(data: Data, levels: Optional[Mapping[str, tuple[str, int]]] = None) -> "SlotLayout":
        """Infer the layout from one real batch.

        Known PyG names decide a field's axis (``x``/``y``/``n_id`` follow the nodes, ``e_id``/``edge_attr``
        the edges, ``input_id`` and a triplet batch's ``src_index``/``dst_*_index`` the seeds, a link batch's
        ``edge_label_index`` (along its second dimension), ``edge_label`` and ``edge_label_query`` the supervision
        edges); a field ``levels`` names (the builder's node- and edge-level attributes: ``("node" | "edge", dim)``)
        follows the nodes or edges along that dimension; other tensors follow whichever count their first
        dimension matches, else their own length. A flattened heterogeneous batch's fields
        (:func:`flatten_hetero`) each follow their own length. Scalars and lists
        (``batch_size``, list-valued counters) are not stored in slots: they travel with each batch's sizes.
        """
        axes = batch_axes(data)
        fields: list[FieldSpec] = []
        for name, value in _tensor_items(data):
            if not isinstance(value, torch.Tensor):
                continue
            if value.dim() == 0:
                fields.append(FieldSpec(name, value.dtype, (0,), 0, name, scalar=True))
                continue
            var_dim, axis = 0, None
            if is_typed_field(name):  # a flattened heterogeneous batch's field: its length is its own
                var_dim, axis = typed_var_dim(name, value.dim()), name
            elif name == "edge_index":
                var_dim, axis = 1, EDGES
            elif name == "edge_label_index":
                var_dim, axis = 1, LABELS
            elif name in _LABEL_FIELDS:
                axis = LABELS
            elif levels and name in levels:
                level, var_dim = levels[name]
                axis = NODES if level == "node" else EDGES
            elif name in _NODE_FIELDS:
                axis = NODES
            elif name in _EDGE_FIELDS:
                axis = EDGES
            elif name in _SEED_FIELDS:
                axis = SEEDS
            else:
                for candidate in (NODES, EDGES, SEEDS):
                    if candidate in axes and value.size(0) == axes[candidate]:
                        axis = candidate
                        break
            if axis is None:
                axis = name
            shape = list(value.shape)
            shape[var_dim] = 0
            fields.append(FieldSpec(name, value.dtype, tuple(shape), var_dim, axis))
        return SlotLayout(tuple(fields))

    @property
    def axes(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for f in self.fields:
            seen.setdefault(f.axis, None)
        return tuple(seen)

    def sizes(self, data: Data) -> dict[str, int]:
        """Every axis length of ``data`` (checked: a field that disagrees with its axis raises)."""
        sizes: dict[str, int] = {}
        for f in self.fields:
            value = data[f.name] if f.name in data else None
            if not isinstance(value, torch.Tensor):
                raise ValueError(
                    f"batch field {f.name!r} is missing or not a tensor, but the first batch of this loader "
                    "had it: every batch of one loader must carry the same fields"
                )
            if value.dim() == 0:
                value = value.reshape(1)
            expect = f.alloc_shape(value.size(f.var_dim))
            if tuple(value.shape) != expect or value.dtype != f.dtype:
                raise ValueError(
                    f"batch field {f.name!r} has shape {tuple(value.shape)} and dtype {value.dtype}, but the "
                    f"loader's first batch fixed it to {f.alloc_shape(-1)} (-1: varies) and {f.dtype}"
                )
            n = int(value.size(f.var_dim))
            if sizes.setdefault(f.axis, n) != n:
                raise ValueError(
                    f"batch field {f.name!r} has {n} rows along axis {f.axis!r}, but another field of that "
                    f"axis has {sizes[f.axis]}"
                )
        return sizes

    def scalars(self, data: Data) -> dict[str, Any]:
        """The non-tensor attributes of ``data`` (ints, lists of ints...), sent along with each batch."""
        tensor_names = {f.name for f in self.fields}
        return {k: v for k, v in _tensor_items(data) if k not in tensor_names}


def capacity_bound(
    batch_size: int,
    fanouts: Sequence[int],
    num_nodes: Optional[int] = None,
    num_edges: Optional[int] = None,
    node_keyed: bool = False,
) -> Optional[dict[str, int]]:
    """Slot capacity per axis for batches of ``batch_size`` seeds: the sampler's bound
    (:func:`~lightning_zerocopy.sampling.sample_bound`), capped at the graph's size when given.

    Returns ``None`` when a fanout is ``-1`` (all neighbors: no bound from the fanouts alone); the ring then
    starts from the first batch and grows. Node-keyed (evaluation) samples repeat nodes across hops, so the
    graph's size caps each hop (:func:`~lightning_zerocopy.sampling.node_keyed_bound`), not the sample.
    """
    if node_keyed:
        if any(int(f) < 0 for f in fanouts) or num_nodes is None:
            return None
        nodes, edges = node_keyed_bound(batch_size, fanouts, int(num_nodes), 0)
        return {NODES: nodes, EDGES: edges, SEEDS: batch_size}
    bound = sample_bound(batch_size, fanouts)
    if bound is None:
        return None
    nodes, edges = bound
    if num_nodes is not None:
        nodes = min(nodes, int(num_nodes))
    if num_edges is not None:
        edges = min(edges, int(num_edges))
    return {NODES: nodes, EDGES: edges, SEEDS: batch_size}


class SlotRing:
    """``depth`` slots of one :class:`SlotLayout`, each a dict of capacity-sized tensors.

    The ring is allocated by the process that consumes the batches (the trainer). Each slot keeps its own
    capacity per axis, so a batch that does not fit grows only the slot it is written to
    (:meth:`grow`), by at least ``growth`` times what it needs.

    Args:
        layout: the batch fields.
        capacity: initial capacity per axis (missing axes start at the ``minimum`` given).
        depth: number of slots (2 = ping-pong).
        device: where the slots live.
        growth: over-allocation factor when a slot grows.
        shared: move CPU slots to shared memory (for a worker process); CUDA slots are shared over IPC as is.
    """

    def __init__(
        self,
        layout: SlotLayout,
        capacity: Mapping[str, int],
        depth: int,
        device: torch.device | str = "cpu",
        growth: float = 1.25,
        shared: bool = True,
    ) -> None:
        check_depth(depth, "SlotRing")
        self.layout = layout
        self.depth = depth
        self.device = torch.device(device)
        self.growth = growth
        self.shared = shared
        self.capacity: list[dict[str, int]] = []
        self.slots: list[dict[str, torch.Tensor]] = []
        for _ in range(depth):
            cap = {axis: max(1, int(capacity.get(axis, 1))) for axis in layout.axes}
            self.capacity.append(cap)
            self.slots.append(self._alloc(cap))

    def _alloc(self, cap: Mapping[str, int]) -> dict[str, torch.Tensor]:
        buffers = {}
        with torch.inference_mode(False):  # Lightning's evaluation loops run in inference mode, but the producer
            for f in self.layout.fields:  # writes these buffers outside it (an inference tensor refuses that)
                buffers[f.name] = self._alloc_one(f, cap)
        return buffers

    def _alloc_one(self, f: FieldSpec, cap: Mapping[str, int]) -> torch.Tensor:
        t = f.buffer(cap[f.axis], self.device)
        if self.shared and self.device.type == "cpu":
            t.share_memory_()
        return t

    def grow(self, index: int, sizes: Mapping[str, int]) -> dict[str, torch.Tensor]:
        """Reallocate slot ``index`` so that a batch of ``sizes`` fits; returns the new buffers."""
        cap = dict(self.capacity[index])
        for axis, need in sizes.items():
            if axis in cap and need > cap[axis]:
                cap[axis] = int(math.ceil(need * self.growth))
        self.capacity[index] = cap
        self.slots[index] = self._alloc(cap)
        return self.slots[index]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for slot in self.slots for t in slot.values())

    def view(self, index: int, sizes: Mapping[str, int], scalars: Mapping[str, Any]) -> Data:
        """The batch held in slot ``index``: a ``Data`` of views into the slot, plus its scalars."""
        return view_batch(self.layout, self.slots[index], sizes, scalars)


def view_batch(
    layout: SlotLayout, buffers: Mapping[str, torch.Tensor], sizes: Mapping[str, int], scalars: Mapping[str, Any]
) -> Data:
    """Build the ``Data`` batch made of the first ``sizes[axis]`` entries of each buffer, plus ``scalars``."""
    data = Data()
    for f in layout.fields:
        value = f.view(buffers[f.name], sizes[f.axis])
        data[f.name] = value[0] if f.scalar else value
    for key, value in scalars.items():
        data[key] = value
    return data


def write_batch(
    layout: SlotLayout, buffers: Mapping[str, torch.Tensor], data: Data, sizes: Mapping[str, int]
) -> None:
    """Copy every tensor field of ``data`` into the slot ``buffers`` (fields already written there are skipped).

    A builder that honours ``out`` writes the big fields (features, ids) straight into the slot; this only
    copies what it produced elsewhere. Copies are non-blocking on CUDA, ordered on the current stream.
    """
    for f in layout.fields:
        src = data[f.name]
        if src.dim() == 0:
            src = src.reshape(1)
        dst = f.view(buffers[f.name], sizes[f.axis])
        if src.data_ptr() == dst.data_ptr() and src.device == dst.device:
            continue
        dst.copy_(src, non_blocking=True)
