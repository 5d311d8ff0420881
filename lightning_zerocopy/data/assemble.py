"""Assembling a batch from a sample: gathers of features, labels and edge features into a PyG ``Data``.

The second stage of :meth:`~lightning_zerocopy.data.batch.BatchBuilder.build_batch`: :func:`assemble_on_host`
(CPU threads, host memory) and :func:`assemble_on_gpu` (on the GPU, from what the builder's
:class:`~lightning_zerocopy.data.resources.DeviceResources` placed), writing into preallocated ``out`` buffers
where they fit.

``x`` leaves in the builder's ``x_dtype``: the rows are gathered in the host table's dtype (half the bytes over PCIe
for a ``bfloat16``/``float16`` table) and cast where the batch is built, on the GPU for a GPU builder (into the slot
when ``out["x"]`` is given), on the host for a host batch.

A caller that wants the stage split (the pipeline producer) passes ``marks`` (:class:`StageMarks`): the assembler
calls ``marks.mark("gather", nbytes)`` right after the feature rows are gathered, before labels, id maps, edge
features and the cast of ``x``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Protocol, Sequence

import torch
from torch_geometric.data import Data

from lightning_zerocopy.cache.provider import FeatureGather
from lightning_zerocopy.data.plan import PlanItem
from lightning_zerocopy.data.resources import HostData, row_width
from lightning_zerocopy.sampling.neighbor_sampler import NeighborSampler, SampledBatch

__all__ = [
    "GpuSide",
    "SampledItem",
    "StageMarks",
    "assemble_on_gpu",
    "assemble_on_host",
    "complete_batch",
    "fields_to_device",
    "host_gather_to",
    "to_device_packed",
]


class StageMarks(Protocol):
    """Where a caller learns the boundaries of a batch's assembly (e.g. the pipeline's stage clock)."""

    def mark(self, stage: str, nbytes: int = 0) -> None:
        """Stage ``stage`` ended now (on the current CUDA stream for a GPU builder); ``"gather"``: the feature rows
        are gathered, ``nbytes`` bytes of them in the host table's dtype."""
        ...


@dataclass(frozen=True)
class SampledItem:
    """A sampled but not yet gathered batch (:meth:`BatchBuilder.sample_batch`), on the device it is built on.

    Attributes:
        item: the plan item it was sampled for.
        sample: the sampled structure; ``n_id`` holds *internal* ids (rows of the host memory), which
            :meth:`BatchBuilder.gather_batch` maps back to the dataset's ids.
        input_id: positions of the seeds in their split, on the same device.
    """

    item: PlanItem
    sample: SampledBatch
    input_id: torch.Tensor


@dataclass
class GpuSide:
    """What a GPU builder reads from its :class:`DeviceResources` (owned by them, not by the builder)."""

    device: torch.device
    sampler: Optional[NeighborSampler]  # None: the CPU sampler, ids copied over
    features: Optional[FeatureGather]  # None: CPU gather of GPU-sampled ids
    edge_attr: Optional[FeatureGather]
    labels: Optional[torch.Tensor]  # None: no node labels (link prediction)
    order: Optional[torch.Tensor]


def assemble_on_host(
    host: HostData,
    sampled: SampledItem,
    out: Mapping[str, torch.Tensor],
    x_dtype: Optional[torch.dtype] = None,
    marks: Optional[StageMarks] = None,
) -> Data:
    """The batch of a CPU sample, gathered by CPU threads into host memory (``out`` buffers where they fit); ``x``
    cast to ``x_dtype`` on the host (``None``: the table's dtype)."""
    cpu = torch.device("cpu")
    sample = sampled.sample
    n_id = sample.n_id  # internal ids: rows of the host feature table and labels
    x_out = _rows(out, "x", n_id.numel(), cpu)
    cast = x_dtype is not None and x_dtype != host.features.dtype
    x = host.features.gather(n_id, out=None if cast else x_out)
    if marks is not None:
        marks.mark("gather", n_id.numel() * host.features.row_bytes)
    if cast:
        x = _cast_into(x, x_out, x_dtype)
    y = None
    if host.labels is not None:
        y_out = _rows(out, "y", n_id.numel(), cpu)
        y = torch.index_select(host.labels, 0, n_id, out=y_out) if y_out is not None else host.labels[n_id]
    if host.order is not None:
        n_id = torch.index_select(host.order, 0, n_id)
    data = _data(x, sample.edge_index, y, n_id, sample.e_id, sampled.input_id, sample)
    if host.edge_attr is not None:
        attr_out = _rows(out, "edge_attr", sample.e_id.numel(), cpu)
        if attr_out is not None:
            torch.index_select(host.edge_attr, 0, sample.e_id, out=attr_out)
            data.edge_attr = attr_out
        else:
            data.edge_attr = host.edge_attr[sample.e_id]
    return data

