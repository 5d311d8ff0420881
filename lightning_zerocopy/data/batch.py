"""``build_batch``: one plan item -> one PyG ``Data`` mini-batch, exactly as ``NeighborLoader`` yields it.

A :class:`BatchBuilder` is made of picklable handles (graph, features, labels, optional edge features) and
the sampling options; it carries no data, so it can be sent to another local process (a pipeline worker, a
DDP rank) and opened there with :meth:`BatchBuilder.open`, which maps the same host memory by name.

The batch has PyG ``NeighborLoader``'s fields and conventions:

* ``n_id``: global ids of the sampled nodes, the ``batch_size`` seeds first;
* ``edge_index``: local ids, messages flow ``edge_index[0] -> edge_index[1]`` (neighbor -> target);
* ``x = features[n_id]``, ``y = labels[n_id]`` (every sampled node, as ``NeighborLoader`` slices ``y``);
* ``e_id``: ids of the sampled edges in the dataset's ``edge_index``, ``edge_attr = edge_attr[e_id]``;
* ``batch_size``, ``input_id`` (positions of the seeds in the split), ``num_sampled_nodes``/``_edges``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch
from torch_geometric.data import Data

from lightning_zerocopy.data.plan import PlanItem
from lightning_zerocopy.gather.host_table import FeatureTableHandle, HostFeatureTable
from lightning_zerocopy.graph.csc import CSCGraph, CSCGraphHandle
from lightning_zerocopy.graph.shared_memory import SharedTensorHandle, TensorHandle
from lightning_zerocopy.sampling.neighbor_sampler import NeighborSampler, validate_fanouts

__all__ = ["BatchBuilder", "HostGraphHandles", "max_sampled_nodes"]


@dataclass(frozen=True)
class HostGraphHandles:
    """Picklable names of everything a batch is built from (no data).

    Attributes:
        graph: the CSC graph.
        features: the node feature table.
        labels: int64 labels of every node.
        splits: int64 node ids of each split (``"train"``, ``"val"``, ``"test"``).
        edge_attr: edge features in the dataset's edge order, if the dataset has them.
    """

    graph: CSCGraphHandle
    features: FeatureTableHandle
    labels: TensorHandle
    splits: Mapping[str, TensorHandle]
    edge_attr: Optional[TensorHandle] = None

    def unlink(self) -> None:
        """Remove the names of every shared segment (files on disk are kept); mappings stay valid."""
        self.graph.unlink()
        self.features.unlink()
        for handle in (self.labels, self.edge_attr, *self.splits.values()):
            if isinstance(handle, SharedTensorHandle):
                handle.unlink()


def max_sampled_nodes(batch_size: int, fanouts: Sequence[int], num_nodes: int) -> int:
    """An upper bound on ``len(n_id)`` of a batch: ``batch_size * prod(1 + fanout)``, capped at ``num_nodes``.

    Useful to size preallocated ``out`` buffers; a fanout of ``-1`` gives ``num_nodes``.
    """
    if any(f < 0 for f in fanouts):
        return num_nodes
    bound, frontier = batch_size, batch_size
    for fanout in fanouts:
        frontier *= fanout
        bound += frontier
        if bound >= num_nodes:
            return num_nodes
    return min(bound, num_nodes)


class BatchBuilder:
    """Builds PyG ``Data`` mini-batches from plan items; picklable, opened lazily in each process.

    Args:
        handles: where the graph, features and labels live.
        fanouts: neighbors per hop, e.g. ``[15, 10, 5]``; ``-1`` takes all neighbors.
        replace: sample with replacement.
        num_threads: threads of the sampling kernel; ``None`` uses ``torch.get_num_threads()``.
    """

    def __init__(
        self,
        handles: HostGraphHandles,
        fanouts: Sequence[int],
        replace: bool = False,
        num_threads: Optional[int] = None,
    ) -> None:
        self.handles = handles
        self.fanouts = validate_fanouts(list(fanouts))
        self.replace = bool(replace)
        self.num_threads = num_threads
        self._opened: Optional[_Opened] = None

    def open(self) -> "BatchBuilder":
        """Map the host memory named by the handles in this process (idempotent). Returns ``self``."""
        if self._opened is None:
            graph = self.handles.graph.open()
            self._opened = _Opened(
                graph=graph,
                sampler=NeighborSampler(graph, fanouts=self.fanouts, replace=self.replace, num_threads=self.num_threads),
                features=self.handles.features.open(),
                labels=self.handles.labels.open(),
                edge_attr=None if self.handles.edge_attr is None else self.handles.edge_attr.open(),
            )
        return self

    @property
    def is_open(self) -> bool:
        return self._opened is not None

    def _require_open(self) -> "_Opened":
        if self._opened is None:
            self.open()
        assert self._opened is not None
        return self._opened

    @property
    def num_nodes(self) -> int:
        return self.handles.graph.num_nodes

    def max_nodes(self, batch_size: int) -> int:
        """Upper bound on the sampled nodes of a batch with ``batch_size`` seeds (see :func:`max_sampled_nodes`)."""
        return max_sampled_nodes(batch_size, self.fanouts, self.num_nodes)

    def build_batch(self, item: PlanItem, out: Optional[Mapping[str, torch.Tensor]] = None) -> Data:
        """Sample the neighborhood of ``item.seed_ids`` and gather its features and labels.

        Args:
            item: the plan item (seed ids, their positions in the split, the batch's sampler seed).
            out: optional preallocated buffers, by field: ``"x"`` (``[rows, num_features]`` of the feature
                dtype), ``"y"`` (``[rows]`` int64), ``"edge_attr"`` (``[rows, ...]``). Each buffer must have
                at least as many rows as the batch needs; the batch's tensor is then the view ``buf[:n]``.

        Returns:
            A ``torch_geometric.data.Data`` with ``x``, ``edge_index``, ``y``, ``n_id``, ``e_id``,
            ``batch_size``, ``input_id``, ``num_sampled_nodes``, ``num_sampled_edges`` (and ``edge_attr`` when
            the graph has edge features), as PyG's ``NeighborLoader`` yields.
        """
        opened = self._require_open()
        out = out or {}
        sample = opened.sampler.sample(item.seed_ids, seed=item.batch_seed)
        n_id = sample.n_id
        x = opened.features.gather(n_id, out=_rows(out, "x", n_id.numel()))
        y_out = _rows(out, "y", n_id.numel())
        y = torch.index_select(opened.labels, 0, n_id, out=y_out) if y_out is not None else opened.labels[n_id]
        data = Data(
            x=x,
            edge_index=sample.edge_index,
            y=y,
            n_id=n_id,
            e_id=sample.e_id,
            input_id=item.input_id,
            batch_size=sample.batch_size,
            num_sampled_nodes=sample.num_sampled_nodes,
            num_sampled_edges=sample.num_sampled_edges,
        )
        if opened.edge_attr is not None:
            attr_out = _rows(out, "edge_attr", sample.e_id.numel())
            if attr_out is not None:
                torch.index_select(opened.edge_attr, 0, sample.e_id, out=attr_out)
                data.edge_attr = attr_out
            else:
                data.edge_attr = opened.edge_attr[sample.e_id]
        return data

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_opened"] = None  # handles only: the receiving process maps the memory itself
        return state

    def __repr__(self) -> str:
        return f"BatchBuilder(num_nodes={self.num_nodes}, fanouts={self.fanouts}, replace={self.replace}, open={self.is_open})"


@dataclass
class _Opened:
    graph: CSCGraph
    sampler: NeighborSampler
    features: HostFeatureTable
    labels: torch.Tensor
    edge_attr: Optional[torch.Tensor]


def _rows(out: Mapping[str, torch.Tensor], key: str, rows: int) -> Optional[torch.Tensor]:
    buffer = out.get(key)
    if buffer is None:
        return None
    if buffer.shape[0] < rows:
        raise ValueError(
            f"out[{key!r}] has {buffer.shape[0]} rows but this batch needs {rows}: allocate at least "
            f"BatchBuilder.max_nodes(batch_size) rows (or grow the buffer and retry)"
        )
    return buffer[:rows]


