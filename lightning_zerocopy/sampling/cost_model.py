"""What a batch costs to sample: an expected sampled-subgraph size per seed, and per-device linear time models.

Two parts, both cheap enough to run inside the producer:

* :func:`expected_sample_edges` computes, once per graph and fanouts, the expected number of edges a seed's
  multi-hop sample has. A batch's size is then the sum over its seeds (:class:`SampleSizeEstimator`), a gather
  of ``batch_size`` floats.
* :class:`LinearCostModel` predicts one device's sampling time as ``a + b * size`` and is calibrated online
  from measured times by recursive least squares with exponential forgetting, so it follows a device that gets
  busier (the GPU training a model) or freer.

The size estimate (documented approximation)
--------------------------------------------
Let ``m_h(v)`` be the expected number of picks at target ``v`` on hop ``h``: ``min(deg(v), fanout_h)`` without
replacement (``deg(v)`` for fanout ``-1``), ``fanout_h`` with replacement when ``deg(v) > 0``. Let ``E_h(v)`` be
the expected edges of the sample rooted at ``v`` with fanouts ``h, h+1, ...``. Then::

    E_L(v) = 0,    E_h(v) = m_h(v) * (1 + mean_{u in N_in(v)} E_{h+1}(u))

(each pick is a uniformly drawn in-neighbor ``u``, whose own subtree is sampled on the next hop). The mean over
in-neighbors is exact for uniform picks; what the estimate ignores is de-duplication (a node reached twice is
sampled once), so it is an upper bound that grows with the batch's overlap. That is fine for a cost model: the
device models are fitted to measured times against the same estimate, so a consistent bias is absorbed in the
slope. One pass over the edges per hop after the first, in chunks of nodes (bounded temporaries), float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

__all__ = ["LinearCostModel", "SampleSizeEstimator", "expected_sample_edges"]

_CHUNK_EDGES = 1 << 24  # edges per chunk of the per-hop pass (bounds the float32 temporary at 64 MiB)


def _picks(degree: torch.Tensor, fanout: int, replace: bool) -> torch.Tensor:
    """Expected picks per target on one hop (float32)."""
    deg = degree.to(torch.float32)
    if fanout < 0:
        return deg
    if replace:
        return torch.where(degree > 0, torch.full_like(deg, float(fanout)), torch.zeros_like(deg))
    return deg.clamp(max=float(fanout))


def _neighbor_mean(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``mean(values[indices[indptr[v]:indptr[v+1]]])`` for every node ``v`` (0 where ``v`` has no in-edges)."""
    num_nodes = indptr.numel() - 1
    out = torch.zeros(num_nodes, dtype=torch.float32)
    degree = indptr[1:] - indptr[:-1]
    node = 0
    while node < num_nodes:
        # the largest node range whose edges fit the chunk (at least one node, however many edges it has)
        limit = int(indptr[node]) + _CHUNK_EDGES
        end = int(torch.searchsorted(indptr, torch.tensor([limit], dtype=indptr.dtype), right=True)) - 1
        end = min(max(end, node + 1), num_nodes)
        lo, hi = int(indptr[node]), int(indptr[end])
        if hi > lo:
            gathered = values.index_select(0, indices[lo:hi].to(torch.int64))
            sums = torch.segment_reduce(gathered, "sum", offsets=indptr[node : end + 1] - lo, unsafe=True)
            out[node:end] = sums
        node = end
    return out / degree.clamp(min=1).to(torch.float32)


