"""The batch plan: which seed nodes make up every mini-batch, as a pure function.

``BatchPlan.item(epoch, step)`` depends only on the plan's configuration (input nodes, batch size,
shuffle, drop_last, base seed, rank, world size) and its arguments, so every execution path -- the
in-process loader, a pipeline worker process, every DDP rank, a run resumed from a checkpoint -- computes
the same batches without talking to each other.

Per epoch, the input nodes are put in one order shared by all ranks (a permutation seeded by the base seed
and the epoch when ``shuffle``), made divisible by the world size (dropping the tail when ``drop_last``,
else wrapping around to repeat the first nodes, as ``torch.utils.data.DistributedSampler`` does), and dealt
round-robin: rank ``r`` takes positions ``r, r + world_size, ...``. Ranks therefore get disjoint (up to the
wrap-around padding) shares of equal length, and the same number of steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch

_MASK64 = (1 << 64) - 1

#: The random stream of each split's plan (:class:`BatchPlan`'s ``stream``), so that plans sharing a seed draw
#: different batches; the same for node and link plans.
SPLIT_STREAMS: dict[str, int] = {"train": 0, "val": 1, "test": 2, "predict": 3}


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(*parts: int) -> int:
    """Mix integers into one well-spread non-negative 63-bit seed (splitmix64 chain)."""
    state = 0
    for part in parts:
        state = _splitmix64(state ^ (part & _MASK64))
    return state >> 1


@dataclass(frozen=True)
class PlanItem:
    """One mini-batch of the plan.

    Attributes:
        seed_ids: int64 global ids of the batch's seed (target) nodes, in batch order.
        input_id: int64 positions of these seeds in the plan's input nodes (what a resume deals).
        batch_seed: seed for the neighbor sampler of this batch.
        epoch: epoch of the batch.
        step: index of the batch within the rank's epoch.
        rank: rank the batch belongs to.
        ids_as_input_id: the batch's ``input_id`` holds the seeds' node ids (a split given as a boolean mask, as PyG's
            ``get_input_nodes`` makes it), not their positions.
    """

    seed_ids: torch.Tensor
    input_id: torch.Tensor
    batch_seed: int
    epoch: int
    step: int
    rank: int
    ids_as_input_id: bool = False

    @property
    def batch_input_id(self) -> torch.Tensor:
        """The batch's ``input_id`` as PyG's loaders set it: the seeds' positions in the split, or their node ids
        where the split was a boolean mask (:attr:`ids_as_input_id`)."""
        return self.seed_ids if self.ids_as_input_id else self.input_id

    @property
    def batch_size(self) -> int:
        """Seed nodes of the batch (what the sampler starts from)."""
        return int(self.seed_ids.numel())

    @property
    def task_fields(self) -> dict[str, torch.Tensor]:
        """The batch's fields besides the sampled subgraph's, as CPU tensors: none for a node batch (a link item,
        :class:`~lightning_zerocopy.data.link_plan.LinkPlanItem`, has its supervision edges); the builder moves
        them to the batch's device (:func:`~lightning_zerocopy.data.assemble.complete_batch`)."""
        return {}

    @property
    def typed_seeds(self) -> Optional[dict[str, torch.Tensor]]:
        """The seeds per node type where a heterogeneous batch starts from several types (a link item over a typed
        edge type); ``None``: ``seed_ids`` are of one type (the builder's input type)."""
        return None

    @property
    def task_batch_size(self) -> int:
        """The built batch's ``batch_size``: its seed nodes (a link item: its positive edges)."""
        return self.batch_size


