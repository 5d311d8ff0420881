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

Typed graphs (:func:`expected_typed_sample_edges`) are the same recursion with types as data: one CSC per edge type
``(s, r, d)`` whose targets are ``d``-type nodes and whose in-neighbors are ``s``-type nodes, fanouts per edge type
and hop, as :class:`~lightning_zerocopy.sampling.hetero.HeteroNeighborSampler` samples them::

    E_L[t](v) = 0,    E_h[t](v) = sum over edge types (s, r, t) of m_h[(s, r, t)](v) * (1 + mean_{u in N_(s,r,t)(v)} E_{h+1}[s](u))

A homogeneous graph is the one-type case (:func:`expected_sample_edges` calls it with one node and one edge type),
and a batch seeded on several node types (a link batch's endpoints) costs the sum over every type's seeds
(:class:`TypedSampleSizeEstimator`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import torch

__all__ = [
    "LinearCostModel",
    "SampleSizeEstimator",
    "TypedSampleSizeEstimator",
    "expected_sample_edges",
    "expected_typed_sample_edges",
]

#: ``(source node type, relation, destination node type)``: the key of one edge type's CSC.
EdgeType = tuple[str, str, str]
#: the node and edge type of a homogeneous graph seen as a typed one
_ONE_TYPE = "node"
_ONE_EDGE_TYPE: EdgeType = (_ONE_TYPE, "to", _ONE_TYPE)

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

    The one-type case of :func:`expected_typed_sample_edges`.

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
    graphs = {_ONE_EDGE_TYPE: (indptr, indices)}
    per_type = expected_typed_sample_edges(graphs, {_ONE_TYPE: indptr.numel() - 1}, {_ONE_EDGE_TYPE: fanouts}, replace)
    return per_type[_ONE_TYPE]


def expected_typed_sample_edges(
    graphs: Mapping[EdgeType, tuple[torch.Tensor, torch.Tensor]],
    num_nodes: Mapping[str, int],
    fanouts: Mapping[EdgeType, Sequence[int]],
    replace: bool = False,
) -> dict[str, torch.Tensor]:
    """Expected sampled edges (over every edge type) of each node's multi-hop sample, per node type.

    Args:
        graphs: per edge type ``(s, r, d)``, its CSC ``(indptr, indices)`` on the CPU: targets are ``d``-type ids,
            ``indices`` ``s``-type ids. ``indptr`` may cover more targets than ``num_nodes[d]`` (a typed host copy
            sizes both id spaces to the larger type); the extra targets are ignored.
        num_nodes: nodes of every node type (the length of each returned tensor).
        fanouts: per edge type, neighbors per hop (``-1`` = all), every list of one length.
        replace: whether the sampler draws with replacement.

    Returns:
        Per node type, float32 ``E_0[t](v)`` of the module docstring for every ``t``-type node ``v`` (zeros for a
        type that is no edge type's destination: its nodes have no in-edges).

    Raises:
        ValueError: tensors of the wrong shape or device, empty or unequal ``fanouts``, an edge type without
            fanouts or naming an unknown node type.
    """
    if set(graphs) != set(fanouts):
        raise ValueError(f"`fanouts` must name exactly the edge types {list(graphs)}, got {list(fanouts)}")
    hops = {len(fanouts[et]) for et in graphs}
    if len(hops) > 1:
        raise ValueError(f"every edge type needs as many fanouts (hops), got lengths {sorted(hops)}")
    if not graphs or hops == {0}:
        raise ValueError("`fanouts` is empty; give one fanout per hop")
    csc: dict[EdgeType, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for et, (indptr, indices) in graphs.items():
        src, _, dst = et
        for node_type in (src, dst):
            if node_type not in num_nodes:
                raise ValueError(f"edge type {et} names {node_type!r}, not one of the node types {list(num_nodes)}")
        if indptr.dim() != 1 or indptr.numel() < 1:
            raise ValueError(f"`indptr` of {et} must be a 1-D tensor of num_nodes + 1 entries, got shape "
                             f"{tuple(indptr.shape)}")  # fmt: skip
        if indptr.device.type != "cpu" or indices.device.type != "cpu":
            raise ValueError("`indptr` and `indices` must be CPU tensors (the estimate is computed on the host)")
        indptr = indptr.to(torch.int64)
        csc[et] = (indptr, indices, indptr[1:] - indptr[:-1])
    below: Optional[dict[str, torch.Tensor]] = None  # E_{h+1} per node type
    for hop in reversed(range(hops.pop())):
        now: dict[str, torch.Tensor] = {}
        for et, (indptr, indices, degree) in csc.items():
            src, _, dst = et
            term = _picks(degree, int(fanouts[et][hop]), replace)
            if below is not None:
                term = term * (1.0 + _neighbor_mean(indptr, indices, _padded(below[src], indices)))
            term = _fit(term, num_nodes[dst])
            now[dst] = term if dst not in now else now[dst] + term
        below = {t: now.get(t, torch.zeros(int(n), dtype=torch.float32)) for t, n in num_nodes.items()}
    assert below is not None
    return below


def _fit(values: torch.Tensor, length: int) -> torch.Tensor:
    """``values`` cut or zero-padded to ``length`` entries (an edge type's CSC may cover more targets)."""
    if values.numel() >= length:
        return values[:length]
    return torch.cat([values, values.new_zeros(length - values.numel())])


def _padded(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``values`` long enough for every id of ``indices`` (a source type whose ids the CSC sizes larger)."""
    need = int(indices.max()) + 1 if indices.numel() else 0
    return values if values.numel() >= need else _fit(values, need)


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


class TypedSampleSizeEstimator:
    """A typed batch's expected sampled-subgraph size: the sum over node types of each type's estimate over its seeds.

    Args:
        per_node: per node type, float32 expected sampled edges per node (:func:`expected_typed_sample_edges`).
    """

    def __init__(self, per_node: Mapping[str, torch.Tensor]) -> None:
        self.per_type = {t: SampleSizeEstimator(values) for t, values in per_node.items()}

    @classmethod
    def from_graphs(
        cls,
        graphs: Mapping[EdgeType, tuple[torch.Tensor, torch.Tensor]],
        num_nodes: Mapping[str, int],
        fanouts: Mapping[EdgeType, Sequence[int]],
        replace: bool = False,
    ) -> "TypedSampleSizeEstimator":
        """The estimator of a typed graph sampled with ``fanouts`` (see :func:`expected_typed_sample_edges`)."""
        return cls(expected_typed_sample_edges(graphs, num_nodes, fanouts, replace))

    def size(self, seeds: Mapping[str, torch.Tensor]) -> float:
        """Expected sampled edges of a batch seeded with ``seeds`` (ids per node type), plus one per seed.

        Raises:
            ValueError: a node type the graph does not have.
            IndexError: a seed id outside its type's ``[0, num_nodes)``.
        """
        unknown = [t for t in seeds if t not in self.per_type]
        if unknown:
            raise ValueError(f"`seeds` names {unknown[0]!r}, not one of the node types {list(self.per_type)}")
        return sum((self.per_type[t].size(ids) for t, ids in seeds.items()), 0.0)


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
