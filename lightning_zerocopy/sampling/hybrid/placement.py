"""The hybrid side of a builder (``sampler_placement`` ``hybrid``/``auto``): the
:class:`~lightning_zerocopy.data.batch.BatchBuilder` of an untyped or a typed graph, through :class:`~lightning_zerocopy.data.hybrid_lanes.HybridLanes`.

A hybrid builder samples each batch either with the C++ CPU threads (then copies the structure to the GPU in one
pinned transfer) or with the CUDA sampler over a GPU copy of the topology; both give bitwise the same sample, so
the batch does not depend on the choice. :class:`HybridSampling` holds what the choice needs:

* the devices ("lanes") this machine offers: ``("cpu", "gpu")``, or ``("cpu",)`` where there is no usable CUDA
  device (then the builder is a CPU builder and says so once);
* the per-seed size estimate of the builder's graph and fanouts (computed on first use, see
  :mod:`lightning_zerocopy.sampling.cost_model`; the builder says how: one CSC, or one per edge type);
* a fresh :class:`~lightning_zerocopy.sampling.HybridPolicy` for a pipeline producer, which samples several
  batches ahead concurrently (``hybrid_policy()``), and a serial dispatcher for a builder used directly (the
  in-loop loader): each batch then goes to the device predicted to be faster for it.
"""

from __future__ import annotations

import itertools
import threading
import warnings
from typing import Any, Callable, Optional, Protocol, Sequence

import torch

from lightning_zerocopy.sampling.hybrid.policy import HybridDispatcher, HybridMode, HybridPolicy, HybridStats

__all__ = ["HYBRID_PLACEMENTS", "HybridSampling", "SizeEstimator", "cuda_usable", "gpu_lane_placement", "hybrid_lanes"]

#: ``sampler_placement`` values that choose the device per batch.
HYBRID_PLACEMENTS = ("hybrid", "auto")
#: the CUDA sampler a hybrid builder pairs with the CPU threads (the topology copied to GPU memory).
_GPU_LANE = "gpu"


def cuda_usable() -> tuple[bool, str]:
    """Whether this process can run the CUDA sampler (a visible GPU and the CUDA kernels), and why not.

    Uses ``torch.cuda.is_available()``, which asks for the device count without initializing the driver.
    """
    from lightning_zerocopy import WITH_CUDA

    if not torch.cuda.is_available():
        return False, "no CUDA GPU is visible"
    if not WITH_CUDA:
        return False, "lightning_zerocopy._C was built without its CUDA kernels"
    return True, ""


def gpu_lane_placement(sampler_placement: str, cuda: bool) -> str:
    """The placement of the builder's CUDA sampler: the fixed one, ``"gpu"`` for a hybrid builder with CUDA,
    ``"cpu"`` (no CUDA sampler) for a hybrid builder without."""
    if sampler_placement in HYBRID_PLACEMENTS:
        return _GPU_LANE if cuda else "cpu"
    return sampler_placement


def hybrid_lanes(sampler_placement: str, cuda: bool, why: str = "") -> Optional[tuple[str, ...]]:
    """The lanes of a builder with ``sampler_placement``: ``("cpu", "gpu")`` for ``hybrid``/``auto`` with CUDA,
    ``None`` (one device) for a fixed placement or a machine without CUDA (then it warns once, naming ``why``, that
    sampling runs on the CPU only)."""
    if sampler_placement not in HYBRID_PLACEMENTS:
        return None
    if not cuda:
        warnings.warn(f"sampler_placement={sampler_placement!r}: {why}, so sampling runs on the CPU only", stacklevel=4)
        return None
    return ("cpu", _GPU_LANE)


class SizeEstimator(Protocol):
    """What a hybrid builder's size estimate answers: a batch's expected sampled edges from its seeds (a tensor of
    ids for one node type, ids per node type for a typed graph)."""

    def size(self, seeds: Any) -> float: ...


class HybridSampling:
    """Lanes, size estimate, and policies of one hybrid builder (process-local; the builder pickles its options).

    Args:
        mode: ``"hybrid"`` or ``"auto"`` (see :class:`~lightning_zerocopy.sampling.HybridPolicy`).
        lanes: the devices to sample on, e.g. ``("cpu", "gpu")``.
        estimator: builds the builder's size estimator (called once, on first use: one pass over the graph), e.g.
            :meth:`~lightning_zerocopy.sampling.SampleSizeEstimator.from_graph` of one CSC, or
            :meth:`~lightning_zerocopy.sampling.TypedSampleSizeEstimator.from_graphs` of one CSC per edge type.
    """

    def __init__(self, mode: HybridMode, lanes: Sequence[str], estimator: Callable[[], SizeEstimator]) -> None:
        self.mode: HybridMode = mode
        self.lanes = tuple(lanes)
        self._make_estimator = estimator
        self._estimator: Optional[SizeEstimator] = None
        self._serial: Optional[HybridDispatcher] = None
        self._keys = itertools.count()
        self._lock = threading.Lock()

    def expected_size(self, seeds: Any) -> float:
        """Expected sampled edges of a batch with these seeds (in the ids the estimator was built over)."""
        if self._estimator is None:
            with self._lock:
                if self._estimator is None:
                    self._estimator = self._make_estimator()
        return self._estimator.size(seeds)

    def policy(self, **options: Any) -> HybridPolicy:
        """A fresh placement policy over this builder's lanes (for a pipeline producer's dispatcher)."""
        return HybridPolicy(self.lanes, mode=self.mode, **options)

    def run(self, size: float, sample: Callable[[str], Any]) -> Any:
        """Sample one batch on the device the serial policy picks (on the calling thread); returns the sample."""
        if self._serial is None:
            self._serial = HybridDispatcher(self.policy())
        result, _ = self._serial.run(next(self._keys), size, sample)
        return result

    @property
    def stats(self) -> Optional[HybridStats]:
        """Placement figures of the batches sampled through :meth:`run` (``None`` before the first)."""
        return None if self._serial is None else self._serial.stats

    def close(self) -> None:
        """Stop the serial dispatcher (it has no threads; kept for symmetry) and forget the estimate."""
        if self._serial is not None:
            self._serial.close()
        self._serial, self._estimator = None, None
