"""Where cached rows live: GPU cliques from measured peer access, and the ``cache_policy`` decision.

A *clique* is a set of GPUs of one machine in which every GPU can read every other's memory directly (peer
access both ways, as ``torch.cuda.can_device_access_peer`` reports it). Within a clique the hot set is split into
one shard per GPU; between cliques, and between machines, nothing is shared. The grouping is computed from the
measured matrix, never from a fixed layout.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, Callable, Literal, Optional, Sequence

import torch

if TYPE_CHECKING:
    from lightning_zerocopy.strategies.cache_cost import PolicyCosts

__all__ = ["CACHE_POLICIES", "CachePolicy", "Layout", "choose_layout", "find_cliques", "measure_peer_access"]

CachePolicy = Literal["replicate", "clique", "auto"]
CACHE_POLICIES = ("replicate", "clique", "auto")
_EXACT_LIMIT = 16  # devices up to which the largest cliques are found exactly (2^16 subsets)


def measure_peer_access(devices: Sequence[int]) -> list[list[bool]]:
    """``m[i][j]``: whether ``devices[i]`` can access ``devices[j]``'s memory (``True`` on the diagonal).

    Needs no CUDA context (``cudaDeviceCanAccessPeer``); the diagonal is ``True``.
    """
    n = len(devices)
    return [
        [i == j or bool(torch.cuda.can_device_access_peer(devices[i], devices[j])) for j in range(n)] for i in range(n)
    ]


def find_cliques(peer: Sequence[Sequence[bool]]) -> list[list[int]]:
    """Partition devices ``0..n-1`` into cliques of mutual peer access, largest first.

    Two devices are connected when each can access the other. Repeatedly takes the largest clique among the devices
    not yet grouped (ties: the lexicographically smallest set of indices), so the result is deterministic and the
    same on every rank. Exact up to 16 devices; above that a greedy pass in index order.

    Args:
        peer: square matrix, ``peer[i][j]`` = device ``i`` can access device ``j``.

    Returns:
        The groups, each sorted ascending, in the order they were taken (every device in exactly one group).

    Raises:
        ValueError: ``peer`` is not square.
    """
    n = len(peer)
    if any(len(row) != n for row in peer):
        raise ValueError(f"the peer-access matrix must be square, got rows of lengths {[len(r) for r in peer]}")
    linked = [[i == j or (bool(peer[i][j]) and bool(peer[j][i])) for j in range(n)] for i in range(n)]
    left = list(range(n))
    groups: list[list[int]] = []
    while left:
        group = _largest_clique(left, linked) if len(left) <= _EXACT_LIMIT else _greedy_clique(left, linked)
        groups.append(group)
        left = [d for d in left if d not in group]
    return groups


def _largest_clique(left: list[int], linked: list[list[bool]]) -> list[int]:
    for size in range(len(left), 1, -1):
        for subset in combinations(left, size):  # lexicographic order: the first hit is the smallest ids
            if all(linked[a][b] for a, b in combinations(subset, 2)):
                return list(subset)
    return [left[0]]


def _greedy_clique(left: list[int], linked: list[list[bool]]) -> list[int]:
    group = [left[0]]
    for d in left[1:]:
        if all(linked[d][g] for g in group):
            group.append(d)
    return group


@dataclass(frozen=True)
class Layout:
    """The decided placement of the cache on one machine.

    Attributes:
        policy: what runs: ``"replicate"`` or ``"clique"``.
        groups: positions (into the machine's device list) of the GPUs that share one cache, each group sorted;
            one group per device for ``"replicate"``.
        note: why this placement was chosen (one line, logged by the strategy), or ``""``.
    """

    policy: Literal["replicate", "clique"]
    groups: tuple[tuple[int, ...], ...]
    note: str = ""

    def group_of(self, position: int) -> tuple[int, ...]:
        """The group that the device at ``position`` belongs to."""
        for group in self.groups:
            if position in group:
                return group
        raise ValueError(f"device position {position} is in no group of {self.groups}")


def choose_layout(
    policy: str,
    peer: Sequence[Sequence[bool]],
    hot_rows: int,
    rows_per_gpu: int,
    key: str = "cache_policy",
    price: Optional[Callable[[int], "PolicyCosts"]] = None,
) -> Layout:
    """Decide replicate or clique for one machine.

    * ``replicate``: every GPU caches the same rows.
    * ``clique``: GPUs grouped by mutual peer access share one cache split into a shard per GPU. Without any peer
      pair (or with one GPU) it warns and replicates.
    * ``auto``: replicate where clique cannot help (one GPU, no peer access, or the hot rows fit one GPU's budget);
      otherwise the policy whose expected read time is smaller (``price``, see
      :mod:`~lightning_zerocopy.strategies.cache_cost`), or clique when no price is given. The note says why.

    Args:
        policy: ``"replicate"``, ``"clique"`` or ``"auto"``.
        peer: the machine's peer-access matrix over the devices its ranks use (see :func:`measure_peer_access`).
        hot_rows: rows worth caching (rows sampling ever reads; the whole table at most).
        rows_per_gpu: rows one GPU's budget holds.
        key: the option's name, for messages.
        price: for ``auto``, the expected costs of both policies given the clique size.

    Raises:
        ValueError: an unknown policy (the message names ``key``).
    """
    if policy not in CACHE_POLICIES:
        raise ValueError(f"{key} must be one of {', '.join(map(repr, CACHE_POLICIES))}, got {policy!r}")
    n = len(peer)
    replicate = tuple((i,) for i in range(n))
    if policy == "replicate":
        return Layout("replicate", replicate)
    cliques = find_cliques(peer)
    has_peers = any(len(group) > 1 for group in cliques)
    clique = tuple(tuple(g) for g in sorted(cliques))
    if policy == "clique":
        if not has_peers:
            why = "one GPU" if n == 1 else f"no peer access between the {n} GPUs"
            warnings.warn(f"{key}='clique' needs GPUs with peer access, but this machine has {why}: replicating")
            return Layout("replicate", replicate, note=f"clique requested, {why}: replicate")
        return Layout("clique", clique, note=_clique_note(cliques))
    # auto
    if n == 1:
        return Layout("replicate", replicate, note="auto: one GPU on this machine, replicate")
    if hot_rows <= rows_per_gpu:
        return Layout(
            "replicate", replicate, note=f"auto: the {hot_rows} hot rows fit one GPU's {rows_per_gpu}-row budget, replicate"
        )
    if not has_peers:
        return Layout("replicate", replicate, note=f"auto: no peer access between the {n} GPUs, replicate")
    if price is not None:
        costs = price(max(len(g) for g in cliques))
        if not costs.clique_wins:
            return Layout("replicate", replicate, note=costs.note())
        return Layout("clique", clique, note=f"{costs.note()}; {_clique_note(cliques)}")
    return Layout("clique", clique, note="auto: " + _clique_note(cliques))


def _clique_note(cliques: list[list[int]]) -> str:
    return "clique: shards over GPU groups " + " ".join("[" + ",".join(map(str, g)) + "]" for g in sorted(cliques))
