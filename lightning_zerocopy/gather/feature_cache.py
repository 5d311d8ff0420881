"""A GPU feature cache whose hot rows live in shards on one or more GPUs, shared between processes over CUDA IPC.

The pieces (the Strategy decides budget, ranking, policy and cliques; this module only stores and gathers):

* :class:`~lightning_zerocopy.gather.cache_plan.CachePlan` — which rows are cached and which shard holds each.
* :func:`fill_shard` — a rank allocates one shard on its GPU, fills it from the host table and exports it:
  returns the tensor and a picklable :class:`ShardHandle` (a CUDA IPC handle plus what an opener needs).
* :class:`FeatureCacheSpec` — the plan plus the handles of every shard one GPU's processes read (one for
  ``replicate``, that GPU's own copy; ``k`` for a clique, the local shard and the peers').
* :func:`open_feature_cache` — in any process of the machine (trainer rank, pipeline worker) opens the shards,
  builds the row -> (shard, slot) lookup on its GPU and returns a :class:`SegmentedFeatureCache`, whose
  :meth:`~SegmentedFeatureCache.gather` reads every row from the local shard, a peer's shard or registered host
  memory in one kernel launch and counts local / peer / host rows on the GPU (read lazily, no host sync).

Lifetime rule (CUDA IPC): a shard's memory belongs to the process that called :func:`fill_shard`. That process
must keep the returned tensor alive until every process that opened the shard has closed its cache (the
Strategy: every rank closes its cache, the pipeline worker is stopped, a barrier, then ranks drop their shards).
Torch's IPC reference count covers one consumer per export, so this module does not rely on it.
:meth:`SegmentedFeatureCache.close` waits for the GPU to finish every queued read of the shards before it drops
them, so once ``close()`` returned in every opener the owner may free its shard. A process that opens a handle it
exported itself (a trainer rank gathering from its own shard) uses the tensor directly (CUDA IPC cannot open a
handle in the exporting process) and keeps a reference to it until ``close()``.
"""

from __future__ import annotations

import inspect
import os
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional, Union

import torch

from lightning_zerocopy import ops
from lightning_zerocopy.gather.cache_plan import CachePlan

__all__ = [
    "CacheCounts",
    "FeatureCacheSpec",
    "SegmentedFeatureCache",
    "ShardHandle",
    "fill_shard",
    "open_feature_cache",
]

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


def _storage_device_arg() -> int:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return list(inspect.signature(rebuild_cuda_tensor).parameters).index("storage_device")


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
            where = device if device is not None else torch.device("cuda", _local_device_index(self.device_uuid, self.device_index))
            return torch.empty((self.num_rows, self.dim), dtype=self.dtype, device=where)
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
            raise RuntimeError(f"cache shard {self.shard_index}: the IPC handle opened as {tuple(tensor.shape)} {tensor.dtype}")
        return tensor


@dataclass(frozen=True)
class FeatureCacheSpec:
    """What one GPU's processes need to open the cache: the plan and one handle per shard (picklable).

    Attributes:
        plan: the :class:`CachePlan` (identical on every rank).
        handles: ``handles[s]`` is shard ``s`` (one for ``replicate``: this GPU's copy; ``k`` for a clique).
        policy: ``"replicate"`` or ``"clique"`` (reported by telemetry).
    """

    plan: CachePlan
    handles: tuple[ShardHandle, ...]
    policy: str = "replicate"

    def __post_init__(self) -> None:
        object.__setattr__(self, "handles", tuple(self.handles))
        if not isinstance(self.plan, CachePlan):
            raise TypeError(f"FeatureCacheSpec: `plan` must be a CachePlan, got {type(self.plan).__name__}")
        if len(self.handles) != self.plan.num_shards:
            raise ValueError(
                f"FeatureCacheSpec: one handle per shard is needed ({self.plan.num_shards}), got {len(self.handles)}"
            )
        for s, handle in enumerate(self.handles):
            if not isinstance(handle, ShardHandle):
                raise TypeError(f"FeatureCacheSpec: `handles[{s}]` must be a ShardHandle, got {type(handle).__name__}")
            if handle.shard_index != s:
                raise ValueError(f"FeatureCacheSpec: `handles[{s}]` holds shard {handle.shard_index}; order them by shard")
            if handle.plan_digest != self.plan.digest:
                raise ValueError(f"FeatureCacheSpec: `handles[{s}]` was filled for another plan than `plan`")
            if handle.num_rows != self.plan.shard_sizes[s]:
                raise ValueError(
                    f"FeatureCacheSpec: `handles[{s}]` has {handle.num_rows} rows, the plan's shard {s} has "
                    f"{self.plan.shard_sizes[s]}"
                )
        if len({(h.dim, h.dtype) for h in self.handles}) > 1:
            raise ValueError("FeatureCacheSpec: every shard must have the same width and dtype")


