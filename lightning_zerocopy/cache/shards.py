"""Cache shards on GPUs and their export to the machine's other processes: :func:`fill_shard` and :class:`ShardHandle`.

A shard's memory belongs to the process that called :func:`fill_shard`; see
:mod:`lightning_zerocopy.cache.segmented` for the lifetime rule. Shards travel as CUDA IPC memory handles
(:mod:`lightning_zerocopy.graph.cuda_ipc`): an opener maps a shard for the GPU that gathers, which reads a peer's
shard over the peer link, and a killed exporter leaves no file behind. The exporting process uses its own tensor
(CUDA IPC cannot open a handle in the process that exported it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch

from lightning_zerocopy.cache.plan import CachePlan
from lightning_zerocopy.gather.table_shape import cuda_device, feature_table_tensor
from lightning_zerocopy.graph.cuda_ipc import CudaTensorHandle, device_uuid, export_cuda_tensor, local_device_index

__all__ = ["ShardHandle", "fill_shard"]

# Rows copied per step while a shard is filled from the host table (bounds the temporary host/GPU memory).
_FILL_CHUNK_BYTES = 64 << 20


def _cuda_device(device: Union[torch.device, str, int, None]) -> torch.device:
    return cuda_device(device, "the GPU feature cache needs a CUDA device (`device`), but CUDA is not available")


@dataclass(frozen=True)
class ShardHandle:
    """One cache shard on one GPU, exported by the process that filled it (picklable).

    Attributes:
        shard_index: which shard of the plan (its rows are ``plan.shard_rows(shard_index)``).
        num_rows, dim, dtype: the shard's shape and dtype.
        device_index: the GPU's index in the exporting process; ``device_uuid`` names it machine-wide.
        owner_pid: the exporting process (it must keep the shard alive, see the module docstring).
        key: unique name of this export.
        plan_digest: :attr:`CachePlan.digest` of the plan the shard was filled for.
        ipc: the shard's memory handle (``None`` for an empty shard).
    """

    shard_index: int
    num_rows: int
    dim: int
    dtype: torch.dtype
    device_index: int
    device_uuid: str
    owner_pid: int
    key: str
    plan_digest: str
    ipc: Optional[CudaTensorHandle] = field(default=None, repr=False, compare=False)

    def lives_on(self, device: torch.device) -> bool:
        """Whether the shard's memory is on GPU ``device`` of this process (else a gather there reads a peer)."""
        return device_uuid(device) == self.device_uuid

    def open(self, device: Optional[torch.device] = None) -> torch.Tensor:
        """The shard's tensor in this process, mapped for the GPU ``device`` that gathers from it (default: the
        shard's GPU); the exporter's own tensor in the exporting process. An empty shard is placed on ``device``
        (nothing is read from it)."""
        if device is None:
            device = torch.device("cuda", local_device_index(self.device_uuid, self.device_index, "a cache shard"))
        if self.num_rows == 0 or self.dim == 0 or self.ipc is None:
            return torch.empty((self.num_rows, self.dim), dtype=self.dtype, device=device)
        tensor = self.ipc.open(device)
        if tuple(tensor.shape) != (self.num_rows, self.dim) or tensor.dtype != self.dtype:
            raise RuntimeError(
                f"cache shard {self.shard_index}: its handle opened as {tuple(tensor.shape)} {tensor.dtype}, "
                f"expected ({self.num_rows}, {self.dim}) {self.dtype}"
            )
        return tensor


def fill_shard(
    plan: CachePlan,
    shard_index: int,
    table: Any,
    device: Union[torch.device, str, int, None],
) -> tuple[torch.Tensor, ShardHandle]:
    """Allocate shard ``shard_index`` of ``plan`` on ``device``, fill it from ``table`` and export it.

    Args:
        plan: the cache plan.
        shard_index: which shard (``0 <= shard_index < plan.num_shards``).
        table: the feature table, ``(plan.num_table_rows, dim)``: a CPU tensor / HostFeatureTable or a CUDA tensor.
        device: the GPU that holds the shard.

    Returns:
        ``(shard, handle)``: the filled ``(rows, dim)`` tensor on ``device`` (keep it alive while any process
        uses the cache) and its picklable :class:`ShardHandle`. Returns once the shard is written.
    """
    device = _cuda_device(device)
    table = feature_table_tensor(table)
    if table.shape[0] != plan.num_table_rows:
        raise ValueError(f"`table` has {table.shape[0]} rows, but the cache plan is for {plan.num_table_rows}")
    rows = plan.shard_rows(shard_index)
    dim = int(table.shape[1])
    shard = torch.empty((rows.numel(), dim), dtype=table.dtype, device=device)
    step = max(1, _FILL_CHUNK_BYTES // max(1, dim * table.element_size()))
    with torch.cuda.device(device):
        for start in range(0, rows.numel(), step):
            chunk = rows[start : start + step]
            shard[start : start + chunk.numel()].copy_(table.index_select(0, chunk.to(table.device)))
        torch.cuda.synchronize(device)
    memory = export_cuda_tensor(shard)  # an empty shard exports no memory, only its shape
    handle = ShardHandle(
        shard_index=shard_index,
        num_rows=int(rows.numel()),
        dim=dim,
        dtype=table.dtype,
        device_index=int(device.index),
        device_uuid=memory.device_uuid,
        owner_pid=memory.owner_pid,
        key=memory.key,
        plan_digest=plan.digest,
        ipc=memory,
    )
    return shard, handle