def assemble_on_gpu(
    host: HostData,
    state: GpuSide,
    sampled: SampledItem,
    out: Mapping[str, torch.Tensor],
    x_dtype: Optional[torch.dtype] = None,
    marks: Optional[StageMarks] = None,
) -> Data:
    """The batch of a sample on the GPU: features through the resources' gather path (or a CPU gather of the
    ids, sent over pinned memory) in the host table's dtype, then cast to ``x_dtype`` on the GPU (``None``: kept),
    labels from their compact copy, ``n_id`` mapped back to original ids."""
    device = state.device
    sample = sampled.sample
    n_id, edge_index, e_id = sample.n_id, sample.edge_index, sample.e_id
    with torch.cuda.device(device):
        rows = n_id.numel()
        x_out = _rows(out, "x", rows, device)
        cast = x_dtype is not None and x_dtype != host.features.dtype
        raw_out = None if cast else x_out  # a cast gathers the table's dtype first (the caching allocator's memory)
        if state.features is not None:
            x = state.features.gather(n_id, out=raw_out)
        else:  # CPU gather of GPU-sampled ids: the ids come back, the rows go over pinned
            x = host_gather_to(host.features.data, n_id, raw_out, device)
        if marks is not None:
            marks.mark("gather", rows * host.features.row_bytes)
        if cast:
            x = _cast_into(x, x_out, x_dtype)
        y = None
        if state.labels is not None:
            y_out = _rows(out, "y", rows, device)
            y_small = torch.index_select(state.labels, 0, n_id)
            y = y_out.copy_(y_small) if y_out is not None else y_small.to(torch.int64)
        if state.order is not None:  # internal -> original ids, on the GPU
            n_id = torch.index_select(state.order, 0, n_id).to(torch.int64)
        data = _data(x, edge_index, y, n_id, e_id, sampled.input_id, sample)
        if host.edge_attr is not None:
            attr_out = _rows(out, "edge_attr", e_id.numel(), device)
            shape = (e_id.numel(), *host.edge_attr.shape[1:])
            if state.edge_attr is not None:
                flat = None if attr_out is None else attr_out.view(e_id.numel(), row_width(host.edge_attr))
                data.edge_attr = state.edge_attr.gather(e_id, out=flat).view(shape)
            else:
                data.edge_attr = host_gather_to(host.edge_attr, e_id, attr_out, device)
    return data


def _cast_into(x: torch.Tensor, out: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """``x`` cast to ``dtype``, written into ``out`` when given (a buffer of that dtype)."""
    if out is not None:
        if out.dtype != dtype:
            raise ValueError(f"out['x'] has dtype {out.dtype} but the batch's x is {dtype} (the builder's x_dtype)")
        return out.copy_(x)
    return x.to(dtype)


def complete_batch(data: Data, item: PlanItem) -> Data:
    """``data`` (built from ``item``'s seeds) finished for its task: the item's own fields (:attr:`PlanItem.task_fields`,
    e.g. a link batch's supervision edges; CPU tensors) on the batch's device, the int64 ones in one pinned transfer,
    and ``batch_size`` set to the item's (:attr:`PlanItem.task_batch_size`)."""
    fields = item.task_fields
    if not fields:
        return data
    for key, value in fields_to_device(fields, data.n_id.device).items():
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


def _data(x, edge_index, y, n_id, e_id, input_id, sample) -> Data:
    labels = {} if y is None else {"y": y}  # a batch without node labels has no `y` (as PyG's link loader)
    return Data(
        x=x,
        edge_index=edge_index,
        **labels,
        n_id=n_id,
        e_id=e_id,
        input_id=input_id,
        batch_size=sample.batch_size,
        num_sampled_nodes=sample.num_sampled_nodes,
        num_sampled_edges=sample.num_sampled_edges,
    )


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
