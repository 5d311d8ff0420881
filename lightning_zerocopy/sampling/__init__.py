"""Neighbor sampling: one multi-hop uniform sampler over a graph of any schema (one CSC per edge type) with PyG
``NeighborLoader`` output, and the
hybrid CPU/GPU placement of each batch's sampling (cost model + dispatcher)."""

from lightning_zerocopy.sampling.cost_model import (
    LinearCostModel,
    SampleSizeEstimator,
    TypedSampleSizeEstimator,
    expected_sample_edges,
    expected_typed_sample_edges,
)
from lightning_zerocopy.sampling.hetero import HeteroSampledBatch
from lightning_zerocopy.sampling.hybrid.policy import Dispatch, HybridDispatcher, HybridPolicy, HybridStats
from lightning_zerocopy.sampling.neighbor_sampler import (
    CSCLike,
    HeteroNeighborSampler,
    NeighborSampler,
    SampledBatch,
    node_keyed_bound,
    sample_bound,
    validate_fanouts,
)

__all__ = [
    "CSCLike",
    "Dispatch",
    "HeteroNeighborSampler",
    "HeteroSampledBatch",
    "HybridDispatcher",
    "HybridPolicy",
    "HybridStats",
    "LinearCostModel",
    "NeighborSampler",
    "SampleSizeEstimator",
    "SampledBatch",
    "TypedSampleSizeEstimator",
    "expected_sample_edges",
    "expected_typed_sample_edges",
    "node_keyed_bound",
    "sample_bound",
    "validate_fanouts",
]
