"""Assembling a batch from a sample: the gather of every featured type's rows, the labels and the user's node- and
edge-level attributes (``edge_attr`` among them), into a PyG ``Data`` (an untyped schema) or ``HeteroData`` (a typed
one), chosen at the last step as PyG's ``NodeLoader.filter_fn`` chooses.

The second stage of :meth:`~lightning_zerocopy.data.batch.BatchBuilder.build_batch`: :func:`assemble` gathers with
the host tables' CPU threads (a host batch) or, on the GPU, with the resources' zero-copy table of each type (or a CPU
gather of GPU-sampled ids, sent over pinned memory), writing into preallocated ``out`` buffers where they fit (an
untyped batch's ``x``, ``y`` and attributes, by name). Attributes (:mod:`lightning_zerocopy.data.attributes`) are
read at the batch's ``n_id`` (the dataset's ids) / ``e_id`` and placed under their own names, on their type's store.

``x`` leaves in the builder's ``x_dtype``: the rows are gathered in the host table's dtype (half the bytes over PCIe
for a ``bfloat16``/``float16`` table) and cast where the batch is built, on the GPU for a GPU builder (into the slot
when ``out["x"]`` is given). A caller that wants the stage split (the pipeline producer) passes ``marks``
(:class:`StageMarks`): ``marks.mark("gather", nbytes)`` follows the last type's rows, before labels, id maps, edge
features and the cast.

A typed batch has the fields of PyG's hetero ``NeighborLoader``: per node type ``n_id``, ``num_sampled_nodes`` and
``x`` (featured types) or ``num_nodes``; on the input type ``y`` (every sampled node's), ``batch_size``, ``input_id``;
per edge type ``edge_index``, ``e_id``, ``num_sampled_edges`` (so ``num_sampled_nodes_dict`` /
``num_sampled_edges_dict`` feed ``trim_to_layer``). A link item's fields go where PyG's link loaders put them
(:func:`complete_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Protocol, Sequence, Union

import torch
from torch_geometric.data import Data, HeteroData

from lightning_zerocopy.cache.provider import FeatureGather
from lightning_zerocopy.data.attributes import HostAttribute, row_width
from lightning_zerocopy.data.plan import PlanItem
from lightning_zerocopy.data.resources import HostData
from lightning_zerocopy.graph.schema import EDGE, NODE, AttributeKey
from lightning_zerocopy.sampling.hetero import HeteroSampledBatch
from lightning_zerocopy.sampling.neighbor_sampler import NeighborSampler, SampledBatch

__all__ = [
    "GpuSide",
    "SampledItem",
    "StageMarks",
    "assemble",
    "complete_batch",
    "fields_to_device",
    "host_gather_to",
    "sample_to_device",
    "to_device_packed",
]


class StageMarks(Protocol):
    """Where a caller learns the boundaries of a batch's assembly (e.g. the pipeline's stage clock)."""

    def mark(self, stage: str, nbytes: int = 0) -> None:
        """Stage ``stage`` ended now (on the current CUDA stream for a GPU builder); ``"gather"``: the feature rows
        are gathered, ``nbytes`` bytes of them in the host tables' dtypes."""
        ...


@dataclass(frozen=True)
class SampledItem:
    """A sampled but not yet gathered batch (:meth:`BatchBuilder.sample_batch`), on the device it is built on.

    Attributes:
        item: the plan item it was sampled for.
        sample: the sampled structure (a typed graph's per type); ``n_id`` holds *internal* ids (rows of the host
            memory), which :meth:`BatchBuilder.gather_batch` maps back to the dataset's ids.
        input_id: the batch's ``input_id`` (:attr:`PlanItem.batch_input_id`: positions of the seeds in their split, or
            their node ids for a split given as a boolean mask), on the same device.
    """

    item: PlanItem
    sample: Union[SampledBatch, HeteroSampledBatch]
    input_id: torch.Tensor


@dataclass
class GpuSide:
    """What a GPU builder reads from its :class:`DeviceResources` (owned by them, not by the builder)."""

    device: torch.device
    sampler: Optional[NeighborSampler]  # None: the CPU sampler, ids copied over
    features: Optional[Mapping[str, FeatureGather]]  # per featured type; None: CPU gather of GPU-sampled ids
    attributes: Optional[Mapping[AttributeKey, FeatureGather]]  # None: CPU gather of GPU-sampled ids
    labels: Optional[torch.Tensor]  # None: no node labels (link prediction)
    order: Optional[torch.Tensor]


