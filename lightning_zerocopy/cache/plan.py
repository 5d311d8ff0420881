"""Which hot rows a GPU feature cache holds, how they are split into shards, and the row -> location lookup.

A :class:`CachePlan` is pure data (CPU tensors and ints), identical on every rank that builds it from the same
ranking, and cheap to pickle. It says which rows of the host feature table are cached and which shard holds each:
shard ``s`` holds ``plan.rows[plan.bounds[s]:plan.bounds[s + 1]]``, in that order (slot ``j`` of the shard is
row ``plan.rows[plan.bounds[s] + j]``). ``replicate`` is a plan with one shard (every GPU holds a copy); a
clique of ``k`` peer-connected GPUs uses ``k`` shards, one per GPU.

The lookup (:meth:`CachePlan.build_location`) maps every row of the table to where it is served from, one entry
per table row, so a gather kernel finds a row's place with one read:

* ``-1``: not cached, read from the host table;
* otherwise ``(shard << slot_bits) | slot``.

Memory: the lookup costs 4 bytes per table row when it fits int32 (``slot_bits = 31 - ceil(log2(num_shards))``,
so every shard must hold fewer than ``2**slot_bits`` rows: 2**31 rows for one shard, 2**28 for up to 8 shards),
else 8 bytes per row (int64, ``slot_bits = 32``). For a 100M-node table that is 400 MB per GPU in the int32 form,
for each process that opens the cache (the trainer and its pipeline worker each build one). A sorted list of the
cached ids with a binary search would cost only the cached rows, at ~log2(rows) dependent reads per id; one
direct read was chosen because the gather is latency-bound.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Optional, Union

import torch

__all__ = ["CachePlan", "MAX_SHARDS", "decode_location", "location_bytes", "location_layout", "lookup_bytes"]

#: Most shards one lookup can address (the gather kernel keeps one pointer per shard in its launch arguments).
MAX_SHARDS = 32


def location_layout(num_shards: int, max_shard_rows: int) -> tuple[torch.dtype, int]:
    """The lookup's ``(dtype, slot_bits)`` for ``num_shards`` shards of at most ``max_shard_rows`` rows.

    int32 with the shard in the bits above ``slot_bits`` when every slot fits, else int64 with ``slot_bits = 32``.
    """
    if not 1 <= num_shards <= MAX_SHARDS:
        raise ValueError(f"`num_shards` must be in [1, {MAX_SHARDS}], got {num_shards}")
    shard_bits = math.ceil(math.log2(num_shards)) if num_shards > 1 else 0
    slot_bits = 31 - shard_bits
    if max_shard_rows <= (1 << slot_bits):
        return torch.int32, slot_bits
    return torch.int64, 32


def location_bytes(num_table_rows: int, num_shards: int, max_shard_rows: int) -> int:
    """GPU bytes of the lookup of one process that opens the cache (count it in the cache's budget, once per
    process on the GPU: a trainer rank and its pipeline worker each hold one)."""
    dtype, _ = location_layout(num_shards, max_shard_rows)
    return num_table_rows * (4 if dtype == torch.int32 else 8)


def lookup_bytes(num_table_rows: int, num_shards: int) -> int:
    """GPU bytes of the lookup of a ``num_table_rows``-row table over ``num_shards`` shards, at most, for one
    process that opens the cache: :func:`location_bytes` with the dtype as if every row were cached (a plan of
    fewer rows never needs a wider one), so it bounds :attr:`CachePlan.location_bytes` of any plan of the table,
    i.e. what :meth:`CachePlan.build_location` allocates. A budget is charged this for each node type before the
    type's first row (:mod:`~lightning_zerocopy.cache.cached_rows`).
    """
    return location_bytes(num_table_rows, num_shards, -(-num_table_rows // num_shards)) if num_table_rows else 0


@dataclass(frozen=True, eq=False)
class CachePlan:
    """The rows a GPU feature cache holds and how they are sharded (picklable, deterministic).

    Build it with :meth:`from_ranking`; the constructor only validates.

    Attributes:
        rows: int64 CPU tensor of cached row ids of the host feature table (internal ids), unique. Shard-major:
            shard ``s`` holds ``rows[bounds[s]:bounds[s + 1]]``, hottest first within each shard.
        num_shards: 1 for ``replicate`` (every GPU holds all of ``rows``), ``k`` for a clique of ``k`` GPUs.
        bounds: ``num_shards + 1`` non-decreasing offsets into ``rows``, from 0 to ``len(rows)``.
        num_table_rows: rows of the host feature table (the lookup has one entry per table row).
    """

    rows: torch.Tensor
    num_shards: int
    bounds: tuple[int, ...]
    num_table_rows: int
    _digest: str = field(init=False, repr=False, compare=False, default="")

    def __post_init__(self) -> None:
        rows = self.rows
        if not isinstance(rows, torch.Tensor) or rows.dtype != torch.int64 or rows.dim() != 1:
            raise ValueError("CachePlan: `rows` must be a 1-D int64 tensor of cached row ids")
        if rows.device.type != "cpu":
            raise ValueError(f"CachePlan: `rows` must be a CPU tensor, got {rows.device}")
        if not rows.is_contiguous():
            object.__setattr__(self, "rows", rows.contiguous())
            rows = self.rows
        if not isinstance(self.num_table_rows, int) or self.num_table_rows < 0:
            raise ValueError(f"CachePlan: `num_table_rows` must be an int >= 0, got {self.num_table_rows!r}")
        bounds = tuple(int(b) for b in self.bounds)
        object.__setattr__(self, "bounds", bounds)
        if not isinstance(self.num_shards, int) or not 1 <= self.num_shards <= MAX_SHARDS:
            raise ValueError(f"CachePlan: `num_shards` must be an int in [1, {MAX_SHARDS}], got {self.num_shards!r}")
        if len(bounds) != self.num_shards + 1 or bounds[0] != 0 or bounds[-1] != rows.numel():
            raise ValueError(
                f"CachePlan: `bounds` must have num_shards + 1 = {self.num_shards + 1} entries from 0 to "
                f"len(rows) = {rows.numel()}, got {bounds}"
            )
        if any(b > c for b, c in zip(bounds, bounds[1:])):
            raise ValueError(f"CachePlan: `bounds` must be non-decreasing, got {bounds}")
        if rows.numel():
            lo, hi = int(rows.min()), int(rows.max())
            if lo < 0 or hi >= self.num_table_rows:
                bad = lo if lo < 0 else hi
                raise IndexError(
                    f"CachePlan: `rows` holds the row id {bad}, outside a feature table of {self.num_table_rows} rows"
                )
            seen = torch.zeros(self.num_table_rows, dtype=torch.bool)
            seen[rows] = True
            if int(seen.sum()) != rows.numel():
                raise ValueError("CachePlan: `rows` must not repeat a row id")
        location_layout(self.num_shards, self.max_shard_rows)  # every slot must be addressable

    # ----------------------------------------------------------------------------------------------- build

    @classmethod
    def from_ranking(
        cls, ranking: torch.Tensor, num_table_rows: int, num_shards: int = 1, num_rows: Optional[int] = None
    ) -> "CachePlan":
        """A plan caching the first ``num_rows`` ids of ``ranking`` (hottest first) over ``num_shards`` shards.

        Rows are dealt round-robin (the ``i``-th hottest row goes to shard ``i % num_shards``), so every shard
        gets an equal share of the hot rows and the peers of a clique serve about equal traffic; shard sizes
        differ by at most one row. Deterministic: the same arguments give the same plan on every rank.

        Args:
            ranking: int64 (or int32) row ids, hottest first, unique (e.g. ``argsort(counts, descending=True)``).
            num_table_rows: rows of the host feature table.
            num_shards: 1 for ``replicate``, the clique size for ``clique``.
            num_rows: how many of ``ranking`` to cache (default all of it).
        """
        if not isinstance(ranking, torch.Tensor) or ranking.dim() != 1:
            raise ValueError("CachePlan.from_ranking: `ranking` must be a 1-D tensor of row ids, hottest first")
        if ranking.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"CachePlan.from_ranking: `ranking` must be int64 or int32, got {ranking.dtype}")
        if not isinstance(num_shards, int) or not 1 <= num_shards <= MAX_SHARDS:
            raise ValueError(f"`num_shards` must be an int in [1, {MAX_SHARDS}], got {num_shards!r}")
        total = ranking.numel() if num_rows is None else int(num_rows)
        if not 0 <= total <= ranking.numel():
            raise ValueError(f"`num_rows` must be in [0, len(ranking) = {ranking.numel()}], got {num_rows}")
        hot = ranking[:total].to(device="cpu", dtype=torch.int64)
        shards = [hot[s::num_shards] for s in range(num_shards)]
        bounds = [0]
        for part in shards:
            bounds.append(bounds[-1] + part.numel())
        rows = torch.cat(shards) if shards else hot
        return cls(rows=rows.contiguous(), num_shards=num_shards, bounds=tuple(bounds), num_table_rows=num_table_rows)

    # ---------------------------------------------------------------------------------------------- queries

    @property
    def num_cached(self) -> int:
        """Rows cached over all shards."""
        return int(self.rows.numel())

    @property
    def shard_sizes(self) -> tuple[int, ...]:
        return tuple(c - b for b, c in zip(self.bounds, self.bounds[1:]))

    @property
    def max_shard_rows(self) -> int:
        return max(self.shard_sizes, default=0)

    def shard_rows(self, shard: int) -> torch.Tensor:
        """Row ids held by ``shard``, in slot order (a view of :attr:`rows`)."""
        if not 0 <= shard < self.num_shards:
            raise IndexError(f"`shard` must be in [0, {self.num_shards}), got {shard}")
        return self.rows[self.bounds[shard] : self.bounds[shard + 1]]

    @property
    def location_dtype(self) -> torch.dtype:
        return location_layout(self.num_shards, self.max_shard_rows)[0]

    @property
    def location_bytes(self) -> int:
        """GPU bytes of this plan's lookup, per process that opens the cache (see :func:`location_bytes`)."""
        return location_bytes(self.num_table_rows, self.num_shards, self.max_shard_rows)

    @property
    def slot_bits(self) -> int:
        return location_layout(self.num_shards, self.max_shard_rows)[1]

    @property
    def digest(self) -> str:
        """A hash of the plan's content: equal plans (on any rank) have equal digests."""
        if not self._digest:
            h = hashlib.sha256()
            h.update(repr((self.num_shards, self.bounds, self.num_table_rows)).encode())
            h.update(self.rows.numpy().tobytes())
            object.__setattr__(self, "_digest", h.hexdigest()[:32])
        return self._digest

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CachePlan):
            return NotImplemented
        return self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    # ------------------------------------------------------------------------------------------------ lookup

    def build_location(self, device: Union[torch.device, str, None] = None) -> torch.Tensor:
        """The row -> location lookup (see the module docstring) on ``device`` (default CPU).

        One entry per table row: ``-1`` for a row served from the host table, else
        ``(shard << slot_bits) | slot`` in :attr:`location_dtype`, with ``slot_bits`` = :attr:`slot_bits`.
        """
        device = torch.device("cpu") if device is None else torch.device(device)
        dtype, slot_bits = self.location_dtype, self.slot_bits
        location = torch.full((self.num_table_rows,), -1, dtype=dtype, device=device)
        for shard in range(self.num_shards):
            rows = self.shard_rows(shard)
            if rows.numel() == 0:
                continue
            code = torch.arange(rows.numel(), dtype=torch.int64) | (shard << slot_bits)
            location[rows.to(device)] = code.to(device=device, dtype=dtype)
        return location

    def __repr__(self) -> str:
        return (
            f"CachePlan(num_cached={self.num_cached}, num_shards={self.num_shards}, "
            f"shard_sizes={self.shard_sizes}, num_table_rows={self.num_table_rows}, digest={self.digest[:8]})"
        )


def decode_location(location: torch.Tensor, slot_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split lookup entries into ``(shard, slot)`` int64 tensors; uncached entries give shard ``-1``."""
    code = location.to(torch.int64)
    cached = code >= 0
    shard = torch.where(cached, code >> slot_bits, torch.full_like(code, -1))
    slot = torch.where(cached, code & ((1 << slot_bits) - 1), torch.full_like(code, -1))
    return shard, slot
