"""The host copy of a link dataset: the node path's host copy, with the supervision edges as its split tensors.

A :class:`~lightning_zerocopy.datasets.links.LinkData` shares graph and features exactly as node data does
(:func:`~lightning_zerocopy.data.host.share.share_node_data`: same segments, node order, ``mmap`` storage, no labels);
only the split tensors differ. :func:`link_split_tensors` flattens each :class:`LinkSplit` into named tensors
(``"<split>.pos_edge_index"``, ``".edge_label"``, ``".neg_edge_index"``, ``".neg_per_positive"``) that travel
through :class:`~lightning_zerocopy.data.handles.HostGraphHandles` like the node splits; :func:`link_splits` turns
the opened tensors back into :class:`LinkSplit` objects in every process.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_zerocopy.data.host.builder import HostCopyBuilder
from lightning_zerocopy.datasets.link_checks import check_link_splits
from lightning_zerocopy.datasets.links import LINK_SPLITS, LinkData, LinkSplit

__all__ = ["LinkHostCopyBuilder", "link_split_tensors", "link_splits"]

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


class LinkHostCopyBuilder(HostCopyBuilder):
    """:class:`~lightning_zerocopy.data.host.builder.HostCopyBuilder` for a ``LinkDataset``: the same host copy, with
    the link splits as split tensors and the link split checks."""

    def _split_tensors(self, data: Any) -> dict[str, torch.Tensor]:
        return link_split_tensors(data)

    def _find_split_problems(self, data: Any, sources: dict[str, str]) -> list[str]:
        return check_link_splits(data, sources)
