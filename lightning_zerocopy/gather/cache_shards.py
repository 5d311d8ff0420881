"""Cache shards on GPUs and their CUDA IPC export: :func:`fill_shard` and :class:`ShardHandle`.

A shard's memory belongs to the process that called :func:`fill_shard`; see
:mod:`lightning_zerocopy.gather.feature_cache` for the lifetime rule. Opening a handle in another process goes
through ``torch.multiprocessing.reductions.rebuild_cuda_tensor`` (``cudaIpcOpenMemHandle``), which makes a CUDA
context on the shard's GPU in the opening process (a peer's shard therefore costs the opener a context on the
peer GPU, a few hundred MB). The same process opens its own exports directly (CUDA IPC cannot open a handle in the
process that exported it).
"""

from __future__ import annotations

import inspect
import os
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch

from lightning_zerocopy.gather.cache_plan import CachePlan

__all__ = ["ShardHandle", "fill_shard"]

# Tensors this process exported, by handle key: an opener in the same process uses the tensor itself.
_EXPORTED: "weakref.WeakValueDictionary[str, torch.Tensor]" = weakref.WeakValueDictionary()
# Rows copied per step while a shard is filled from the host table (bounds the temporary host/GPU memory).
_FILL_CHUNK_BYTES = 64 << 20


def _cuda_device(device: Union[torch.device, str, int, None], what: str = "device") -> torch.device:
    if not torch.cuda.is_available():
        raise RuntimeError(f"the GPU feature cache needs a CUDA device (`{what}`), but CUDA is not available")
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"`{what}` must be a CUDA device, got {dev}")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def _table_tensor(table: Any) -> torch.Tensor:
    """The 2-D tensor of a feature table (a tensor, or a HostFeatureTable's ``data``)."""
    if not isinstance(table, torch.Tensor) and isinstance(getattr(table, "data", None), torch.Tensor):
        table = table.data
    if not isinstance(table, torch.Tensor) or table.dim() != 2:
        raise ValueError("`table` must be a 2-D tensor (num_rows, dim) or a HostFeatureTable")
    if not table.is_contiguous():
        raise ValueError("`table` must be contiguous")
    return table


def _device_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def _local_device_index(device_uuid: str, fallback: int) -> int:
    """The index under which this process sees the GPU ``device_uuid`` (CUDA_VISIBLE_DEVICES may differ)."""
    for index in range(torch.cuda.device_count()):
        if _device_uuid(torch.device("cuda", index)) == device_uuid:
            return index
    raise RuntimeError(
        f"a cache shard lives on the GPU {device_uuid} (cuda:{fallback} in the process that filled it), which this "
        "process does not see; give every process of the machine the same CUDA_VISIBLE_DEVICES"
    )


