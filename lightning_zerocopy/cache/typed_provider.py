"""The strategy's cache as a DataModule's cache spec: one shard spec per featured node type.

:class:`TypedFeatureCache` is what :class:`~lightning_zerocopy.cache.setup.RankCache` hands a DataModule through
``set_feature_cache`` (a graph without types has one featured type,
:data:`~lightning_zerocopy.graph.schema.NODE`). Picklable and hashable, it travels with every builder, and each
process that builds batches (a trainer rank, a pipeline worker) opens one
:class:`~lightning_zerocopy.cache.segmented.SegmentedFeatureCache` per featured type through its device resources'
``feature_table``, from :meth:`TypedFeatureCache.provider` (one cached gather per type and batch, the segmented
gather kernel unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lightning_zerocopy.cache.segmented import SegmentedCacheSpec
from lightning_zerocopy.cache.sharded_provider import ShardedFeatureCache
from lightning_zerocopy.cache.decide import plans_digest

__all__ = ["TypedFeatureCache"]


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
        return plans_digest({t: s.plan for t, s in self.specs})

    def provider(self, node_type: str) -> Optional[ShardedFeatureCache]:
        """The cache provider of ``node_type`` (``None`` for a type this cache does not cover)."""
        for t, spec in self.specs:
            if t == node_type:
                return ShardedFeatureCache(spec)
        return None

    def __repr__(self) -> str:
        rows = ", ".join(f"{t}: {s.plan.num_cached}" for t, s in self.specs)
        return f"TypedFeatureCache(rows={{{rows}}}, digest={self.digest[:8]})"