def assemble(
    host: HostData,
    gpu: Optional[GpuSide],
    sampled: SampledItem,
    out: Mapping[str, torch.Tensor],
    x_dtype: Optional[torch.dtype] = None,
    marks: Optional[StageMarks] = None,
) -> Union[Data, HeteroData]:
    """The batch of a sample: built on the GPU (``gpu`` given: features through the resources' gather paths, or a
    CPU gather of the ids sent over pinned memory; labels from their compact copy; ``n_id`` mapped back to original
    ids) or in host memory (CPU threads). ``x`` cast to ``x_dtype`` where it is built (``None``: the table's)."""
    device = gpu.device if gpu is not None else torch.device("cpu")
    sample, typed = sampled.sample, host.schema.is_typed
    n_ids = sample.n_id if isinstance(sample, HeteroSampledBatch) else {NODE: sample.n_id}
    xs, casts, nbytes = {}, {}, 0
    for node_type, table in host.tables.items():
        n_id = n_ids[node_type]
        x_out = None if typed else _rows(out, "x", n_id.numel(), device)
        cast = x_dtype is not None and x_dtype != table.dtype
        raw_out = None if cast else x_out  # a cast gathers the table's dtype first (the caching allocator's memory)
        if gpu is None:
            xs[node_type] = table.gather(n_id, out=raw_out)
        elif gpu.features is not None:
            xs[node_type] = gpu.features[node_type].gather(n_id, out=raw_out)
        else:  # CPU gather of GPU-sampled ids: the ids come back, the rows go over pinned
            xs[node_type] = host_gather_to(table.data, n_id, raw_out, device)
        if cast:
            casts[node_type] = x_out
        nbytes += n_id.numel() * table.row_bytes
    if marks is not None:
        marks.mark("gather", nbytes)
    for node_type, x_out in casts.items():
        xs[node_type] = _cast_into(xs[node_type], x_out, x_dtype)  # type: ignore[arg-type]
    y, input_type = None, host.schema.input_type if not typed else sample.input_type  # type: ignore[union-attr]
    if host.labels is not None and input_type is not None:
        seeds = n_ids[input_type]
        y_out = None if typed else _rows(out, "y", seeds.numel(), device)
        if gpu is not None:
            y_small = torch.index_select(gpu.labels, 0, seeds)  # type: ignore[arg-type]
            y = y_out.copy_(y_small) if y_out is not None else y_small.to(torch.int64)
        else:
            y = torch.index_select(host.labels, 0, seeds, out=y_out) if y_out is not None else host.labels[seeds]
    if typed:
        data = _hetero_data(sample, xs, y, sampled.input_id)  # type: ignore[arg-type]
        for key, value in _attributes(host, gpu, n_ids, sample.e_id, {}, device).items():  # type: ignore[arg-type]
            data[key.type][key.name] = value
        return data
    n_id = n_ids[NODE]
    order = host.order if gpu is None else gpu.order
    if order is not None:  # internal -> original ids, where the batch is built
        n_id = torch.index_select(order, 0, n_id).to(torch.int64)
    labels = {} if y is None else {"y": y}  # a batch without node labels has no `y` (as PyG's link loader)
    data = Data(x=xs.get(NODE), edge_index=sample.edge_index, **labels, n_id=n_id, e_id=sample.e_id,
                input_id=sampled.input_id, batch_size=sample.batch_size, num_sampled_nodes=sample.num_sampled_nodes,
                num_sampled_edges=sample.num_sampled_edges)  # fmt: skip
    for key, value in _attributes(host, gpu, {NODE: n_id}, {EDGE: sample.e_id}, out, device).items():
        data[key.name] = value
    return data


def _attributes(
    host: HostData,
    gpu: Optional[GpuSide],
    n_ids: Mapping[str, torch.Tensor],
    e_ids: Mapping[object, torch.Tensor],
    out: Mapping[str, torch.Tensor],
    device: torch.device,
) -> dict[AttributeKey, torch.Tensor]:
    """Every attribute's rows at the batch's ``n_id`` (the dataset's ids) or ``e_id`` of its type, in the user's
    layout; an untyped batch's into ``out[name]`` where given."""
    values = {}
    for key, attribute in host.attributes.items():
        ids = (n_ids if key.level == "node" else e_ids)[key.type]  # type: ignore[index]
        values[key] = attribute.batch_value(_attribute_rows(key, attribute, gpu, ids, out, device))
    return values