def _rebuild_arg(name: str) -> int:
    """Position of argument ``name`` of ``torch.multiprocessing.reductions.rebuild_cuda_tensor``."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return list(inspect.signature(rebuild_cuda_tensor).parameters).index(name)


def _storage_device_arg() -> int:
    return _rebuild_arg("storage_device")


#: The reference counter an opener is handed instead of the exporter's: the name of no shared-memory file, so that
#: torch's decrement when an opener frees (or re-opens) the shard is a no-op (torch makes it best-effort: it catches
#: the failure to open the file). See :func:`_detach_ipc_ref_counter`.
_NO_REF_COUNTER = b"/lightning_zerocopy_no_ipc_ref_counter"


def _detach_ipc_ref_counter(ipc: list) -> list:
    """Take a shard's export out of torch's CUDA IPC reference counting (returns the arguments openers get).

    ``reduce_tensor`` gives the export one reference in the exporter's counter file, which torch expects exactly one
    consumer to drop when it frees what it received; while it is above zero, the exporter's freed shard waits in
    torch's "limbo" and the exporter's exit prints "Producer process has been terminated before all shared CUDA
    tensors released". A shard's handle, however, is pickled by value and opened by any number of processes (a
    pipeline worker per stage, every peer rank) or by none (the exporter itself reads its own tensor): the counter
    (an unsigned integer) then stays at 1, or wraps below zero, and the warning comes at every exit. The lifetime
    rule of :mod:`~lightning_zerocopy.gather.feature_cache` already keeps the shard alive while any opener reads it,
    so the exporter's reference is dropped here at once and openers get :data:`_NO_REF_COUNTER` instead.
    """
    handle_at, offset_at = _rebuild_arg("ref_counter_handle"), _rebuild_arg("ref_counter_offset")
    device = ipc[_storage_device_arg()]
    handle, offset = ipc[handle_at], ipc[offset_at]
    if isinstance(handle, bytes) and handle:
        torch.UntypedStorage._release_ipc_counter(handle, offset, device=device)
    ipc = list(ipc)
    ipc[handle_at], ipc[offset_at] = _NO_REF_COUNTER, 0
    return ipc


@dataclass(frozen=True)
class ShardHandle:
    """One cache shard on one GPU, exported over CUDA IPC by the process that filled it (picklable).

    Attributes:
        shard_index: which shard of the plan (its rows are ``plan.shard_rows(shard_index)``).
        num_rows, dim, dtype: the shard's shape and dtype.
        device_index: the GPU's index in the exporting process; ``device_uuid`` names it machine-wide.
        owner_pid: the exporting process (it must keep the shard alive, see the module docstring).
        key: unique name of this export (an opener in the exporting process finds the tensor by it).
        plan_digest: :attr:`CachePlan.digest` of the plan the shard was filled for.
        ipc: the arguments of ``torch.multiprocessing.reductions.rebuild_cuda_tensor`` (None for an empty shard).
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
    ipc: Optional[tuple] = field(default=None, repr=False, compare=False)

    def open(self, device: Optional[torch.device] = None) -> torch.Tensor:
        """The shard's tensor in this process (IPC-opened, or the exporter's own tensor in the exporting process).

        ``device`` is where an empty shard is placed (nothing is read from it); default: the shard's GPU.
        """
        if self.num_rows == 0 or self.dim == 0 or self.ipc is None:
            if device is None:
                device = torch.device("cuda", _local_device_index(self.device_uuid, self.device_index))
            return torch.empty((self.num_rows, self.dim), dtype=self.dtype, device=device)
        if self.owner_pid == os.getpid():
            tensor = _EXPORTED.get(self.key)
            if tensor is None:
                raise RuntimeError(
                    f"cache shard {self.shard_index} was exported by this process, but its tensor has already been "
                    "freed; keep the tensor fill_shard returned alive while any process uses the cache"
                )
            return tensor
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        args = list(self.ipc)
        args[_storage_device_arg()] = _local_device_index(self.device_uuid, self.device_index)
        tensor = rebuild_cuda_tensor(*args)
        if tuple(tensor.shape) != (self.num_rows, self.dim) or tensor.dtype != self.dtype:
            raise RuntimeError(
                f"cache shard {self.shard_index}: its IPC handle opened as {tuple(tensor.shape)} {tensor.dtype}, "
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
    table = _table_tensor(table)
    if table.shape[0] != plan.num_table_rows:
        raise ValueError(f"`table` has {table.shape[0]} rows, but the cache plan is for {plan.num_table_rows}")
    rows = plan.shard_rows(shard_index)
    dim = int(table.shape[1])
    shard = torch.empty((rows.numel(), dim), dtype=table.dtype, device=device)
    step = max(1, _FILL_CHUNK_BYTES // max(1, dim * table.element_size()))
    with torch.cuda.device(device):
        for start in range(0, rows.numel(), step):
            chunk = rows[start : start + step]
            if table.device.type == "cuda":
                shard[start : start + chunk.numel()].copy_(table.index_select(0, chunk.to(table.device)))
            else:
                shard[start : start + chunk.numel()].copy_(table.index_select(0, chunk))
        torch.cuda.synchronize(device)
    ipc = None
    if shard.numel() > 0:
        from torch.multiprocessing.reductions import reduce_tensor

        ipc = _detach_ipc_ref_counter(list(reduce_tensor(shard)[1]))
    handle = ShardHandle(
        shard_index=shard_index,
        num_rows=int(rows.numel()),
        dim=dim,
        dtype=table.dtype,
        device_index=int(device.index),
        device_uuid=_device_uuid(device),
        owner_pid=os.getpid(),
        key=uuid.uuid4().hex,
        plan_digest=plan.digest,
        ipc=tuple(ipc) if ipc is not None else None,
    )
    _EXPORTED[handle.key] = shard
    return shard, handle
