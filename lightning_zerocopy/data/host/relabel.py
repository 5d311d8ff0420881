"""Relabeling a graph and its rows into a locality-preserving node order, with a progress bar over the steps.

The helpers both ways of relabeling a host copy share: in memory, straight into the shared segments
(:func:`~lightning_zerocopy.data.host.share.share_node_data`), and into the on-disk node-order cache
(:func:`~lightning_zerocopy.data.host.disk_cache.build_node_order_cache`). The orders themselves are
:mod:`lightning_zerocopy.graph.reorder`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import torch
from tqdm.auto import tqdm

from lightning_zerocopy import ops
from lightning_zerocopy.gather.host_table import cast_chunk_into
from lightning_zerocopy.gather.precision_loss import PrecisionLoss
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.graph.reorder import NodeOrder, bfs_order, degree_order

__all__: list[str] = []  # helpers of share.py and disk_cache.py, not API

_log = logging.getLogger(__name__)
_ROW_CHUNK_BYTES = 64 * 1024 * 1024  # feature bytes relabeled per step (bounds memory, drives the bar)


def _labels(data: Any) -> Optional[torch.Tensor]:
    """The node labels of ``data`` (``None`` for a dataset without them, e.g. a link dataset)."""
    return getattr(data, "y", None)


def _compute_order(graph: CSCGraph, node_order: str) -> NodeOrder:
    if node_order == "bfs":
        return bfs_order(graph)
    if node_order == "degree":
        return degree_order(graph)
    raise ValueError(f"`node_order` must be 'bfs' or 'degree' here, got {node_order!r}")


def _relabel_rows_into(
    x: torch.Tensor, order: torch.Tensor, out: torch.Tensor, bar: Optional[tqdm], dtype_key: str = "feature_dtype"
) -> None:
    """``out[i] = x[order[i]]`` in chunks of rows (parallel row copies; ``x`` may be memory-mapped), cast to
    ``out``'s dtype when it differs (a value it cannot hold raises, naming ``dtype_key``)."""
    if x.shape != out.shape:
        raise ValueError(f"cannot relabel features of shape {tuple(x.shape)} into {tuple(out.shape)}")
    row_bytes = max(1, x[0].numel() * x.element_size()) if x.shape[0] > 0 else 1
    rows = max(1, _ROW_CHUNK_BYTES // row_bytes)
    flat_x = x.reshape(x.shape[0], -1) if x.dim() != 2 else x
    flat_out = out.reshape(out.shape[0], -1) if out.dim() != 2 else out
    if not flat_x.is_contiguous():
        flat_x = flat_x.contiguous()
    cast = flat_x.dtype != flat_out.dtype
    loss = PrecisionLoss()
    for start in range(0, x.shape[0], rows):
        stop = min(start + rows, x.shape[0])
        if cast:  # gather in the source dtype, then cast the chunk
            rows_x = ops.gather_rows(flat_x, order[start:stop])
            cast_chunk_into(rows_x, flat_out[start:stop], start, "features", dtype_key, loss)
        else:
            ops.gather_rows(flat_x, order[start:stop], flat_out[start:stop])
        if bar is not None:
            bar.set_postfix_str(f"{stop:,}/{x.shape[0]:,} rows", refresh=False)
    if cast:
        loss.check("features", flat_out.dtype, dtype_key)  # (rows in the new order: the ids are internal here)


class _Steps:
    """A progress bar over the named steps of one relabeling (shown only when it runs longer than a second),
    and a log line with the total time when that exceeds a second."""

    def __init__(self, node_order: str, names: list[str]) -> None:
        self.node_order = node_order
        self.names = names
        self.index = 0
        self.bar: Optional[tqdm] = None
        self.start = 0.0

    def __enter__(self) -> "_Steps":
        self.start = time.perf_counter()
        self.bar = tqdm(total=len(self.names), desc=self._desc(), unit="step", delay=1.0)
        return self

    def _desc(self) -> str:
        return f"node_order={self.node_order!r}: {self.names[min(self.index, len(self.names) - 1)]}"

    def next(self) -> None:
        self.index += 1
        assert self.bar is not None
        self.bar.set_description_str(self._desc(), refresh=False)
        self.bar.update(1)

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.bar is not None
        if exc_type is None:
            self.bar.update(len(self.names) - self.bar.n)
        self.bar.close()
        elapsed = time.perf_counter() - self.start
        if exc_type is None and elapsed > 1.0:
            _log.info("node_order=%r: relabeled graph, features and labels in %.1f s", self.node_order, elapsed)
