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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Protocol, runtime_checkable

import torch

from lightning_zerocopy.graph.reorder import most_frequent_neighbors
from lightning_zerocopy.options import GatherMode, check_count

if TYPE_CHECKING:
    from lightning_zerocopy.gather.cuda_table import CudaFeatureTable

__all__ = ["CacheContext", "FeatureCacheSpec", "FeatureGather", "HotRowsCache", "plain_feature_table"]


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