class CacheCounts(NamedTuple):
    """Rows a :class:`SegmentedFeatureCache` served since it opened (or since ``reset_counts``)."""

    local: int
    peer: int
    host: int

    @property
    def total(self) -> int:
        return self.local + self.peer + self.host

    @property
    def hit_rate(self) -> float:
        """Fraction of rows served from GPU memory (local or peer); 0 before any gather."""
        return (self.local + self.peer) / self.total if self.total else 0.0


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

        _, ipc = reduce_tensor(shard)
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


class SegmentedFeatureCache:
    """``table[ids]`` on one GPU, hot rows read from GPU shards (local or peer), the rest from the host table.

    Made by :func:`open_feature_cache`; see the module docstring for the lifetime rule.
    """

    def __init__(
        self,
        spec: FeatureCacheSpec,
        table: torch.Tensor,
        device: torch.device,
        segments: tuple[torch.Tensor, ...],
        location: torch.Tensor,
        registration: Any = None,
    ) -> None:
        self.spec = spec
        self.table = table
        self.device = device
        self._segments = segments
        self._location = location
        self._registration = registration
        self._counts = torch.zeros(len(segments) + 1, dtype=torch.int64, device=device)
        self._local = tuple(seg.device == device for seg in segments)
        self.closed = False

    # ------------------------------------------------------------------------------------------ properties

    @property
    def plan(self) -> CachePlan:
        return self.spec.plan

    @property
    def policy(self) -> str:
        return self.spec.policy

    @property
    def segments(self) -> tuple[torch.Tensor, ...]:
        """The shards in shard order (local ones on :attr:`device`, peers' on their GPUs)."""
        return self._segments

    @property
    def location(self) -> torch.Tensor:
        """The row -> location lookup on :attr:`device` (see :mod:`~lightning_zerocopy.gather.cache_plan`)."""
        return self._location

    @property
    def slot_bits(self) -> int:
        return self.plan.slot_bits

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

    @property
    def num_cached(self) -> int:
        return self.plan.num_cached

    # -------------------------------------------------------------------------------------------- gather

    def gather(
        self, ids: torch.Tensor, out: Optional[torch.Tensor] = None, stream: Optional[torch.cuda.Stream] = None
    ) -> torch.Tensor:
        """``table[ids]`` into GPU memory, each row from its shard or the host table, in one launch.

        Args:
            ids: int32/int64 row ids (a CPU tensor is copied to :attr:`device` first).
            out: contiguous ``(len(ids), dim)`` CUDA tensor on :attr:`device` to write into, else a new one.
            stream: CUDA stream to run on (default: the current one). Returns once the rows are in ``out``.

        Raises:
            IndexError: an id is out of range (naming it and its position); nothing outside the table is read.
        """
        self._check_open()
        stream = torch.cuda.current_stream(self.device) if stream is None else stream
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            if ids.device != self.device:
                ids = ids.to(self.device, non_blocking=True)
            if out is None:
                out = torch.empty((ids.shape[0], self.dim), dtype=self.dtype, device=self.device)
            self._gather_into(ids, out)
        return out

    def _gather_into(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        ops.gather_segmented(
            self.table, ids, self._location, self.slot_bits, self._segments, out=out, counts=self._counts
        )

    # ----------------------------------------------------------------------------------------- telemetry

    def counts(self) -> CacheCounts:
        """Rows served from the local shard(s), peers' shards and host memory (reads the GPU counters: one sync)."""
        self._check_open()
        values = self._counts.tolist()
        local = sum(v for v, is_local in zip(values, self._local) if is_local)
        peer = sum(v for v, is_local in zip(values, self._local) if not is_local)
        return CacheCounts(local=int(local), peer=int(peer), host=int(values[-1]))

    def reset_counts(self) -> None:
        self._check_open()
        self._counts.zero_()

    # ------------------------------------------------------------------------------------------- cleanup

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this SegmentedFeatureCache is closed")

    def close(self) -> None:
        """Wait for every queued read of the shards, drop them and the lookup, unregister what this cache
        registered. After ``close()`` returned in every process that opened a shard, its owner may free it."""
        if self.closed:
            return
        self.closed = True
        torch.cuda.synchronize(self.device)
        for seg in self._segments:
            if seg.device != self.device:
                torch.cuda.synchronize(seg.device)
        self._segments, self._location = (), torch.empty(0)
        if self._registration is not None:
            self._registration.close()
            self._registration = None

    def __enter__(self) -> "SegmentedFeatureCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"SegmentedFeatureCache(policy={self.policy!r}, device={self.device}, num_rows={self.num_rows}, "
            f"cached={self.num_cached}, shards={self.plan.shard_sizes}, closed={self.closed})"
        )


def open_feature_cache(
    spec: FeatureCacheSpec,
    table: Any,
    device: Union[torch.device, str, int, None],
    *,
    register: bool = True,
) -> SegmentedFeatureCache:
    """Open the cache described by ``spec`` on ``device``, in any process of the machine.

    Opens every shard (CUDA IPC; the exporting process uses its own tensor), builds the row -> location lookup on
    ``device`` (4 or 8 bytes per table row, see :mod:`~lightning_zerocopy.gather.cache_plan`) and, for a CPU
    ``table``, registers it for zero-copy reads (unless ``register=False`` or it is pinned/registered already).
    Peer access to the GPUs of other shards is enabled by the gather kernel on its first launch.

    Args:
        spec: the shards and plan (from the Strategy).
        table: the host feature table (CPU tensor / HostFeatureTable, same memory every process maps) or a CUDA
            tensor on ``device``; ``(spec.plan.num_table_rows, dim)``.
        device: the GPU that gathers.
    """
    device = _cuda_device(device)
    table = _table_tensor(table)
    plan = spec.plan
    if table.shape[0] != plan.num_table_rows:
        raise ValueError(f"`table` has {table.shape[0]} rows, but the cache plan is for {plan.num_table_rows}")
    for handle in spec.handles:
        if handle.dim != table.shape[1] or handle.dtype != table.dtype:
            raise ValueError(
                f"cache shard {handle.shard_index} holds {handle.dim}-wide {handle.dtype} rows, but `table` is "
                f"{table.shape[1]}-wide {table.dtype}"
            )
    if table.device.type == "cuda" and table.device != device:
        raise ValueError(f"`table` is on {table.device}; a GPU table must be on the gathering device {device}")
    registration = None
    if table.device.type == "cpu" and register:
        from lightning_zerocopy.gather.cuda_table import register_host_tensor

        with torch.cuda.device(device):
            registration = register_host_tensor(table, name="table")
    try:
        segments = tuple(handle.open(device) for handle in spec.handles)
        location = plan.build_location(device)
    except BaseException:
        if registration is not None:
            registration.close()
        raise
    return SegmentedFeatureCache(spec, table, device, segments, location, registration)