def _attribute_rows(
    key: AttributeKey,
    attribute: HostAttribute,
    gpu: Optional[GpuSide],
    ids: torch.Tensor,
    out: Mapping[str, torch.Tensor],
    device: torch.device,
) -> torch.Tensor:
    """``attribute``'s 2-D rows of ``ids``: by the CPU (a host batch), the resources' GPU path, or the CPU for
    GPU-sampled ids sent back (``gather="cpu"``)."""
    buffer = _rows(out, key.name, ids.numel(), device) if attribute.dim == 0 else None
    flat = None if buffer is None else buffer.view(ids.numel(), row_width(attribute.rows))
    if gpu is None:
        return attribute.gather(ids, out=flat)
    if gpu.attributes is not None:
        return gpu.attributes[key].gather(ids, out=flat)
    return host_gather_to(attribute.table, ids, flat, device)


def _hetero_data(
    sample: HeteroSampledBatch, xs: dict[str, torch.Tensor], y: Optional[torch.Tensor], input_id: torch.Tensor
) -> HeteroData:
    data = HeteroData()
    for node_type, n_id in sample.n_id.items():
        store = data[node_type]
        if node_type in xs:
            store.x = xs[node_type]
        else:
            store.num_nodes = int(n_id.numel())
        store.n_id = n_id
        store.num_sampled_nodes = sample.num_sampled_nodes[node_type]
    if sample.input_type is not None:
        seeds = data[sample.input_type]
        if y is not None:
            seeds.y = y
        seeds.input_id = input_id
        seeds.batch_size = sample.batch_size
    for edge_type, edge_index in sample.edge_index.items():
        store = data[edge_type]
        store.edge_index = edge_index
        store.e_id = sample.e_id[edge_type]
        store.num_sampled_edges = sample.num_sampled_edges[edge_type]
    return data


