"""The link batch plan: which supervision edges (and negatives) make up every mini-batch, as a pure function.

:class:`LinkBatchPlan` is the node :class:`~lightning_zerocopy.data.plan.BatchPlan` over the *positions* of a
split's positive edges (same shuffle, same round-robin rank split, same per-batch seed), plus what turns a batch
of edges into node seeds: the negatives (drawn from the batch seed's counter-based streams,
:mod:`~lightning_zerocopy.data.negatives`, or the split's fixed ones), and PyG ``LinkNeighborLoader``'s bookkeeping.
``item(epoch, step)`` returns a :class:`LinkPlanItem`: a :class:`~lightning_zerocopy.data.plan.PlanItem` whose
``seed_ids`` are the unique endpoints of the batch's positives and negatives (sorted, as PyG's ``unique``), so the
batch builder samples and gathers exactly as for nodes, then attaches the item's link fields
(:attr:`LinkPlanItem.task_fields`) to the built batch, on its device:

* binary (and no negatives): ``edge_label_index`` ``[2, B + N]`` local ids, positives first; ``edge_label``
  ``[B + N]`` (the split's labels, or 1, then 0 for the negatives; labels holding a 0 are shifted by one, as PyG
  does, so 0 means "negative");
* triplet: ``src_index`` ``[B]``, ``dst_pos_index`` ``[B]``, ``dst_neg_index`` ``[B]`` or ``[B, amount]``;
* fixed negatives (val/test): binary layout; negatives grouped per positive (``neg_per_positive = K``) come with
  their positive and ``edge_label_query`` ``[B + B*K]`` (the ``input_id`` each label edge belongs to); a shared pool
  is spread over the split's batches in order (batch ``step`` of ``rank`` takes chunk ``rank * steps + step``);
* always ``batch_size = B`` (the positives) and ``input_id`` (their positions in the split).

Typed endpoints (a heterogeneous graph's supervised edge type ``(src, rel, dst)``, ``edge_type=``): source ids are
``src``-type ids, destination ids ``dst``-type ids (``num_nodes`` / ``num_dst_nodes``), random negatives are drawn from
each endpoint's type, and the item's seeds are split per node type as PyG's hetero ``LinkNeighborLoader`` splits them
(:attr:`LinkPlanItem.seed_dict`): two distinct types get the unique sources and the unique destinations, and the
local ids index their own type (``edge_label_index[0]`` into the ``src`` seeds, ``[1]`` into the ``dst`` seeds;
``src_index`` / ``dst_pos_index`` / ``dst_neg_index`` likewise); one type (``paper__cites__paper``) merges both
endpoints, exactly as the homogeneous item does.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

import torch

from lightning_zerocopy.data.negatives import NegativeDraws
from lightning_zerocopy.data.plan import BatchPlan, PlanItem, derive_seed

__all__ = ["EdgeType", "LinkBatchPlan", "LinkPlanItem"]

#: ``(source node type, relation, destination node type)``, PyG's key of an edge type.
EdgeType = tuple[str, str, str]


@dataclass(frozen=True)
class LinkPlanItem(PlanItem):
    """A :class:`PlanItem` of supervision edges: ``seed_ids`` are the unique endpoints to sample from.

    Attributes:
        num_positives: ``B``, the positive supervision edges of the batch (its ``batch_size``).
        link_fields: the link fields of the batch (``edge_label_index``...), local ids into ``seed_ids``, CPU (typed
            endpoints: into their type's seeds of ``seed_dict``).
        edge_type: the supervised edge type of a heterogeneous graph (``None``: homogeneous).
        seed_dict: with ``edge_type``, the seeds per node type (``seed_ids`` is their concatenation).
    """

    num_positives: int = 0
    link_fields: dict[str, torch.Tensor] = field(default_factory=dict)
    edge_type: Optional[EdgeType] = None
    seed_dict: Optional[dict[str, torch.Tensor]] = None

    @property
    def typed_seeds(self) -> Optional[dict[str, torch.Tensor]]:
        """The seeds per node type of a heterogeneous link batch (``None``: one id space)."""
        return self.seed_dict

    def task_store(self, name: str) -> Union[str, EdgeType]:
        """Where field ``name`` goes in a ``HeteroData`` batch (PyG's hetero ``LinkNeighborLoader``): ``src_index``
        on the source type, ``dst_pos_index`` / ``dst_neg_index`` on the destination type, the rest on the
        supervised edge type.

        Raises:
            ValueError: a homogeneous item (no ``edge_type``).
        """
        if self.edge_type is None:
            raise ValueError("a homogeneous link item has no typed stores")
        if name == "src_index":
            return self.edge_type[0]
        if name in ("dst_pos_index", "dst_neg_index"):
            return self.edge_type[2]
        return self.edge_type

    @property
    def task_fields(self) -> dict[str, torch.Tensor]:
        """The link fields (``edge_label_index``...), CPU; the builder moves them to the batch's device."""
        return self.link_fields

    @property
    def task_batch_size(self) -> int:
        """``B``: the batch's ``batch_size`` is its positive edges."""
        return self.num_positives


class LinkBatchPlan:
    """Deterministic assignment of supervision edges (and their negatives) to (epoch, rank, step) mini-batches.

    Args:
        pos_edge_index: int64 ``[2, P]`` global ids of the split's positive edges.
        batch_size: positive edges per batch.
        num_nodes: nodes of the graph (the range of every id); with ``edge_type``: of the source type.
        negatives: the random negatives (``None``: none, or the fixed ones).
        edge_label: ``[P]`` labels of the positives (binary layout only), or ``None`` (all 1).
        neg_edge_index: int64 ``[2, N]`` fixed negatives of the split (they replace random ones).
        neg_per_positive: ``K`` when the fixed negatives are grouped per positive.
        shuffle, drop_last, seed, rank, world_size, stream: as for :class:`BatchPlan` (over the positives).
        sampler_seed: as for :class:`BatchPlan`: ``"split"`` gives every batch the split's one sampler seed, for
            node-keyed (evaluation) sampling; random negatives are still drawn per batch (from the seed ``"batch"``
            would give), so batches do not repeat each other's negatives.
        split: the split's name, for error messages.
        edge_type: the supervised edge type ``(src, rel, dst)`` of a heterogeneous graph: typed endpoints (see the
            module docstring); ``None``: one id space.
        num_dst_nodes: with ``edge_type``, the nodes of the destination type (the range of row 1).

    Raises:
        ValueError: an empty split, an id out of range (naming the endpoint's type), ``edge_label`` with triplet
            negatives, inconsistent shapes, ``num_dst_nodes`` without ``edge_type``.
    """

    def __init__(
        self,
        pos_edge_index: torch.Tensor,
        batch_size: int,
        *,
        num_nodes: int,
        negatives: Optional[NegativeDraws] = None,
        edge_label: Optional[torch.Tensor] = None,
        neg_edge_index: Optional[torch.Tensor] = None,
        neg_per_positive: Optional[int] = None,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        stream: int = 0,
        sampler_seed: Literal["batch", "split"] = "batch",
        split: str = "train",
        edge_type: Optional[EdgeType] = None,
        num_dst_nodes: Optional[int] = None,
    ) -> None:
        what = f"the {split} split's"
        if num_dst_nodes is not None and edge_type is None:
            raise ValueError("num_dst_nodes is for typed endpoints: give the supervised edge_type too")
        self.edge_type: Optional[EdgeType] = None if edge_type is None else (edge_type[0], edge_type[1], edge_type[2])
        self.num_dst_nodes = int(num_nodes if num_dst_nodes is None else num_dst_nodes)
        counts = (int(num_nodes), self.num_dst_nodes)
        types = None if edge_type is None else (edge_type[0], edge_type[2])
        _check_edges(pos_edge_index, counts, f"{what} pos_edge_index", types)
        if pos_edge_index.shape[1] == 0:
            raise ValueError(f"{what} pos_edge_index is empty: the {split} split needs at least one positive edge")
        self.num_edges = int(pos_edge_index.shape[1])
        if neg_edge_index is not None:
            _check_edges(neg_edge_index, counts, f"{what} neg_edge_index", types)
            if neg_per_positive is not None and neg_edge_index.shape[1] != self.num_edges * neg_per_positive:
                raise ValueError(
                    f"{what} neg_edge_index has {neg_edge_index.shape[1]} columns but neg_per_positive="
                    f"{neg_per_positive} needs {self.num_edges} x {neg_per_positive}"
                )
        triplet = negatives is not None and negatives.config.is_triplet() and neg_edge_index is None
        if edge_label is not None:
            if triplet:
                raise ValueError(
                    f"{what} edge_label is given, but triplet negative sampling has no edge labels (use src_index, "
                    "dst_pos_index and dst_neg_index); set neg_sampling to 'binary' or drop the labels"
                )
            if edge_label.shape[0] != self.num_edges:
                raise ValueError(
                    f"{what} edge_label has {edge_label.shape[0]} rows for {self.num_edges} positive edges"
                )
        self.pos_edge_index = pos_edge_index.to(torch.int64).contiguous()
        self.num_nodes = int(num_nodes)
        self.negatives = None if neg_edge_index is not None else negatives
        self.neg_edge_index = None if neg_edge_index is None else neg_edge_index.to(torch.int64).contiguous()
        self.neg_per_positive = None if neg_per_positive is None else int(neg_per_positive)
        self.split = split
        # PyG's convention: with binary negatives, user labels holding a 0 are shifted so that 0 means "negative"
        binary_negatives = self.neg_edge_index is not None or (negatives is not None and negatives.config.is_binary())
        self.edge_label = edge_label
        if edge_label is not None and binary_negatives and edge_label.numel() and bool(edge_label.min() == 0):
            self.edge_label = edge_label + 1
        self._edges = BatchPlan(
            torch.arange(self.num_edges), batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, rank=rank,
            world_size=world_size, stream=stream, sampler_seed=sampler_seed,
        )  # fmt: skip
        self._input_nodes: Optional[torch.Tensor] = None

    # ---- what the loaders, the pipeline and the strategy read from a plan ------------------------------------

    batch_size = property(lambda self: self._edges.batch_size, doc="Positive edges per batch.")
    shuffle = property(lambda self: self._edges.shuffle)
    drop_last = property(lambda self: self._edges.drop_last)
    seed = property(lambda self: self._edges.seed)
    rank = property(lambda self: self._edges.rank)
    world_size = property(lambda self: self._edges.world_size)
    stream = property(lambda self: self._edges.stream)
    sampler_seed = property(lambda self: self._edges.sampler_seed)

    @property
    def input_nodes(self) -> torch.Tensor:
        """The distinct endpoints of the split's positive edges (the nodes whose neighborhoods batches sample)."""
        if self._input_nodes is None:
            self._input_nodes = torch.unique(self.pos_edge_index.reshape(-1))
        return self._input_nodes

    @property
    def max_seed_nodes(self) -> int:
        """An upper bound on ``len(seed_ids)`` of an item: two endpoints per positive and per negative edge."""
        b = self.batch_size
        nodes = self.num_nodes if self.edge_type is None else self.num_nodes + self.num_dst_nodes
        if self.neg_edge_index is not None:
            per_batch = b * self.neg_per_positive if self.neg_per_positive else self._pool_chunk_bound()
            return min(2 * (b + per_batch), nodes)
        if self.negatives is None:
            return min(2 * b, nodes)
        config = self.negatives.config
        extra = 2 * config.num_negatives(b) if config.is_binary() else b * int(config.amount)
        return min(2 * b + extra, nodes)

    def __len__(self) -> int:
        """Steps per epoch on each rank."""
        return len(self._edges)

    def item(self, epoch: int, step: int) -> LinkPlanItem:
        """The mini-batch ``step`` of ``epoch`` on this rank."""
        return self.expand(self._edges.item(epoch, step))

    def one_rank_plan(self, stream: int) -> "LinkBatchPlan":
        """This split's plan on one rank, shuffled over the random stream ``stream`` (the same positives, batch size,
        negatives and endpoint types): the link batches of another draw of the split, e.g. presampling's
        (:func:`~lightning_zerocopy.data.presampling.presampling`), which must not replay the training
        batches.

        Raises:
            ValueError: a negative ``stream`` (the message names it).
        """
        if isinstance(stream, bool) or not isinstance(stream, int) or stream < 0:
            raise ValueError(f"stream must be an int >= 0, got {stream!r}")
        plan = copy.copy(self)
        plan._edges = BatchPlan(
            torch.arange(self.num_edges), self.batch_size, shuffle=True, drop_last=self.drop_last, seed=self.seed,
            rank=0, world_size=1, stream=stream,
        )  # fmt: skip
        return plan

    @property
    def positions_plan(self) -> BatchPlan:
        """The plan over the positions of the split's positive edges (what a resume on another world size deals)."""
        return self._edges

    def expand(self, edges: PlanItem) -> LinkPlanItem:
        """The link batch of an item of :attr:`positions_plan` (its ``input_id``: positive edge positions): the
        edges' endpoints as seeds, their negatives and link fields."""
        epoch, step = edges.epoch, edges.step
        positions = edges.input_id
        b = positions.numel()
        src, dst = self.pos_edge_index[0, positions], self.pos_edge_index[1, positions]
        negatives_seed = edges.batch_seed
        if self.sampler_seed == "split":  # the sampler's seed is the split's; negatives stay per batch
            negatives_seed = derive_seed(self.seed, self.stream, epoch, self.world_size, self.rank, step)
        fields: dict[str, torch.Tensor] = {}
        if self.negatives is not None and self.negatives.config.is_triplet():
            dst_neg = self.negatives.draw(b * int(self.negatives.config.amount), negatives_seed, endpoint=1)
            seeds, seed_dict, src_index, dst_index = self._seeds(src, torch.cat([dst, dst_neg]))
            fields["src_index"], fields["dst_pos_index"] = src_index, dst_index[:b]
            fields["dst_neg_index"] = dst_index[b:].view(b, -1).squeeze(-1)
        else:
            label = self.edge_label[positions] if self.edge_label is not None else None
            neg_src, neg_dst, query = self._negatives(positions, negatives_seed, step)
            if neg_src is not None:
                if label is None:
                    label = torch.ones(b)
                label = torch.cat([label, label.new_zeros((neg_src.numel(), *label.shape[1:]))])
                src, dst = torch.cat([src, neg_src]), torch.cat([dst, neg_dst])
            seeds, seed_dict, src_index, dst_index = self._seeds(src, dst)
            fields["edge_label_index"] = torch.stack([src_index, dst_index])
            if label is not None:
                fields["edge_label"] = label
            if query is not None:
                fields["edge_label_query"] = query
        return LinkPlanItem(
            seed_ids=seeds, input_id=positions, batch_seed=edges.batch_seed, epoch=epoch, step=step,
            rank=edges.rank, num_positives=b, link_fields=fields, edge_type=self.edge_type, seed_dict=seed_dict,
        )  # fmt: skip

    # ---- internals ---------------------------------------------------------------------------------------

    def _seeds(self, src: torch.Tensor, dst: torch.Tensor) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """The item's seeds (unique, sorted, as PyG's), its seeds per node type (``None``: untyped endpoints) and every
        endpoint's local id among them: endpoints of one id space (untyped, or one node type, whose seeds both
        endpoints are) are merged; typed endpoints of two node types keep each type's seeds apart (``seed_ids``: their
        concatenation) and index their own type's."""
        if self.edge_type is not None and self.edge_type[0] != self.edge_type[2]:
            src_seeds, src_index = src.unique(return_inverse=True)
            dst_seeds, dst_index = dst.unique(return_inverse=True)
            seed_dict = {self.edge_type[0]: src_seeds, self.edge_type[2]: dst_seeds}
            return torch.cat([src_seeds, dst_seeds]), seed_dict, src_index, dst_index
        seeds, inverse = torch.cat([src, dst]).unique(return_inverse=True)
        seed_dict = None if self.edge_type is None else {self.edge_type[0]: seeds}
        return seeds, seed_dict, inverse[: src.numel()], inverse[src.numel() :]

    def _negatives(self, positions: torch.Tensor, batch_seed: int, step: int):
        """(source, destination, edge_label_query) of the batch's negatives (``None`` where there are none)."""
        if self.neg_edge_index is not None:
            k = self.neg_per_positive
            if k:  # the K negatives of each positive, with their positive's id as the query
                columns = (positions.view(-1, 1) * k + torch.arange(k)).view(-1)
                query = torch.cat([positions, positions.repeat_interleave(k)])
            else:
                columns, query = self._pool_chunk(step), None
            return self.neg_edge_index[0, columns], self.neg_edge_index[1, columns], query
        if self.negatives is None:
            return None, None, None
        count = self.negatives.config.num_negatives(positions.numel())
        return self.negatives.draw(count, batch_seed, 0), self.negatives.draw(count, batch_seed, 1), None

    def _pool_chunk(self, step: int) -> torch.Tensor:
        chunks = len(self) * self.world_size
        index = self.rank * len(self) + step
        n = self.neg_edge_index.shape[1]  # type: ignore[union-attr]
        return torch.arange(n * index // chunks, n * (index + 1) // chunks)

    def _pool_chunk_bound(self) -> int:
        chunks = max(1, len(self) * self.world_size)
        return -(-self.neg_edge_index.shape[1] // chunks)  # type: ignore[union-attr]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_input_nodes"] = None
        return state

    def __repr__(self) -> str:
        negatives = "fixed" if self.neg_edge_index is not None else (self.negatives.config if self.negatives else None)
        return (
            f"LinkBatchPlan(split={self.split!r}, num_edges={self.num_edges}, batch_size={self.batch_size}, "
            f"negatives={negatives}, shuffle={self.shuffle}, seed={self.seed}, rank={self.rank}/{self.world_size}, "
            f"steps={len(self)})"
        )


def _check_edges(
    edge_index: torch.Tensor, counts: tuple[int, int], name: str, types: Optional[tuple[str, str]] = None
) -> None:
    """Shape, dtype and range of ``edge_index``: row 0 in ``[0, counts[0])``, row 1 in ``[0, counts[1])`` (``types``:
    the endpoints' node types, named by the error)."""
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"{name} must have shape [2, num_edges], got {tuple(edge_index.shape)}")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must hold integer node ids, got {edge_index.dtype}")
    if edge_index.numel() == 0:
        return
    for row in (0, 1) if types is not None else (None,):
        ids, num_nodes = (edge_index, counts[0]) if row is None else (edge_index[row], counts[row])
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= num_nodes:
            bad = lo if lo < 0 else hi
            hit = ids == bad
            column = int((hit.any(0) if row is None else hit).nonzero()[0])
            where = (
                f"a graph of {num_nodes} nodes" if types is None or row is None
                else f"the {('source', 'destination')[row]} type {types[row]!r} of {num_nodes} nodes"
            )
            raise ValueError(
                f"{name} holds node id {bad} (column {column}), out of range for {where} (ids 0 to {num_nodes - 1})"
            )
