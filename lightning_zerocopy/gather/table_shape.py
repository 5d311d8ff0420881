"""What every gather over a 2-D feature table shares: the table's shape properties, and the checks of the table it
reads and of the GPU that gathers."""

from __future__ import annotations

from typing import Any, Union

import torch

__all__ = ["TableShape", "cuda_device", "feature_table_tensor"]


def feature_table_tensor(table: Any) -> torch.Tensor:
    """The 2-D tensor of a feature table (a tensor, or a HostFeatureTable's ``data``).

    Raises:
        ValueError: not a 2-D tensor (or a HostFeatureTable), or not contiguous.
    """
    if not isinstance(table, torch.Tensor) and isinstance(getattr(table, "data", None), torch.Tensor):
        table = table.data  # a HostFeatureTable
    if not isinstance(table, torch.Tensor) or table.dim() != 2:
        raise ValueError("`table` must be a 2-D tensor (num_rows, dim) or a HostFeatureTable")
    if not table.is_contiguous():
        raise ValueError("`table` must be contiguous")
    return table


def cuda_device(device: Union[torch.device, str, int, None], unavailable: str, what: str = "device") -> torch.device:
    """``device`` as a CUDA device with an index (``None``: the current one).

    Raises:
        RuntimeError: CUDA is not available (the message is ``unavailable``).
        ValueError: ``device`` is not a CUDA device (naming the argument ``what``).
    """
    if not torch.cuda.is_available():
        raise RuntimeError(unavailable)
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"`{what}` must be a CUDA device, got {dev}")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


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
