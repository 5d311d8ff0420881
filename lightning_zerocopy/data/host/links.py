"""The split tensors of a link dataset (untyped or typed): its supervision edges, flattened into named tensors.

A link dataset shares graphs and features exactly as node data does
(:func:`~lightning_zerocopy.data.host.share.share_host_data`: same segments, node order, ``mmap`` storage, no labels);
only the split tensors differ. :func:`link_split_tensors` flattens each :class:`LinkSplit` into named tensors
(``"<split>.pos_edge_index"``, ``".edge_label"``, ``".neg_edge_index"``, ``".neg_per_positive"``) that travel
through :class:`~lightning_zerocopy.data.handles.HostGraphHandles` like the node splits; :func:`link_splits` turns
the opened tensors back into :class:`LinkSplit` objects in every process.
"""

from __future__ import annotations

from typing import Mapping

import torch

from lightning_zerocopy.datasets.links import LINK_SPLITS, LinkData, LinkSplit

__all__ = ["link_split_tensors", "link_splits"]

_FIELDS = ("pos_edge_index", "edge_label", "neg_edge_index")


def link_split_tensors(data: LinkData) -> dict[str, torch.Tensor]:
    """The supervision edges of every split of ``data`` as named tensors (see the module docstring)."""
    tensors: dict[str, torch.Tensor] = {}
    for name, split in data.splits.items():
        for field in _FIELDS:
            value = getattr(split, field)
            if value is not None:
                tensors[f"{name}.{field}"] = value.contiguous()
        if split.neg_per_positive is not None:
            tensors[f"{name}.neg_per_positive"] = torch.tensor([split.neg_per_positive], dtype=torch.int64)
    return tensors


def link_splits(tensors: Mapping[str, torch.Tensor]) -> dict[str, LinkSplit]:
    """The :class:`LinkSplit` objects that :func:`link_split_tensors` flattened (tensors opened in this process)."""
    splits: dict[str, LinkSplit] = {}
    for name in LINK_SPLITS:
        pos = tensors.get(f"{name}.pos_edge_index")
        if pos is None:
            continue
        k = tensors.get(f"{name}.neg_per_positive")
        splits[name] = LinkSplit(
            pos_edge_index=pos,
            edge_label=tensors.get(f"{name}.edge_label"),
            neg_edge_index=tensors.get(f"{name}.neg_edge_index"),
            neg_per_positive=None if k is None else int(k[0]),
        )
    return splits
