"""Assembling a heterogeneous batch from its sample: per featured type the feature gather, the input type's labels,
into a PyG ``HeteroData`` with the fields of PyG's hetero ``NeighborLoader``.

The typed counterpart of :mod:`lightning_zerocopy.data.assemble`, through the same gather calls:
:func:`assemble_hetero_on_host` gathers with the host table's CPU threads (``HostFeatureTable.gather``);
:func:`assemble_hetero_on_gpu` with the resources' zero-copy table of each type (``FeatureGather.gather``), or a CPU
gather of GPU-sampled ids sent over pinned memory (:func:`~lightning_zerocopy.data.assemble.host_gather_to`). ``x``
is gathered in the table's dtype and cast to ``x_dtype`` where the batch is built; ``marks.mark("gather", nbytes)``
follows the last type's rows.

Fields (PyG's hetero ``NeighborLoader``, ``filter_hetero_data``):

* every node type: ``n_id``, ``num_sampled_nodes`` (a list per hop, seeds first); ``x`` (rows of ``n_id``) where the
  type has features, else ``num_nodes`` (PyG's store of a featureless type carries ``num_nodes``);
* the input type besides: ``y`` (labels of every sampled input-type node, as PyG slices ``y`` by ``n_id``),
  ``batch_size``, ``input_id`` (positions of the seeds in their split);
* every edge type: ``edge_index`` (local ids), ``e_id`` (positions in that type's edge list),
  ``num_sampled_edges`` (a list per hop).

So ``batch.num_sampled_nodes_dict`` / ``batch.num_sampled_edges_dict`` feed ``torch_geometric.utils.trim_to_layer``.

A link batch (seeds of both endpoint types, no input type, no labels) has none of the input type's fields; its
plan item's link fields are put where PyG's hetero ``LinkNeighborLoader`` puts them (:func:`complete_hetero_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import torch
from torch_geometric.data import HeteroData

from lightning_zerocopy.cache.provider import FeatureGather
from lightning_zerocopy.data.assemble import StageMarks, fields_to_device, host_gather_to
from lightning_zerocopy.data.resources import HostData
from lightning_zerocopy.data.plan import PlanItem
from lightning_zerocopy.sampling.hetero import HeteroSampledBatch
from lightning_zerocopy.sampling.neighbor_sampler import HeteroNeighborSampler

__all__ = [
    "HeteroGpuSide",
    "HeteroSampledItem",
    "assemble_hetero_on_gpu",
    "assemble_hetero_on_host",
    "complete_hetero_batch",
]


@dataclass(frozen=True)
class HeteroSampledItem:
    """A sampled, not yet gathered heterogeneous batch, on the device it is built on.

    Attributes:
        item: the plan item it was sampled for.
        sample: the sampled structure.
        input_id: positions of the seeds in their split, on the same device.
    """

    item: PlanItem
    sample: HeteroSampledBatch
    input_id: torch.Tensor


@dataclass
class HeteroGpuSide:
    """What a GPU heterogeneous builder reads from its resources (owned by them, not by the builder)."""

    device: torch.device
    sampler: Optional[HeteroNeighborSampler]  # None: the CPU sampler, ids copied over
    features: Optional[Mapping[str, FeatureGather]]  # None: CPU gather of the ids
    labels: Optional[torch.Tensor]  # None: no node labels (link prediction)


def assemble_hetero_on_host(
    host: HostData,
    sampled: HeteroSampledItem,
    x_dtype: Optional[torch.dtype] = None,
    marks: Optional[StageMarks] = None,
) -> HeteroData:
    """The batch of a CPU sample, gathered by CPU threads into host memory; ``x`` cast to ``x_dtype`` (``None``: the
    table's dtype)."""
    sample = sampled.sample
    xs, nbytes = {}, 0
    for node_type, table in host.features.items():
        n_id = sample.n_id[node_type]
        xs[node_type] = table.gather(n_id)
        nbytes += n_id.numel() * table.row_bytes
    if marks is not None:
        marks.mark("gather", nbytes)
    y = None
    if host.labels is not None and sample.input_type is not None:
        y = host.labels[sample.n_id[sample.input_type]]
    return _hetero_data(sample, _cast(xs, x_dtype), y, sampled.input_id)


def assemble_hetero_on_gpu(
    host: HostData,
    state: HeteroGpuSide,
    sampled: HeteroSampledItem,
    x_dtype: Optional[torch.dtype] = None,
    marks: Optional[StageMarks] = None,
) -> HeteroData:
    """The batch of a sample on the GPU: each featured type's rows through its zero-copy table (or a CPU gather of
    the ids, sent over pinned memory), cast to ``x_dtype`` on the GPU; labels from their compact copy."""
    device = state.device
    sample = sampled.sample
    with torch.cuda.device(device):
        xs, nbytes = {}, 0
        for node_type, table in host.features.items():
            n_id = sample.n_id[node_type]
            if state.features is not None:
                xs[node_type] = state.features[node_type].gather(n_id)
            else:
                xs[node_type] = host_gather_to(table.data, n_id, None, device)
            nbytes += n_id.numel() * table.row_bytes
        if marks is not None:
            marks.mark("gather", nbytes)
        y = None
        if state.labels is not None and sample.input_type is not None:
            y = torch.index_select(state.labels, 0, sample.n_id[sample.input_type]).to(torch.int64)
        return _hetero_data(sample, _cast(xs, x_dtype), y, sampled.input_id)


def _cast(xs: dict[str, torch.Tensor], dtype: Optional[torch.dtype]) -> dict[str, torch.Tensor]:
    return xs if dtype is None else {t: x if x.dtype == dtype else x.to(dtype) for t, x in xs.items()}


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


def complete_hetero_batch(data: HeteroData, item: PlanItem, input_id: torch.Tensor) -> HeteroData:
    """``data`` finished for its plan item's task: nothing for a node item; a link item's fields (CPU tensors, moved
    to the batch's device as :func:`~lightning_zerocopy.data.assemble.complete_batch` moves them) on the stores PyG's
    hetero ``LinkNeighborLoader`` uses: ``edge_label_index`` / ``edge_label`` / ``edge_label_query``, ``input_id``
    (``input_id`` given here, already on the device) and ``batch_size`` (the positives) on the supervised edge type,
    ``src_index`` on its source type, ``dst_pos_index`` / ``dst_neg_index`` on its destination type."""
    fields = item.task_fields
    if not fields:
        return data
    for key, value in fields_to_device(fields, input_id.device).items():
        data[item.task_store(key)][key] = value  # type: ignore[attr-defined]
    edges = data[item.edge_type]  # type: ignore[attr-defined]
    edges.input_id = input_id
    edges.batch_size = item.task_batch_size
    return data
