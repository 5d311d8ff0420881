"""Which feature rows a process serves from GPU memory: the cache provider extension point.

A *cache spec* is a small, picklable, hashable description (a frozen dataclass) of a GPU feature cache. The
DataModule carries one spec to every builder it hands out (:meth:`ZeroCopyDataModule.set_feature_cache`), so
the trainer process and a pipeline worker process build the same cache, each in its own process, from its own
:class:`~lightning_zerocopy.data.resources.DeviceResources`:

.. code-block:: python

    table = resources.feature_table(node_type, "auto", spec)   # DeviceResources calls spec.open(context) once
    x = table.gather(n_id, out=x_buffer)                        # rows of n_id, on the GPU

A provider implements :class:`FeatureCacheSpec` (``open(context) -> FeatureGather``): it decides which rows come
from GPU memory (replicated hot rows, this rank's shard, peer GPUs' shards opened over CUDA IPC) and returns
the object that gathers. :class:`HotRowsCache` (the ``hot_rows`` option) is the simplest: the ``rows`` nodes
sampled most often (:func:`~lightning_zerocopy.graph.reorder.most_frequent_neighbors`), copied to this GPU.

A cache may also hold one spec per featured node type (``provider(node_type) -> Optional[FeatureCacheSpec]``, which
``DeviceResources.feature_table`` asks first): :class:`TypedFeatureCache`, the Strategy's decided cache that
:class:`~lightning_zerocopy.cache.setup.RankCache` hands a DataModule (a graph without types has one featured type,
:data:`~lightning_zerocopy.graph.schema.NODE`), a
:class:`~lightning_zerocopy.cache.sharded_provider.ShardedFeatureCache` per type (one cached gather per type and
batch, the segmented gather kernel unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Protocol, runtime_checkable

import torch

from lightning_zerocopy.cache.segmented import SegmentedCacheSpec
from lightning_zerocopy.cache.sharded_provider import ShardedFeatureCache
from lightning_zerocopy.graph.reorder import most_frequent_neighbors
from lightning_zerocopy.options import GatherMode, check_count

if TYPE_CHECKING:
    from lightning_zerocopy.gather.cuda_table import CudaFeatureTable

__all__ = [
    "CacheContext",
    "FeatureCacheSpec",
    "FeatureGather",
    "HotRowsCache",
    "TypedFeatureCache",
    "plain_feature_table",
]


@runtime_checkable
class FeatureGather(Protocol):
    """What a cache provider returns: gathers feature rows into GPU memory."""

    def gather(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``table[ids]`` on the GPU (into ``out``, a ``(len(ids), dim)`` CUDA tensor, when given)."""
        ...

    def close(self) -> None:
        """Free the GPU memory this object holds (idempotent)."""
        ...


@dataclass(frozen=True)
class CacheContext:
    """What :class:`DeviceResources` gives a cache provider when it opens a cache in a process.

    Attributes:
        table: the host feature table, 2-D, contiguous, already registered for zero-copy reads on ``device``
            (so a provider passes ``register=False`` to :class:`~lightning_zerocopy.gather.CudaFeatureTable`).
        device: the CUDA device that gathers.
        mode: the read order asked for (``auto``/``direct``/``sorted``).
        num_nodes: rows of the table (nodes of the graph).
        neighbor_indices: returns the CSC neighbor array (a GPU copy when the topology is placed on this GPU,
            else the host array), for providers that rank rows by sampling frequency.
    """

    table: torch.Tensor
    device: torch.device
    mode: GatherMode
    num_nodes: int
    neighbor_indices: Callable[[], torch.Tensor]


@runtime_checkable
class FeatureCacheSpec(Protocol):
    """A picklable, hashable description of a GPU feature cache; ``open`` builds it in the calling process."""

    def open(self, context: CacheContext) -> FeatureGather:
        """Build the cache on ``context.device`` and return the object that gathers through it."""
        ...


def plain_feature_table(context: CacheContext, hot_rows: Optional[torch.Tensor] = None) -> "CudaFeatureTable":
    """A zero-copy table over ``context.table`` with an optional set of GPU-resident rows (no registration)."""
    from lightning_zerocopy.gather.cuda_table import CudaFeatureTable

    return CudaFeatureTable(context.table, context.device, mode=context.mode, hot_rows=hot_rows, register=False)


@dataclass(frozen=True)
class HotRowsCache:
    """The ``rows`` feature rows sampling picks most often (most frequent in-neighbors), copied to the GPU.

    Costs ``rows * num_features * dtype size`` bytes of GPU memory; capped at the number of nodes.

    Raises:
        TypeError / ValueError: ``rows`` is not an int >= 1.
    """

    rows: int

    def __post_init__(self) -> None:
        check_count(self.rows, "rows", minimum=1)

    def open(self, context: CacheContext) -> FeatureGather:
        hot = most_frequent_neighbors(context.neighbor_indices(), context.num_nodes, self.rows)
        return plain_feature_table(context, hot_rows=hot)


@dataclass(frozen=True)
class TypedFeatureCache:
    """A GPU feature cache over the rows of every featured node type (picklable, hashable).

    Attributes:
        specs: ``(node type, SegmentedCacheSpec)`` pairs, one per featured type (its plan may cache no row).

    Raises:
        TypeError / ValueError: a spec that is no ``SegmentedCacheSpec``, or a type named twice.
    """

    specs: tuple[tuple[str, SegmentedCacheSpec], ...]

    def __post_init__(self) -> None:
        specs = tuple((str(t), s) for t, s in self.specs)
        object.__setattr__(self, "specs", specs)
        names = [t for t, _ in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"TypedFeatureCache: a node type is named twice in {names}")
        for t, spec in specs:
            if not isinstance(spec, SegmentedCacheSpec):
                raise TypeError(f"TypedFeatureCache: the spec of {t!r} must be a SegmentedCacheSpec, "
                                f"got {type(spec).__name__}")  # fmt: skip

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(t for t, _ in self.specs)

    @property
    def digest(self) -> str:
        """One hash over every type's plan (equal on every rank of a cache group)."""
        from lightning_zerocopy.cache.decide import plans_digest

        return plans_digest({t: s.plan for t, s in self.specs})

    def provider(self, node_type: str) -> Optional[ShardedFeatureCache]:
        """The cache provider of ``node_type`` (``None`` for a type this cache does not cover)."""
        spec = dict(self.specs).get(node_type)
        return None if spec is None else ShardedFeatureCache(spec)

    def __repr__(self) -> str:
        rows = ", ".join(f"{t}: {s.plan.num_cached}" for t, s in self.specs)
        return f"TypedFeatureCache(rows={{{rows}}}, digest={self.digest[:8]})"

