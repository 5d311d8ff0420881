"""The hybrid side every builder shares (``sampler_placement`` ``hybrid``/``auto``), homogeneous or typed.

A builder (:class:`~lightning_zerocopy.data.batch.BatchBuilder`, of an untyped or a typed graph) holds one
:class:`HybridLanes`: which devices
("lanes") it samples on, decided when it is constructed (plain data, so it pickles with the builder's options), and,
once the builder is opened in a process, that process's
:class:`~lightning_zerocopy.sampling.hybrid.HybridSampling` (the size estimate and the serial placement policy of a
builder used directly). Types are data here: the builder hands over how to build its size estimator (one CSC,
:class:`~lightning_zerocopy.sampling.SampleSizeEstimator`, or one CSC per edge type,
:class:`~lightning_zerocopy.sampling.TypedSampleSizeEstimator`) and a plan item's seeds in the ids that estimator
takes (a tensor, or ids per node type). What each builder keeps is its own ``sample_batch(item, lane)``: ``"cpu"``
samples with the C++ threads (the structure then goes to the GPU in one pinned copy), ``"gpu"`` with the CUDA
sampler over a GPU copy of the topology; the two draw bitwise the same sample.

``auto`` is :class:`~lightning_zerocopy.sampling.HybridPolicy`'s ``mode="auto"`` for every builder: both lanes are
calibrated on the run's own batches (measured sampling time against the expected size), then both are kept only if
together they are measurably faster than the better one alone, else the faster one takes every batch. The
measurement needs nothing but a size per batch and a time per lane, so a typed graph is decided the same way.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from lightning_zerocopy.options import SamplerPlacement
from lightning_zerocopy.sampling.cost_model import SampleSizeEstimator, TypedSampleSizeEstimator
from lightning_zerocopy.sampling.hybrid.placement import (
    HybridSampling,
    SizeEstimator,
    cuda_usable,
    gpu_lane_placement,
    hybrid_lanes,
)
from lightning_zerocopy.sampling.hybrid.policy import HybridPolicy, HybridStats

__all__ = ["HybridLanes", "size_estimator"]


def size_estimator(graphs: Mapping[Any, Any], num_nodes: Mapping[str, int], fanouts: Any, replace: bool) -> SizeEstimator:
    """The hybrid cost models' size estimate of a builder's graph: one CSC's (:class:`SampleSizeEstimator`, seeds a
    tensor) for a list of fanouts, the typed one (:class:`TypedSampleSizeEstimator`, seeds per node type) for fanouts
    per edge type."""
    if not isinstance(fanouts, Mapping):
        (graph,) = graphs.values()
        return SampleSizeEstimator.from_graph(graph.indptr, graph.indices, fanouts, replace)
    typed = {et: (g.indptr, g.indices) for et, g in graphs.items()}
    return TypedSampleSizeEstimator.from_graphs(typed, dict(num_nodes), fanouts, replace)


class HybridLanes:
    """A builder's lanes (picklable) and, per process, its hybrid sampling state.

    Without a usable CUDA device (no GPU visible, or ``lightning_zerocopy._C`` without its CUDA kernels) a
    ``hybrid``/``auto`` builder warns once, naming why, and samples on the CPU only (``lanes`` is ``None``), as the
    DataModule does on a CPU trainer.

    Args:
        sampler_placement: the builder's placement (already validated); ``hybrid``/``auto`` pair the CPU threads
            with the ``gpu`` sampler, any other value is one device.

    Attributes:
        mode: ``sampler_placement``.
        gpu_placement: the placement of the builder's CUDA sampler (``"cpu"``: none).
        lanes: the devices a hybrid builder samples on, ``("cpu", "gpu")``, or ``None`` (one device).
    """

    def __init__(self, sampler_placement: SamplerPlacement) -> None:
        cuda, why = cuda_usable() if sampler_placement in ("hybrid", "auto") else (True, "")
        self.mode: SamplerPlacement = sampler_placement
        self.gpu_placement: str = gpu_lane_placement(sampler_placement, cuda)
        self.lanes: Optional[tuple[str, ...]] = hybrid_lanes(sampler_placement, cuda, why)
        self._sampling: Optional[HybridSampling] = None

    @property
    def hybrid(self) -> bool:
        """Whether the builder chooses a device per batch (two lanes)."""
        return self.lanes is not None

    def open(self, estimator: Callable[[], SizeEstimator]) -> None:
        """Create this process's hybrid sampling state (idempotent; nothing for a single-device builder).

        Args:
            estimator: builds the builder's size estimator (called once, at the first :meth:`expected_size`).
        """
        if self.lanes is not None and self._sampling is None:
            self._sampling = HybridSampling(self.mode, self.lanes, estimator)  # type: ignore[arg-type]

    def close(self) -> None:
        """Drop the process's state (the serial policy and the estimate); :meth:`open` makes it afresh."""
        if self._sampling is not None:
            self._sampling.close()
        self._sampling = None

    def check_lane(self, lane: Optional[str]) -> None:
        """Refuse a ``lane`` this builder does not sample on (``None``, the cost model's choice, is always valid).

        Raises:
            ValueError: one line naming the builder's lanes.
        """
        if lane is not None and lane not in (self.lanes or ()):
            raise ValueError(f"`lane` must be one of this builder's sampling devices {self.lanes}, got {lane!r}")

    def expected_size(self, seeds: Any) -> float:
        """Expected sampled edges of a batch seeded with ``seeds`` (the cost models' size).

        Raises:
            RuntimeError: a single-device builder (naming where it samples), or a hybrid one not opened yet.
        """
        if self.lanes is None:
            raise RuntimeError(f"expected_size() is for hybrid builders; this one samples on {self.gpu_placement!r}")
        if self._sampling is None:
            raise RuntimeError("open the builder before asking for expected_size()")
        return self._sampling.expected_size(seeds)

    def run(self, size: float, sample: Callable[[str], Any]) -> Any:
        """Sample one batch on the lane the serial policy picks for ``size`` (``sample(lane)``, on this thread)."""
        assert self._sampling is not None, "open the builder first"
        return self._sampling.run(size, sample)

    def policy(self) -> Optional[HybridPolicy]:
        """A fresh :class:`~lightning_zerocopy.sampling.HybridPolicy` over the lanes for a pipeline producer that
        samples batches ahead on all of them, or ``None`` for a single-device builder."""
        return None if self.lanes is None else HybridPolicy(self.lanes, mode=self.mode)  # type: ignore[arg-type]

    @property
    def stats(self) -> Optional[HybridStats]:
        """Where the serial policy placed the batches sampled through :meth:`run` (``None``: none yet, or not
        hybrid)."""
        return None if self._sampling is None else self._sampling.stats

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_sampling"] = None  # process-local: the receiving process opens its own
        return state

    def __repr__(self) -> str:
        return f"HybridLanes(mode={self.mode!r}, lanes={self.lanes})"
