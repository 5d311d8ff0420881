"""Put a dataset into host memory that every local process maps by name, and get its handles."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Literal

import torch

from lightning_zerocopy.data.batch import HostGraphHandles
from lightning_zerocopy.datasets.base import NodeData
from lightning_zerocopy.gather.host_table import FeatureTableHandle, HostFeatureTable
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.graph.shared_memory import NpyTensorHandle, share_tensor

FeatureStorage = Literal["shared_memory", "mmap"]


def share_node_data(data: NodeData, feature_storage: FeatureStorage = "shared_memory") -> HostGraphHandles:
    """Build the CSC graph of ``data`` and copy graph, labels, splits (and features) into shared memory.

    Args:
        data: the dataset's arrays.
        feature_storage: ``"shared_memory"`` copies the features into a shared segment (RAM, can be pinned
            for the GPU); ``"mmap"`` maps the dataset's ``.npy`` feature file instead (features larger than RAM,
            shared through the page cache).

    Returns:
        The handles. The caller owns the segments and must call ``handles.unlink()`` once every local
        process has opened them; if this function fails, it unlinks what it had created.
    """
    with ExitStack() as undo:
        graph = CSCGraph.from_edge_index(data.edge_index, data.num_nodes).share()
        undo.callback(graph.unlink)

        if feature_storage == "mmap":
            if data.x_file is None:
                raise ValueError(
                    "data.feature_storage='mmap' needs a dataset whose features are an .npy file (e.g. SyntheticGraph,"
                    " OGBNodeDataset); use 'shared_memory' for this dataset"
                )
            features = FeatureTableHandle(NpyTensorHandle(data.x_file))
        elif feature_storage == "shared_memory":
            features = HostFeatureTable.share(data.x.contiguous(), name="features").handle()
            undo.callback(features.unlink)
        else:
            raise ValueError(f"data.feature_storage must be 'shared_memory' or 'mmap', got {feature_storage!r}")

        def share(tensor: torch.Tensor, name: str):
            _, handle = share_tensor(tensor.contiguous(), name=name)
            undo.callback(handle.unlink)
            return handle

        labels = share(data.y.to(torch.int64), "labels")
        splits = {name: share(data.split(name), f"{name}_idx") for name in ("train", "val", "test")}
        edge_attr = share(data.edge_attr, "edge_attr") if data.edge_attr is not None else None
        handles = HostGraphHandles(graph=graph.handle(), features=features, labels=labels, splits=splits, edge_attr=edge_attr)
        undo.pop_all()  # success: the caller owns the segments now
    return handles
