"""A GPU feature cache whose hot rows live in shards on one or more GPUs, shared between processes over CUDA IPC.

The pieces (the Strategy decides budget, ranking, policy and cliques; this module only stores and gathers):

* :class:`~lightning_zerocopy.cache.plan.CachePlan` — which rows are cached and which shard holds each.
* :func:`fill_shard` — a rank allocates one shard on its GPU, fills it from the host table and exports it:
  returns the tensor and a picklable :class:`ShardHandle` (a CUDA IPC handle plus what an opener needs).
* :class:`SegmentedCacheSpec` — the plan plus the handles of every shard one GPU's processes read (one for
  ``replicate``, that GPU's own copy; ``k`` for a clique, the local shard and the peers').
* :func:`open_feature_cache` — in any process of the machine (trainer rank, pipeline worker) opens the shards,
  builds the row -> (shard, slot) lookup on its GPU and returns a :class:`SegmentedFeatureCache`, whose
  :meth:`~SegmentedFeatureCache.gather` reads every row from the local shard, a peer's shard or registered host
  memory in one kernel launch and counts local / peer / host rows on the GPU (read lazily, no host sync).

Lifetime rule (CUDA IPC): a shard's memory belongs to the process that called :func:`fill_shard`. That process
must keep the returned tensor alive until every process that opened the shard has closed its cache (the
Strategy: every rank closes its cache, the pipeline worker is stopped, a barrier, then ranks drop their shards).
:meth:`SegmentedFeatureCache.close` waits for the GPU to finish every queued read of the shards before it drops
them, so once ``close()`` returned in every opener the owner may free its shard. Shards are exported as bare
memory handles (:mod:`lightning_zerocopy.graph.cuda_ipc`), mapped for the gathering GPU: a peer's shard is read
over the peer link and costs the opener no context on the peer GPU. A process that opens a handle it exported
itself (a trainer rank gathering from its own shard) uses the tensor directly and keeps a reference to it until
``close()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Union

import torch

from lightning_zerocopy import ops
from lightning_zerocopy.gather.table_shape import TableShape, feature_table_tensor
from lightning_zerocopy.cache.plan import CachePlan
from lightning_zerocopy.cache.shards import ShardHandle, _cuda_device, fill_shard
from lightning_zerocopy.gather.read_order import ReadOrderChooser
from lightning_zerocopy.gather.staged import staged_for
from lightning_zerocopy.options import GatherMode

__all__ = [
    "CacheCounts",
    "SegmentedCacheSpec",
    "SegmentedFeatureCache",
    "ShardHandle",
    "fill_shard",
    "open_feature_cache",
]


@dataclass(frozen=True)
class SegmentedCacheSpec:
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
            raise TypeError(f"SegmentedCacheSpec: `plan` must be a CachePlan, got {type(self.plan).__name__}")
        if len(self.handles) != self.plan.num_shards:
            raise ValueError(
                f"SegmentedCacheSpec: one handle per shard is needed ({self.plan.num_shards}), got {len(self.handles)}"
            )
        for s, handle in enumerate(self.handles):
            if not isinstance(handle, ShardHandle):
                raise TypeError(f"SegmentedCacheSpec: `handles[{s}]` must be a ShardHandle, got {type(handle).__name__}")
            if handle.shard_index != s:
                raise ValueError(
                    f"SegmentedCacheSpec: `handles[{s}]` holds shard {handle.shard_index}; order them by shard"
                )
            if handle.plan_digest != self.plan.digest:
                raise ValueError(f"SegmentedCacheSpec: `handles[{s}]` was filled for another plan than `plan`")
            if handle.num_rows != self.plan.shard_sizes[s]:
                raise ValueError(
                    f"SegmentedCacheSpec: `handles[{s}]` has {handle.num_rows} rows, the plan's shard {s} has "
                    f"{self.plan.shard_sizes[s]}"
                )
        if len({(h.dim, h.dtype) for h in self.handles}) > 1:
            raise ValueError("SegmentedCacheSpec: every shard must have the same width and dtype")

    def open(self, context: Any) -> "SegmentedFeatureCache":
        """Open the cache in this process: the DataModule's cache extension point.

        ``context`` is a :class:`lightning_zerocopy.cache.provider.CacheContext` (the host feature table, already
        registered for ``context.device``; the read order ``context.mode``): every builder that carries this spec
        (``ZeroCopyDataModule.set_feature_cache``), in the trainer or a pipeline worker, gathers through it.
        """
        return open_feature_cache(self, context.table, context.device, register=False, read_order=context.mode)


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


class SegmentedFeatureCache(TableShape):
    """``table[ids]`` on one GPU, hot rows read from GPU shards (local or peer), the rest from the host table.

    Made by :func:`open_feature_cache`; see the module docstring for the lifetime rule.
    """

    def __init__(
        self,
        spec: SegmentedCacheSpec,
        table: torch.Tensor,
        device: torch.device,
        segments: tuple[torch.Tensor, ...],
        location: torch.Tensor,
        registration: Any = None,
        read_order: GatherMode = "auto",
    ) -> None:
        self.spec = spec
        self.table = table
        self.device = device
        self._segments = segments
        self._location = location
        self._registration = registration
        # gather_mode 'staged': rows no shard holds come through host threads and the copy engines
        self._staged, order = staged_for(table, read_order)
        self._order = ReadOrderChooser(order)
        self._counts = torch.zeros(len(segments) + 1, dtype=torch.int64, device=device)
        # a shard opened over IPC is labelled with the gathering device wherever its memory lives
        self._local = tuple(handle.lives_on(device) for handle in spec.handles)
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
        """The shards in shard order, readable by :attr:`device` (a shard opened over IPC is labelled with it even
        when its memory is on a peer GPU; ``spec.handles[s].lives_on`` tells where it is)."""
        return self._segments

    @property
    def location(self) -> torch.Tensor:
        """The row -> location lookup on :attr:`device` (see :mod:`~lightning_zerocopy.cache.plan`)."""
        return self._location

    @property
    def slot_bits(self) -> int:
        return self.plan.slot_bits

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
            self._gather_into(ids, out, stream)
        return out

    def _gather_into(self, ids: torch.Tensor, out: torch.Tensor, stream: torch.cuda.Stream) -> None:
        if self._staged is not None:
            def in_shards(rows: torch.Tensor, into: torch.Tensor) -> None:  # every row held by a shard
                ops.gather_segmented(self.table, rows, self._location, self.slot_bits, self._segments, out=into,
                                     counts=self._counts)  # fmt: skip

            # location -1: not cached (cache/plan.py); the host rows counted as the kernel counts them
            self._counts[-1] += self._staged.gather(ids, out, lambda i: self._location[i.long()] >= 0, in_shards)
            stream.synchronize()  # as the kernel's path: the rows are in `out` on return
            return

        def gather(sort_ids: bool) -> None:
            ops.gather_segmented(self.table, ids, self._location, self.slot_bits, self._segments, out=out,
                                 counts=self._counts, sort_ids=sort_ids)  # fmt: skip

        self._order.run(gather, ids.numel(), stream)

    @property
    def read_order(self) -> Optional[str]:
        """``"direct"`` or ``"sorted"`` once decided (``read_order="auto"`` times both on the first gathers), or
        ``"staged"``."""
        return "staged" if self._staged is not None else self._order.chosen

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
        torch.cuda.synchronize(self.device)  # every kernel that read a shard ran on this device
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
    spec: SegmentedCacheSpec,
    table: Any,
    device: Union[torch.device, str, int, None],
    *,
    register: bool = True,
    read_order: GatherMode = "auto",
) -> SegmentedFeatureCache:
    """Open the cache described by ``spec`` on ``device``, in any process of the machine.

    Opens every shard for ``device`` (CUDA IPC; the exporting process uses its own tensor), builds the row ->
    location lookup on ``device`` (4 or 8 bytes per table row, see :mod:`~lightning_zerocopy.cache.plan`) and, for a CPU
    ``table``, registers it for zero-copy reads (unless ``register=False`` or it is pinned/registered already).
    Peer access to the GPUs of other shards is enabled when a shard is opened (or, for a process's own shard on
    another of its GPUs, by the gather kernel on its first launch).

    Args:
        spec: the shards and plan (from the Strategy).
        table: the host feature table (CPU tensor / HostFeatureTable, same memory every process maps) or a CUDA
            tensor on ``device``; ``(spec.plan.num_table_rows, dim)``.
        device: the GPU that gathers.
        register: register a CPU ``table`` here (False when the caller registered it and keeps it registered).
        read_order: ``"direct"`` (batch order), ``"sorted"`` (ascending ids: host rows read in address order) or
            ``"auto"`` (time both on the first gathers, keep the faster).
    """
    device = _cuda_device(device)
    table = feature_table_tensor(table)
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
        from lightning_zerocopy.graph.host_registration import register_host_tensor

        with torch.cuda.device(device):
            registration = register_host_tensor(table, name="table")
        table = registration.tensor  # `table`, or its page-aligned copy
    try:
        segments = tuple(handle.open(device) for handle in spec.handles)
        location = plan.build_location(device)
    except BaseException:
        if registration is not None:
            registration.close()
        raise
    return SegmentedFeatureCache(spec, table, device, segments, location, registration, read_order)