def expected_sample_edges(
    indptr: torch.Tensor, indices: torch.Tensor, fanouts: Sequence[int], replace: bool = False
) -> torch.Tensor:
    """Expected sampled edges of each node's multi-hop sample, as a float32 tensor of ``num_nodes`` entries.

    Args:
        indptr: int64 CSC pointer (``num_nodes + 1`` entries, on the CPU).
        indices: int32/int64 in-neighbors of every node, grouped by target (on the CPU).
        fanouts: neighbors per hop (``-1`` = all), as the sampler takes them.
        replace: whether the sampler draws with replacement.

    Returns:
        ``E_0(v)`` of the module docstring for every node ``v``.

    Raises:
        ValueError: tensors of the wrong shape or device, or empty ``fanouts``.
    """
    if indptr.dim() != 1 or indptr.numel() < 1:
        raise ValueError(f"`indptr` must be a 1-D tensor of num_nodes + 1 entries, got shape {tuple(indptr.shape)}")
    if indptr.device.type != "cpu" or indices.device.type != "cpu":
        raise ValueError("`indptr` and `indices` must be CPU tensors (the estimate is computed on the host)")
    if len(fanouts) == 0:
        raise ValueError("`fanouts` is empty; give one fanout per hop")
    indptr = indptr.to(torch.int64)
    degree = indptr[1:] - indptr[:-1]
    below: Optional[torch.Tensor] = None  # E_{h+1}
    for hop in reversed(range(len(fanouts))):
        picks = _picks(degree, int(fanouts[hop]), replace)
        if below is None:
            below = picks
        else:
            below = picks * (1.0 + _neighbor_mean(indptr, indices, below))
    assert below is not None
    return below


class SampleSizeEstimator:
    """A batch's expected sampled-subgraph size: the sum of a per-node estimate over its seeds.

    Args:
        per_node: float32 expected sampled edges per node (:func:`expected_sample_edges`), indexed by the ids
            the seeds are given in.
    """

    def __init__(self, per_node: torch.Tensor) -> None:
        if per_node.dim() != 1:
            raise ValueError(f"`per_node` must be 1-D (one entry per node), got shape {tuple(per_node.shape)}")
        self.per_node = per_node.to(torch.float32)

    @classmethod
    def from_graph(
        cls, indptr: torch.Tensor, indices: torch.Tensor, fanouts: Sequence[int], replace: bool = False
    ) -> "SampleSizeEstimator":
        """The estimator of a CSC graph sampled with ``fanouts`` (see :func:`expected_sample_edges`)."""
        return cls(expected_sample_edges(indptr, indices, fanouts, replace))

    def size(self, seeds: torch.Tensor) -> float:
        """Expected sampled edges of a batch with these seed ids (plus one per seed, so a batch whose seeds have
        no in-edges still costs something).

        Raises:
            IndexError: a seed id outside ``[0, num_nodes)``.
        """
        seeds = seeds.to(device="cpu", dtype=torch.int64)
        if seeds.numel() == 0:
            return 0.0
        lo, hi = int(seeds.min()), int(seeds.max())
        if lo < 0 or hi >= self.per_node.numel():
            bad = lo if lo < 0 else hi
            raise IndexError(f"seed node id {bad} is out of range for a graph of {self.per_node.numel()} nodes")
        return float(self.per_node.index_select(0, seeds).sum()) + float(seeds.numel())


@dataclass
class _Fit:
    theta: list[float]  # [a, b'] in normalized units: time = a + b' * (size / scale)
    p: list[list[float]]  # 2x2 covariance


