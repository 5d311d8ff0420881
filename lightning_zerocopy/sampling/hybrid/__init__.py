"""Hybrid sampling: each batch sampled on the CPU threads or the GPU, whichever is expected to finish it first.

* :mod:`.policy` — the per-device cost models' use: :class:`HybridPolicy` (which device takes a batch) and
  :class:`HybridDispatcher` (one thread and CUDA stream per device, results handed back by key);
* :mod:`.placement` — the builder's side (``sampler_placement: hybrid | auto``): :class:`HybridSampling` (the
  devices this machine offers, the size estimate of one CSC or of one CSC per edge type, a policy per producer).

The batch is the same on either device (both samplers draw bitwise the same sample).
"""

from lightning_zerocopy.sampling.hybrid.placement import (
    HYBRID_PLACEMENTS,
    HybridSampling,
    SizeEstimator,
    cuda_usable,
    gpu_lane_placement,
    hybrid_lanes,
)
from lightning_zerocopy.sampling.hybrid.policy import Dispatch, HybridDispatcher, HybridMode, HybridPolicy, HybridStats

__all__ = [
    "Dispatch",
    "HYBRID_PLACEMENTS",
    "HybridDispatcher",
    "HybridMode",
    "HybridPolicy",
    "HybridSampling",
    "HybridStats",
    "SizeEstimator",
    "cuda_usable",
    "gpu_lane_placement",
    "hybrid_lanes",
]