def _cast_into(x: torch.Tensor, out: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """``x`` cast to ``dtype``, written into ``out`` when given (a buffer of that dtype)."""
    if out is not None:
        if out.dtype != dtype:
            raise ValueError(f"out['x'] has dtype {out.dtype} but the batch's x is {dtype} (the builder's x_dtype)")
        return out.copy_(x)
    return x.to(dtype)


def complete_batch(data: Union[Data, HeteroData], item: PlanItem, input_id: torch.Tensor) -> Union[Data, HeteroData]:
    """``data`` (built from ``item``'s seeds) finished for its task: nothing for a node item; a link item's fields
    (:attr:`PlanItem.task_fields`, CPU tensors) on the batch's device, the int64 ones in one pinned transfer, where
    PyG's link loaders put them: on an untyped batch itself (``batch_size`` the item's), on a typed batch's stores
    (``edge_label_index`` / ``edge_label`` / ``edge_label_query``, ``input_id`` and ``batch_size`` on the supervised
    edge type, ``src_index`` on its source type, ``dst_pos_index`` / ``dst_neg_index`` on its destination type)."""
    fields = item.task_fields
    if not fields:
        return data
    moved = fields_to_device(fields, input_id.device)
    if isinstance(data, HeteroData):
        for key, value in moved.items():
            data[item.task_store(key)][key] = value  # type: ignore[attr-defined]
        store = data[item.edge_type]  # type: ignore[attr-defined]  # the supervised edge type
        store.input_id = input_id
        store.batch_size = item.task_batch_size
        return data
    for key, value in moved.items():
        data[key] = value
    data.batch_size = item.task_batch_size
    return data


def fields_to_device(fields: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A plan item's CPU fields on ``device``: on a GPU the int64 ones in one pinned transfer, the others pinned and
    non-blocking; on the CPU as they are."""
    fields = dict(fields)
    if device.type == "cuda":
        ints = [k for k, v in fields.items() if v.dtype == torch.int64]
        for key, moved in zip(ints, to_device_packed([fields[k] for k in ints], device)):
            fields[key] = moved
        for key in set(fields) - set(ints):
            fields[key] = fields[key].pin_memory().to(device, non_blocking=True)
    return fields


def to_device_packed(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Copy int64 CPU tensors to ``device`` as one pinned, non-blocking transfer; returns views of the copy."""
    flat = [t.reshape(-1).to(torch.int64) for t in tensors]
    staged = torch.empty(sum(t.numel() for t in flat), dtype=torch.int64, pin_memory=True)
    torch.cat(flat, out=staged)
    on_device = staged.to(device, non_blocking=True)  # the caching host allocator keeps `staged` until done
    views, start = [], 0
    for t in tensors:
        views.append(on_device[start : start + t.numel()].view(t.shape))
        start += t.numel()
    return views


def sample_to_device(item: PlanItem, sample: Union[SampledBatch, HeteroSampledBatch], device: torch.device) -> SampledItem:
    """A CPU sample and its item's ``input_id`` on ``device``: every int64 tensor in one pinned, non-blocking copy."""
    if isinstance(sample, SampledBatch):
        n_id, edge_index, e_id, input_id = to_device_packed([sample.n_id, sample.edge_index, sample.e_id,
                                                             item.batch_input_id], device)  # fmt: skip
        moved = SampledBatch(n_id, edge_index, e_id, sample.num_sampled_nodes, sample.num_sampled_edges,
                             sample.batch_size)  # fmt: skip
        return SampledItem(item, moved, input_id)
    node_types, edge_types = list(sample.n_id), list(sample.edge_index)
    tensors = [sample.n_id[t] for t in node_types] + [sample.edge_index[et] for et in edge_types]
    tensors += [sample.e_id[et] for et in edge_types] + [item.batch_input_id]
    out = iter(to_device_packed(tensors, device))
    n_ids = {t: next(out) for t in node_types}
    edges = {et: next(out) for et in edge_types}
    e_ids = {et: next(out) for et in edge_types}
    placed = HeteroSampledBatch(n_ids, edges, e_ids, sample.num_sampled_nodes, sample.num_sampled_edges,
                                sample.batch_size, sample.input_type)  # fmt: skip
    return SampledItem(item, placed, next(out))


def move_batch(batch: Data, device: torch.device) -> Data:
    """``batch`` with every tensor not yet on ``device`` copied there (``non_blocking``); a batch built on that
    device is returned as it is, without walking it through ``Data.apply`` (:func:`batch_on_device`)."""
    if batch_on_device(batch, device):
        return batch
    return batch.apply(lambda t: t if _same_device(t.device, device) else t.to(device, non_blocking=True))


def batch_on_device(batch: Data, device: torch.device) -> bool:
    """Whether every tensor of ``batch`` is on ``device`` (in lists, tuples and dicts too), so that moving it would
    change nothing; reads devices only. ``False`` for a value it does not know (e.g. a ``SparseTensor``): the caller
    then moves the batch as usual. About 1 µs for a sampled batch, where ``Data.to`` / ``Data.apply`` take ~30."""
    return all(_on_device(value, device) for store in batch.stores for value in store.values())


def _on_device(value: object, device: torch.device) -> bool:
    if isinstance(value, torch.Tensor):
        return _same_device(value.device, device)
    if value is None or isinstance(value, (int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_on_device(v, device) for v in value)
    if isinstance(value, dict):
        return all(_on_device(v, device) for v in value.values())
    return False


def host_gather_to(
    table: torch.Tensor, ids: torch.Tensor, out: Optional[torch.Tensor], device: torch.device
) -> torch.Tensor:
    """``table[ids]`` gathered by the CPU (ids come back from the GPU), sent to ``device`` (into ``out``)."""
    from lightning_zerocopy import ops

    flat = table.reshape(table.shape[0], row_width(table)) if table.dim() != 2 else table
    staged = torch.empty((ids.numel(), flat.shape[1]), dtype=table.dtype, pin_memory=True)
    ops.gather_rows(flat, ids.cpu(), staged)
    staged = staged.view((ids.numel(), *table.shape[1:]))
    if out is not None:
        return out.copy_(staged, non_blocking=True)
    return staged.to(device, non_blocking=True)


def _rows(out: Mapping[str, torch.Tensor], key: str, rows: int, device: torch.device) -> Optional[torch.Tensor]:
    buffer = out.get(key)
    if buffer is None or not _same_device(buffer.device, device):
        return None
    if buffer.shape[0] < rows:
        raise ValueError(
            f"out[{key!r}] has {buffer.shape[0]} rows but this batch needs {rows}: allocate at least "
            f"BatchBuilder.max_nodes(batch_size) rows (or grow the buffer and retry)"
        )
    return buffer[:rows]


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    current = torch.cuda.current_device
    return (a.index if a.index is not None else current()) == (b.index if b.index is not None else current())
