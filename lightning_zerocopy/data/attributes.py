"""The user's node- and edge-level attributes in a batch: each one a table of rows, gathered by ``n_id`` / ``e_id`` as
PyG's ``filter_data`` / ``filter_hetero_data`` index them.

Every attribute (:mod:`lightning_zerocopy.datasets.attributes`: ``AttributeKey(level, type, name)``, ``edge_attr``
among them) is one table in the host copy, its node/edge dimension first, in the dataset's ids (a node order never
renumbers it: node attributes are read at the batch's original ``n_id``). Where the batch is built decides how rows
are read, as for ``x``:

* a host batch, or a GPU batch with ``gather="cpu"``: the CPU gathers the rows (sent over pinned memory to a GPU);
* ``gather="zerocopy"``: :func:`open_attribute_table` (called by ``DeviceResources.attribute_table``) copies a small
  table (up to :data:`SMALL_ATTRIBUTE_BYTES`: masks, an ``edge_weight`` of a few million edges) to the GPU once and
  gathers there (no PCIe traffic per batch, no sync); a larger one is a zero-copy table over registered host memory,
  the kernel and read order of ``x`` (a wide float attribute is a feature). Hot-row caches serve ``x`` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from lightning_zerocopy.cache.provider import CacheContext, FeatureGather, plain_feature_table
from lightning_zerocopy.data.handles import AttributeHandle
from lightning_zerocopy.options import GatherMode

__all__ = ["DeviceRows", "HostAttribute", "SMALL_ATTRIBUTE_BYTES", "open_attribute_table", "row_width"]

#: An attribute table of at most this many bytes is copied to the GPU once (``gather="zerocopy"``); larger ones are
#: read from host memory by the zero-copy gather, row by row.
SMALL_ATTRIBUTE_BYTES = 32 * 1024 * 1024


def row_width(t: torch.Tensor) -> int:
    """Values per row of ``t`` (the product of its trailing sizes): its width as a 2-D table."""
    width = 1
    for size in t.shape[1:]:
        width *= int(size)
    return width


@dataclass
class HostAttribute:
    """One attribute mapped in this process.

    Attributes:
        rows: ``[num rows, *trailing]``, contiguous (shared memory): row ``i`` is node or edge ``i`` of its type.
        dim: where a batch puts the row dimension back (PyG's ``__cat_dim__``).
    """

    rows: torch.Tensor
    dim: int = 0

    @classmethod
    def open(cls, handle: AttributeHandle) -> "HostAttribute":
        return cls(handle.rows.open(), handle.dim)

    @property
    def table(self) -> torch.Tensor:
        """The rows as a 2-D table ``[num rows, width]`` (a view), what the gather kernels read."""
        return self.rows.view(self.rows.shape[0], row_width(self.rows))

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    def batch_value(self, gathered: torch.Tensor) -> torch.Tensor:
        """Gathered rows ``[n, width]`` in the user's layout: ``[n, *trailing]`` with the rows moved back to ``dim``."""
        value = gathered.view((gathered.shape[0], *self.rows.shape[1:]))
        return value if self.dim == 0 else value.movedim(0, self.dim)

    def gather(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The rows of ``ids`` (CPU), by the CPU kernel, into ``out`` (``[n, width]``) when given."""
        from lightning_zerocopy import ops

        table = self.table
        if out is None:
            out = torch.empty((ids.numel(), table.shape[1]), dtype=table.dtype)
        return ops.gather_rows(table, ids.contiguous(), out)


class DeviceRows:
    """A small attribute table copied to the GPU once; rows gathered there (a :class:`FeatureGather`)."""

    def __init__(self, table: torch.Tensor, device: torch.device) -> None:
        self.rows: Optional[torch.Tensor] = table.to(device)

    def gather(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        assert self.rows is not None, "this attribute table is closed"
        if ids.device != self.rows.device:
            ids = ids.to(self.rows.device, non_blocking=True)
        return torch.index_select(self.rows, 0, ids, out=out) if out is not None else self.rows[ids]

    def close(self) -> None:
        self.rows = None


def open_attribute_table(
    attribute: HostAttribute, registered: Callable[[], torch.Tensor], device: torch.device, mode: GatherMode
) -> FeatureGather:
    """The GPU gather path of ``attribute``: a :class:`DeviceRows` copy when it is small, else a zero-copy table over
    ``registered()`` (its 2-D table, registered for the GPU by the caller), read in ``mode``'s order."""
    if attribute.nbytes <= SMALL_ATTRIBUTE_BYTES:
        return DeviceRows(attribute.table, device)
    table = registered()
    context = CacheContext(table, device, mode, int(table.shape[0]), lambda: table.new_empty(0, dtype=torch.int64))
    with torch.cuda.device(device):
        return plain_feature_table(context)
