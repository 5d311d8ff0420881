"""The shape properties every gather over a 2-D feature table shares."""

from __future__ import annotations

import torch

__all__ = ["TableShape"]


class TableShape:
    """``num_rows``, ``dim``, ``dtype`` and ``row_bytes`` of ``self.table`` (a 2-D tensor set by the subclass)."""

    table: torch.Tensor

    @property
    def num_rows(self) -> int:
        return int(self.table.shape[0])

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        return self.table.dtype

    @property
    def row_bytes(self) -> int:
        return self.dim * self.table.element_size()
