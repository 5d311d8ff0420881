"""Neighbor samplers: multi-hop uniform sampling over a CSC graph with PyG ``NeighborLoader`` output."""

from lightning_zerocopy.sampling.neighbor_sampler import (
    CSCLike,
    NeighborSampler,
    SampledBatch,
    sample_bound,
    validate_fanouts,
)

__all__ = ["CSCLike", "NeighborSampler", "SampledBatch", "sample_bound", "validate_fanouts"]