class BatchPlan:
    """Deterministic assignment of seed nodes to (epoch, rank, step) mini-batches.

    Args:
        input_nodes: int64 ids of the nodes to iterate (e.g. the training split).
        batch_size: seeds per batch.
        shuffle: reorder the input nodes every epoch (seeded by ``seed`` and the epoch).
        drop_last: drop the nodes that do not fill a whole share per rank and a whole last batch; otherwise
            shares are padded by wrap-around and the last batch may be smaller.
        seed: base seed of the shuffles and of the per-batch sampler seeds.
        rank: this process's rank in ``[0, world_size)``.
        world_size: number of ranks sharing the epoch.
        stream: a label that separates the random streams of plans sharing a seed (e.g. train vs. val).
        sampler_seed: ``"batch"``: every batch gets its own sampler seed, from (seed, stream, epoch, world size,
            rank, step); ``"split"``: every batch of every epoch gets the one seed of (seed, stream), for node-keyed
            (evaluation) sampling, where a node's sample then depends on neither its batch, rank nor world size.
        input_id_kind: what a batch's ``input_id`` holds, as PyG's loaders: ``"position"`` (the seeds' positions in
            ``input_nodes``: a split given as ids) or ``"node"`` (their node ids: a split given as a boolean mask).
    """

    def __init__(
        self,
        input_nodes: torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        stream: int = 0,
        sampler_seed: Literal["batch", "split"] = "batch",
        input_id_kind: Literal["position", "node"] = "position",
    ) -> None:
        if input_nodes.dim() != 1:
            raise ValueError(f"input_nodes must be a 1-D tensor of node ids, got shape {tuple(input_nodes.shape)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size); got rank={rank}, world_size={world_size}")
        if sampler_seed not in ("batch", "split"):
            raise ValueError(f"sampler_seed must be 'batch' or 'split', got {sampler_seed!r}")
        if input_id_kind not in ("position", "node"):
            raise ValueError(f"input_id_kind must be 'position' or 'node', got {input_id_kind!r}")
        self.input_id_kind = input_id_kind
        self.input_nodes = input_nodes.to(torch.int64).contiguous()
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.stream = int(stream)
        self.sampler_seed = sampler_seed
        self._cached: Optional[tuple[int, torch.Tensor]] = None

    @property
    def share_size(self) -> int:
        """Number of seeds per rank per epoch (equal on every rank)."""
        n, w = self.input_nodes.numel(), self.world_size
        return n // w if self.drop_last else -(-n // w)

    @property
    def max_seed_nodes(self) -> int:
        """An upper bound on the seed nodes of an item (sizes a pipeline's slots)."""
        return self.batch_size

    def __len__(self) -> int:
        """Steps per epoch on each rank."""
        share = self.share_size
        return share // self.batch_size if self.drop_last else -(-share // self.batch_size)

    def share(self, epoch: int) -> torch.Tensor:
        """Positions (into ``input_nodes``) of this rank's seeds for ``epoch``, in batch order."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        n = self.input_nodes.numel()
        if self.shuffle:
            gen = torch.Generator().manual_seed(derive_seed(self.seed, self.stream, epoch))
            order = torch.randperm(n, generator=gen)
        else:
            order = torch.arange(n)
        total = self.share_size * self.world_size
        if total > n:  # pad by wrapping around (repeating as often as needed for tiny inputs)
            order = order.repeat(-(-total // n))
        positions = order[:total][self.rank :: self.world_size].contiguous()
        self._cached = (epoch, positions)
        return positions

    def item(self, epoch: int, step: int) -> PlanItem:
        """The mini-batch ``step`` of ``epoch`` on this rank."""
        if not 0 <= step < len(self):
            raise IndexError(f"step {step} out of range: the plan has {len(self)} steps per epoch")
        positions = self.share(epoch)[step * self.batch_size : (step + 1) * self.batch_size]
        if self.sampler_seed == "split":
            batch_seed = derive_seed(self.seed, self.stream)
        else:
            batch_seed = derive_seed(self.seed, self.stream, epoch, self.world_size, self.rank, step)
        return self.item_of(positions, batch_seed, epoch, step)

    def item_of(self, positions: torch.Tensor, batch_seed: int, epoch: int, step: int) -> PlanItem:
        """The item of this rank whose seeds are at ``positions`` (into ``input_nodes``), sampled with ``batch_seed``:
        :meth:`item`'s, or a resumed epoch's (:class:`~lightning_zerocopy.data.resume.ResumedPlan`)."""
        return PlanItem(self.input_nodes[positions], positions, batch_seed, epoch, step, self.rank,
                        ids_as_input_id=self.input_id_kind == "node")  # fmt: skip

    @property
    def positions_plan(self) -> "BatchPlan":
        """The plan whose input positions batches deal (itself; a link plan deals its edges' positions): a resume on
        another world size (:mod:`~lightning_zerocopy.data.resume`) deals what is left of it."""
        return self

    def expand(self, item: PlanItem) -> PlanItem:
        """The batch of a :attr:`positions_plan` item (itself; a link plan adds the edges' endpoints and negatives)."""
        return item

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cached"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"BatchPlan(num_inputs={self.input_nodes.numel()}, batch_size={self.batch_size}, shuffle={self.shuffle},"
            f" drop_last={self.drop_last}, seed={self.seed}, rank={self.rank}/{self.world_size}, steps={len(self)})"
        )
