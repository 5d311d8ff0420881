"""Negative sampling for link prediction: the configuration (PyG's ``NegativeSampling`` names) and the draws.

Negatives are drawn by the ``zerocopy::negative_nodes`` op from the counter-based streams the neighbor sampler uses
(``csrc/ops/random.h``), keyed by the batch's seed and each negative's position in its batch: a pure function of
the plan item, the same on every device, worker count and rank layout.

* ``binary``: ``ceil(B * amount)`` random node pairs ``(src_neg, dst_neg)``, labelled 0;
* ``triplet``: ``amount`` random destinations per positive (its source kept), ``dst_neg_index`` ``[B]`` or
  ``[B, amount]``.

Uniform over the nodes by default; ``src_weight`` / ``dst_weight`` draw node ``v`` with probability
``weight[v] / sum(weight)`` (inverse CDF over the cumulative weights): a ``[num_nodes]`` tensor, or ``"degree"``
(the node's out-degree for sources, in-degree for destinations, in the message-passing graph).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Optional, Union

import torch

from lightning_zerocopy import ops

__all__ = ["NEG_SAMPLING_MODES", "NegativeDraws", "NegativeSampling", "Weight", "parse_neg_sampling"]

#: Accepted ``neg_sampling`` modes.
NEG_SAMPLING_MODES = ("binary", "triplet")

#: A per-node weight of negative sampling: a tensor, or ``"degree"``.
Weight = Union[torch.Tensor, str, None]


@dataclass(frozen=True)
class NegativeSampling:
    """How negatives are drawn for the training edges (PyG's ``NegativeSampling``: ``mode``, ``amount``,
    ``src_weight``, ``dst_weight``).

    Attributes:
        mode: ``"binary"`` (random node pairs labelled 0) or ``"triplet"`` (random destinations per positive).
        amount: negatives per positive (binary: any ratio ``>= 0``; triplet: an integer ``>= 1``).
        src_weight: weights of the source draws (binary only): ``None`` (uniform), ``"degree"`` or a tensor.
        dst_weight: weights of the destination draws: ``None`` (uniform), ``"degree"`` or a tensor.
    """

    mode: Literal["binary", "triplet"]
    amount: float = 1.0
    src_weight: Weight = None
    dst_weight: Weight = None

    def is_binary(self) -> bool:
        return self.mode == "binary"

    def is_triplet(self) -> bool:
        return self.mode == "triplet"

    def num_negatives(self, num_positives: int) -> int:
        """Negatives drawn for a batch of ``num_positives`` (PyG: ``ceil(B * amount)``)."""
        return math.ceil(num_positives * self.amount)


def parse_neg_sampling(
    neg_sampling: Union[None, str, Mapping[str, Any], NegativeSampling],
    neg_sampling_ratio: float,
    key: str = "",
) -> Optional[NegativeSampling]:
    """The :class:`NegativeSampling` that ``neg_sampling`` and ``neg_sampling_ratio`` describe (``None``: no negatives).

    ``neg_sampling`` is ``None``, ``"binary"``, ``"triplet"``, a dict ``{mode, amount?, src_weight?, dst_weight?}`` or a
    :class:`NegativeSampling`. Binary negatives without an ``amount`` take ``neg_sampling_ratio``; triplet negatives
    default to one per positive.

    Raises:
        ValueError / TypeError: naming the argument (prefixed with ``key``, e.g. the recipe's ``data.init_args.``).
    """
    if isinstance(neg_sampling_ratio, bool) or not isinstance(neg_sampling_ratio, (int, float)):
        raise TypeError(f"{key}neg_sampling_ratio must be a number >= 0, got {neg_sampling_ratio!r}")
    if not math.isfinite(neg_sampling_ratio) or neg_sampling_ratio < 0:
        raise ValueError(
            f"{key}neg_sampling_ratio must be a finite number >= 0 (negatives per positive), got {neg_sampling_ratio}"
        )
    if neg_sampling is None:
        return None
    if isinstance(neg_sampling, NegativeSampling):
        fields: dict[str, Any] = dict(vars(neg_sampling))  # mode, amount, src_weight, dst_weight
    elif isinstance(neg_sampling, str):
        fields = {"mode": neg_sampling}
    elif isinstance(neg_sampling, Mapping):
        fields = dict(neg_sampling)
        unknown = sorted(set(fields) - {"mode", "amount", "src_weight", "dst_weight"})
        if unknown:
            raise ValueError(
                f"{key}neg_sampling has unknown key(s) {unknown}; it takes mode, amount, src_weight, dst_weight"
            )
        if "mode" not in fields:
            raise ValueError(f"{key}neg_sampling needs a 'mode' ({' or '.join(map(repr, NEG_SAMPLING_MODES))})")
    else:
        raise TypeError(
            f"{key}neg_sampling must be None, 'binary', 'triplet' or a dict with a mode, "
            f"got {type(neg_sampling).__name__}"
        )
    mode = fields["mode"]
    if mode not in NEG_SAMPLING_MODES:
        raise ValueError(
            f"{key}neg_sampling mode must be one of {NEG_SAMPLING_MODES} (or None for no negatives), got {mode!r}"
        )
    amount = fields.get("amount")
    if amount is None:
        amount = neg_sampling_ratio if mode == "binary" else 1
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount < 0:
        raise ValueError(f"{key}neg_sampling amount must be a finite number >= 0, got {amount!r}")
    if mode == "triplet" and (amount < 1 or int(amount) != amount):
        raise ValueError(
            f"{key}neg_sampling amount must be an integer >= 1 in triplet mode (negatives per positive), got {amount}"
        )
    for name in ("src_weight", "dst_weight"):
        _check_weight(fields.get(name), f"{key}neg_sampling.{name}")
    if mode == "triplet" and fields.get("src_weight") is not None:
        raise ValueError(
            f"{key}neg_sampling.src_weight: triplet negatives keep the positive's source; set only dst_weight"
        )
    return NegativeSampling(
        mode=mode, amount=float(amount) if mode == "binary" else int(amount),
        src_weight=fields.get("src_weight"), dst_weight=fields.get("dst_weight"),
    )  # fmt: skip


def _check_weight(weight: Weight, name: str) -> None:
    if weight is None or weight == "degree":
        return
    if isinstance(weight, str):
        raise ValueError(f"{name} must be None, 'degree' or a [num_nodes] tensor, got {weight!r}")
    numeric = isinstance(weight, torch.Tensor) and (
        weight.dtype.is_floating_point or weight.dtype in (torch.int32, torch.int64)
    )
    if not numeric or weight.dim() != 1:  # type: ignore[union-attr]
        raise TypeError(f"{name} must be None, 'degree' or a 1-D [num_nodes] tensor of weights, got {weight!r}")


class NegativeDraws:
    """The resolved negative sampler of one plan: the node count and the cumulative weights of each endpoint.

    Args:
        config: the negative sampling configuration.
        num_nodes: nodes of the graph (negatives are drawn from ``[0, num_nodes)``); with ``num_dst_nodes``, the
            nodes of the source endpoint's type.
        degree: ``degree(endpoint)`` gives every node's out-degree (``0``) or in-degree (``1``) in the message-passing
            graph, in the dataset's ids (called only for ``"degree"`` weights).
        key: how errors name the configuration (``data.init_args.``).
        num_dst_nodes: nodes of the destination endpoint's type, where the endpoints are typed (a heterogeneous
            graph's supervised edge type); ``None``: ``num_nodes``, one id space.

    Raises:
        ValueError: a weight tensor of the wrong length, with a negative or non-finite entry, or summing to zero.
    """

    def __init__(
        self,
        config: NegativeSampling,
        num_nodes: int,
        degree: Optional[Callable[[int], torch.Tensor]] = None,
        key: str = "",
        num_dst_nodes: Optional[int] = None,
    ) -> None:
        self.config = config
        self.num_nodes = int(num_nodes)
        self.num_dst_nodes = self.num_nodes if num_dst_nodes is None else int(num_dst_nodes)
        self.cum_src = _cumulative(config.src_weight, self.num_nodes, degree, 0, f"{key}neg_sampling.src_weight")
        self.cum_dst = _cumulative(config.dst_weight, self.num_dst_nodes, degree, 1, f"{key}neg_sampling.dst_weight")

    def draw(self, count: int, seed: int, endpoint: int) -> torch.Tensor:
        """``count`` negative node ids for ``endpoint`` (0 source, 1 destination) of the batch with ``seed``, from
        that endpoint's ids."""
        cum, nodes = (self.cum_src, self.num_nodes) if endpoint == 0 else (self.cum_dst, self.num_dst_nodes)
        return ops.negative_nodes(torch.arange(count, dtype=torch.int64), nodes, seed, endpoint, cum)


def _cumulative(
    weight: Weight, num_nodes: int, degree: Optional[Callable[[int], torch.Tensor]], endpoint: int, name: str
) -> Optional[torch.Tensor]:
    if weight is None:
        return None
    if isinstance(weight, str):  # "degree": out-degree for sources, in-degree for destinations
        if degree is None:
            raise ValueError(f"{name}='degree' needs the message-passing graph's degrees")
        weight = degree(endpoint)
    weight = weight.to(torch.float64)
    if weight.numel() != num_nodes:
        raise ValueError(f"{name} must hold one weight per node ({num_nodes}), got {weight.numel()}")
    if not bool(torch.isfinite(weight).all()) or bool((weight < 0).any()):
        raise ValueError(f"{name} must hold finite weights >= 0")
    cum = torch.cumsum(weight, 0)
    if not float(cum[-1]) > 0:
        raise ValueError(f"{name} sums to 0: at least one node needs a positive weight to be drawn")
    return cum.contiguous()