class LinearCostModel:
    """Online ``time = a + b * size`` for one device: recursive least squares with exponential forgetting.

    Each :meth:`observe` weighs the past by ``forgetting`` (0.9 remembers about the last 10 batches), so the
    model follows a device whose speed changes. Sizes are scaled by the first observed size to keep the 2x2
    system well conditioned, and the covariance is capped (``max_trace``) so that long runs of same-sized
    batches cannot wind it up. Predictions are never below ``min_seconds``.

    A regime change (the GPU starts or stops training a model) shows as measurements far off the prediction, all
    on one side. After ``reset_after`` consecutive observations off by more than ``reset_error`` (relative, same
    sign) the covariance is reset to its initial value, so the fit jumps to the new level at once instead of
    creeping there at the forgetting rate; a single outlier (a stray OS stall) does not reset it.

    Args:
        forgetting: weight of the past per observation, in ``(0, 1]``.
        max_trace: cap on the covariance trace (anti-windup); also its initial value.
        min_seconds: floor of every prediction.
        reset_error: relative prediction error that counts as "far off".
        reset_after: consecutive far-off observations (same sign) that reset the covariance.
    """

    def __init__(
        self,
        forgetting: float = 0.9,
        max_trace: float = 1e4,
        min_seconds: float = 1e-6,
        reset_error: float = 0.5,
        reset_after: int = 2,
    ) -> None:
        if not 0.0 < forgetting <= 1.0:
            raise ValueError(f"`forgetting` must be in (0, 1], got {forgetting}")
        if max_trace <= 0:
            raise ValueError(f"`max_trace` must be > 0, got {max_trace}")
        self.forgetting = float(forgetting)
        self.max_trace = float(max_trace)
        self.min_seconds = float(min_seconds)
        self.reset_error = float(reset_error)
        self.reset_after = int(reset_after)
        self.resets = 0
        self.observations = 0
        self._off = 0  # consecutive far-off observations, signed (+ slower than predicted, - faster)
        self._scale: Optional[float] = None
        self._fit = _Fit(theta=[0.0, 0.0], p=[[max_trace / 2, 0.0], [0.0, max_trace / 2]])

    @property
    def calibrated(self) -> bool:
        """Whether at least one measured time has been observed."""
        return self.observations > 0

    @property
    def coefficients(self) -> tuple[float, float]:
        """``(a, b)``: seconds per batch and seconds per unit of size (0 before the first observation)."""
        a, b = self._fit.theta
        return a, (b / self._scale if self._scale else 0.0)

    def predict(self, size: float) -> float:
        """Predicted seconds for a batch of ``size`` (``min_seconds`` before calibration)."""
        if self._scale is None:
            return self.min_seconds
        a, b = self._fit.theta
        return max(a + b * (float(size) / self._scale), self.min_seconds)

    def observe(self, size: float, seconds: float) -> None:
        """Update the fit with one measured ``(size, seconds)``; non-finite or negative values are ignored."""
        size, seconds = float(size), float(seconds)
        if not (math.isfinite(size) and math.isfinite(seconds)) or size < 0 or seconds < 0:
            return
        if self._scale is None:
            self._scale = max(size, 1.0)
        x = (1.0, size / self._scale)
        if self.observations > 0:
            self._track_regime(size, seconds)
        (p00, p01), (p10, p11) = self._fit.p
        px = (p00 * x[0] + p01 * x[1], p10 * x[0] + p11 * x[1])
        lam = self.forgetting
        denom = lam + x[0] * px[0] + x[1] * px[1]
        gain = (px[0] / denom, px[1] / denom)
        err = seconds - (self._fit.theta[0] * x[0] + self._fit.theta[1] * x[1])
        self._fit.theta = [self._fit.theta[0] + gain[0] * err, self._fit.theta[1] + gain[1] * err]
        # P = (P - g x^T P) / lambda, using x^T P = (P x)^T (P symmetric)
        p = [[(p00 - gain[0] * px[0]) / lam, (p01 - gain[0] * px[1]) / lam],
             [(p10 - gain[1] * px[0]) / lam, (p11 - gain[1] * px[1]) / lam]]  # fmt: skip
        sym = 0.5 * (p[0][1] + p[1][0])
        p[0][1] = p[1][0] = sym
        trace = p[0][0] + p[1][1]
        if trace > self.max_trace:
            k = self.max_trace / trace
            p = [[v * k for v in row] for row in p]
        self._fit.p = p
        self.observations += 1

    def _track_regime(self, size: float, seconds: float) -> None:
        predicted = self.predict(size)
        rel = (seconds - predicted) / max(predicted, self.min_seconds)
        if abs(rel) <= self.reset_error:
            self._off = 0
            return
        sign = 1 if rel > 0 else -1
        self._off = self._off + sign if self._off * sign > 0 else sign
        if abs(self._off) >= self.reset_after:
            half = self.max_trace / 2
            self._fit.p = [[half, 0.0], [0.0, half]]
            self._off = 0
            self.resets += 1

    def __repr__(self) -> str:
        a, b = self.coefficients
        return f"LinearCostModel(a={a:.3g}s, b={b:.3g}s/unit, observations={self.observations})"
