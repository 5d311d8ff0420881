"""One DDP rank's feature cache, set up with the other ranks: decided, filled, shared, given to the DataModule, retired.

:class:`RankCache` is what :class:`~lightning_zerocopy.strategies.ZeroCopyDDPStrategy` delegates its cache to. Its
:meth:`RankCache.attach` is a collective (every rank calls it, during the DataModule's ``setup``, while the shared host
memory can still be opened by name and before any pipeline worker opens a builder):

1. the budget in bytes on this rank's GPU (:mod:`~lightning_zerocopy.cache.budget`);
2. the ranking's inputs per featured node type, identical on every rank: degree scores over every edge type out of
   the type, plus for ``presample`` the presampled counts summed over the ranks
   (:mod:`~lightning_zerocopy.cache.ranking`; the sampling itself is the caller's, it needs the DataModule);
3. the facts every rank tells the others (:class:`~lightning_zerocopy.cache.decide.RankFacts`: device, budget, the
   machine's measured peer-access matrix), exchanged with ``all_gather_object``;
4. for ``cache_policy: auto`` on GPUs with peers, the measured read rates (:mod:`~lightning_zerocopy.cache.probe`,
   timed on the largest featured table: the rates are the hardware's);
5. the decision, the same on every rank of a group (:func:`~lightning_zerocopy.cache.decide.decide_cache`: one
   budget over the rows of every featured type, one layout, one plan per type with the same shard count);
6. this rank's shard of every type filled and exported, the group's shard handles swapped, and the spec
   (:class:`~lightning_zerocopy.cache.provider.TypedFeatureCache`, a shard spec per type) set on the
   DataModule.

The host memory is read by node type (``resources.host``: ``tables`` per featured type, ``graphs`` per edge
type, ``num_nodes`` per type); a graph without types is the one-type case
(:data:`~lightning_zerocopy.graph.schema.NODE`), and its decision is the one-table decision it always was.

A filled shard may be read by peers and pipeline workers until their own teardown, so :meth:`RankCache.retire` only
sets it aside; it is freed at the next :meth:`RankCache.attach` (after a barrier every rank reaches only past its
teardown) or at process exit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol

import torch
import torch.distributed as dist
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

from lightning_zerocopy.cache.budget import BudgetSpec, CacheBudget, parse_budget, resolve_budget
from lightning_zerocopy.cache.cliques import CACHE_POLICIES, measure_peer_access
from lightning_zerocopy.cache.cached_rows import fits_a_row
from lightning_zerocopy.cache.decide import CacheDecision, RankFacts, decide_cache, needs_read_rates
from lightning_zerocopy.cache.ranking import CacheScores, check_ranking, degree_scores_by_type
from lightning_zerocopy.cache.segmented import CacheCounts, SegmentedCacheSpec
from lightning_zerocopy.cache.shards import fill_shard
from lightning_zerocopy.cache.provider import TypedFeatureCache

__all__ = ["CacheOptions", "CachedDataModule", "RankCache", "RankPlace"]


@dataclass(frozen=True)
class CacheOptions:
    """The strategy's cache options, checked (see :class:`~lightning_zerocopy.strategies.ZeroCopyDDPStrategy` for
    what each means).

    Raises:
        ValueError: an unreadable ``budget``, an unknown ``ranking`` or ``policy``, ``presample_batches`` below 2,
            or a malformed ``peer_access`` (the message names the strategy's argument).
    """

    budget: BudgetSpec
    ranking: str = "degree"
    policy: str = "auto"
    presample_batches: int = 64
    peer_access: Optional[list[list[bool]]] = None

    @classmethod
    def parse(
        cls,
        cache_budget: CacheBudget = 0,
        cache_ranking: str = "degree",
        cache_policy: str = "auto",
        presample_batches: int = 64,
        peer_access: Optional[list[list[bool]]] = None,
    ) -> "CacheOptions":
        """The options as the strategy's arguments spell them, checked."""
        budget = parse_budget(cache_budget, "cache_budget")
        check_ranking(cache_ranking, "cache_ranking")
        if cache_policy not in CACHE_POLICIES:
            raise ValueError(f"cache_policy must be one of {', '.join(map(repr, CACHE_POLICIES))}, got {cache_policy!r}")
        if isinstance(presample_batches, bool) or not isinstance(presample_batches, int) or presample_batches < 2:
            raise ValueError(f"presample_batches must be an int >= 2, got {presample_batches!r}")
        if peer_access is not None:
            n = len(peer_access)
            if n == 0 or any(len(row) != n for row in peer_access):
                raise ValueError(f"peer_access must be a square, non-empty matrix of booleans, got {peer_access!r}")
            peer_access = [[bool(v) for v in row] for row in peer_access]
        return cls(budget, cache_ranking, cache_policy, presample_batches, peer_access)


@dataclass(frozen=True)
class RankPlace:
    """Where a rank runs.

    Attributes:
        rank: global rank.
        world_size: ranks of the job.
        node_rank: the machine (Lightning's node rank).
        local_rank: rank on the machine.
        device: the rank's root device (a CUDA device, or the CPU).
    """

    rank: int
    world_size: int
    node_rank: int
    local_rank: int
    device: torch.device


class CachedDataModule(Protocol):
    """What :meth:`RankCache.attach` uses of the DataModule (a :class:`~lightning_zerocopy.ZeroCopyDataModule`)."""

    hot_rows: int
    uses_zerocopy_gather: bool
    #: device resources: ``host`` (``tables``, ``graphs``, ``num_nodes``) and ``registered_features(type)``
    resources: Any

    def set_feature_cache(self, spec: Optional[TypedFeatureCache]) -> None: ...


class RankCache:
    """This rank's part of the job's feature cache; see the module docstring.

    Args:
        options: the checked options.

    The constructor only stores them; :meth:`attach` takes GPU memory, :meth:`retire` sets it aside.
    """

    def __init__(self, options: CacheOptions) -> None:
        self.options = options
        #: the decided cache of this rank (after :meth:`attach`), for logs and tests
        self.decision: Optional[CacheDecision] = None
        self._shards: list[torch.Tensor] = []  # this rank's shard of each featured type
        self._retired: list[torch.Tensor] = []

    def attach(
        self,
        datamodule: CachedDataModule,
        place: RankPlace,
        free_gpu_bytes: Callable[[], int],
        presample: Callable[[dict[str, int]], Mapping[str, torch.Tensor]],
        barrier: Callable[[str], None],
    ) -> Optional[CacheDecision]:
        """Decide and place this rank's cache and set it on ``datamodule``. A collective: every rank calls it.

        Args:
            datamodule: the DataModule being set up (its host memory mapped in this process).
            place: where this rank runs.
            free_gpu_bytes: the GPU memory free once the model is placed (called only for a cache on the GPU).
            presample: ``presample(num_rows)``: this rank's presampled counts in halves, per featured type of
                ``num_rows`` (``[2, num_rows[type]]`` each; called only for ``cache_ranking: presample``).
            barrier: the strategy's barrier (waits for every rank), called before shards of an earlier stage are
                freed.

        Returns:
            The decision when a GPU cache was placed and set on ``datamodule`` (its ``group`` names the ranks whose
            GPU memory this process now reads), else ``None`` (also when the budget holds no type's row lookup and
            first row: nothing is placed).

        Raises:
            ValueError: the DataModule's ``hot_rows`` caches rows too, or a share of free GPU memory was asked for
                where batches are not gathered on a GPU.
        """
        self._free_retired(place, barrier)
        options = self.options
        if options.budget.is_zero:
            return None
        if datamodule.hot_rows > 0:
            raise ValueError(
                f"data.init_args.hot_rows={datamodule.hot_rows} and the strategy's cache_budget="
                f"{options.budget.text!r} both cache feature rows on the GPU: set data.init_args.hot_rows to 0 "
                "(the strategy's cache replaces it) or cache_budget to 0"
            )
        root = place.device
        on_gpu = root.type == "cuda" and datamodule.uses_zerocopy_gather
        if root.type == "cuda" and not on_gpu:
            rank_zero_warn(
                f"cache_budget={options.budget.text!r} is not used: the feature cache serves the zero-copy gather, "
                "but data.init_args.gather resolves to 'cpu'"
            )
        host = datamodule.resources.host  # this process's mapping of the host memory
        tables = {t: table.data for t, table in host.tables.items()}
        num_rows = {t: int(x.shape[0]) for t, x in tables.items()}
        row_bytes = {t: int(x.shape[1]) * x.element_size() if x.dim() == 2 else 0 for t, x in tables.items()}
        scores = self._scores(degree_scores_by_type(host.graphs, host.num_nodes, list(tables)), place, presample)
        facts = self._exchange_facts(self._budget_bytes(root, on_gpu, free_gpu_bytes), place)
        rates = None
        if on_gpu and place.world_size > 1 and needs_read_rates(options.policy, facts, scores, num_rows, row_bytes):
            from lightning_zerocopy.cache.probe import probe_read_rates

            mine = next(f for f in facts if f.rank == place.rank)
            # the largest table (the same choice on every rank): host reads spread over it, as a batch's misses are
            probed = max((t for t in tables if tables[t].dim() == 2 and tables[t].numel() > 0),
                         key=lambda t: (num_rows[t] * row_bytes[t], t))  # fmt: skip
            rates = probe_read_rates(datamodule.resources.registered_features(probed), root, place.node_rank,
                                     place.local_rank, mine.peer_access)  # fmt: skip
        decision = decide_cache(place.rank, facts, scores, num_rows, row_bytes, options.policy, read_rates=rates)
        self.decision = decision
        rank_zero_info(f"ZeroCopyDDPStrategy: {decision.summary()}")
        if decision.layout.note and place.local_rank == 0 and place.node_rank > 0:
            print(f"[node {place.node_rank}] ZeroCopyDDPStrategy: {decision.layout.note}", flush=True)
        if not on_gpu or not fits_a_row(decision.budget_bytes, num_rows, row_bytes):
            # no GPU, or the row lookups fill the budget: nothing is cached on any rank (a clique's lookup is never
            # smaller), so no rank places a cache (the same answer everywhere: the facts are every rank's)
            return None
        datamodule.set_feature_cache(self._place(decision, tables, place))
        return decision

    def retire(self) -> None:
        """Set this rank's shards aside (teardown, or an exception): peers and pipeline workers may read them until
        their own teardown, so they are freed at the next :meth:`attach` or at process exit."""
        self._retired.extend(self._shards)
        self._shards = []

    def counts(self) -> Optional[CacheCounts]:
        """Rows this process's builders gathered so far from the local shard(s), peers' shards and host memory,
        summed over the featured types (reading synchronizes the GPU), or ``None`` without a cache. A pipeline
        worker process counts in its own process."""
        per_type = [c for c in (self.counts_per_type() or {}).values() if c is not None]
        if not per_type:
            return None
        return CacheCounts(*(sum(getattr(c, f) for c in per_type) for f in ("local", "peer", "host")))

    def counts_per_type(self) -> Optional[dict[str, Optional[CacheCounts]]]:
        """:meth:`counts` of each featured type (``None`` for a type whose cache this process has not opened);
        ``None`` without a cache."""
        from lightning_zerocopy.cache.sharded_provider import open_cache_counts

        if self.decision is None:
            return None
        return {t: open_cache_counts(plan.digest) for t, plan in self.decision.plans.items()}

    # ---- the steps of attach ---------------------------------------------------------------------------------

    def _budget_bytes(self, root: torch.device, on_gpu: bool, free_gpu_bytes: Callable[[], int]) -> int:
        budget = self.options.budget
        if not on_gpu:
            if budget.kind == "fraction":
                raise ValueError(
                    f"cache_budget={budget.text!r} is a share of free GPU memory, but batches are not "
                    f"gathered on a GPU here (the trainer runs on {root.type!r}); give a size like '1GiB' or 0"
                )
            return int(budget.amount)
        return resolve_budget(budget, free_gpu_bytes(), "cache_budget", where=str(root))

    def _scores(
        self, priors: dict[str, torch.Tensor], place: RankPlace, presample: Callable[[dict[str, int]], Mapping[str, Any]]
    ) -> dict[str, CacheScores]:
        """The ranking's inputs per featured type, identical on every rank: the degree scores, plus for
        ``presample`` the two halves of the presampled counts summed over the ranks (one all-reduce over every
        type's; CPU tensors: the ranking itself runs in ``decide_cache`` once the budget is known)."""
        if self.options.ranking == "degree":
            return {t: CacheScores(prior) for t, prior in priors.items()}
        num_rows = {t: prior.numel() for t, prior in priors.items()}
        halves = presample(num_rows)
        if place.world_size > 1:
            flat = torch.cat([halves[t].reshape(-1) for t in priors])
            flat = flat.to(place.device if dist.get_backend() == "nccl" else torch.device("cpu"))
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            parts = flat.cpu().split([2 * num_rows[t] for t in priors])
            halves = {t: part.reshape(2, num_rows[t]) for t, part in zip(priors, parts)}
        return {t: CacheScores(prior, halves[t].cpu()) for t, prior in priors.items()}

    def _exchange_facts(self, budget_bytes: int, place: RankPlace) -> list[RankFacts]:
        root = place.device
        device = root.index if root.type == "cuda" else None
        devices = _all_gather((place.node_rank, place.local_rank, device), place)
        peer = None
        if place.local_rank == 0:
            machine = sorted((d for d in devices if d[0] == place.node_rank), key=lambda d: d[1])
            given = self.options.peer_access
            if given is not None:
                if len(given) != len(machine):
                    raise ValueError(
                        f"peer_access is {len(given)}x{len(given)}, but node {place.node_rank} runs {len(machine)} "
                        "ranks"
                    )
                peer = given
            elif device is not None:
                peer = measure_peer_access([d[2] for d in machine])
            else:  # CPU ranks: no peers
                peer = [[i == j for j in range(len(machine))] for i in range(len(machine))]
        return _all_gather(RankFacts(place.rank, place.node_rank, place.local_rank, device, budget_bytes, peer), place)

    def _place(self, decision: CacheDecision, tables: dict[str, torch.Tensor], place: RankPlace) -> TypedFeatureCache:
        """Fill this rank's shard of every type, swap the handles within the cache group, return the group's spec."""
        mine: dict[str, Any] = {}
        for node_type, plan in decision.plans.items():
            shard, handle = fill_shard(plan, decision.shard_index, tables[node_type], place.device)
            self._shards.append(shard)
            mine[node_type] = handle
        handles = _all_gather(mine, place)
        group = [handles[r] for r in decision.group]
        return TypedFeatureCache(tuple(
            (t, SegmentedCacheSpec(plan=plan, handles=tuple(h[t] for h in group), policy=decision.layout.policy))
            for t, plan in decision.plans.items()
        ))  # fmt: skip

    def _free_retired(self, place: RankPlace, barrier: Callable[[str], None]) -> None:
        # shards of an earlier stage: every rank has closed its caches since (its teardown) once all pass the barrier
        if self._retired:
            if place.world_size > 1:
                barrier("zerocopy_cache_retired")
            self._retired.clear()


def _all_gather(obj: Any, place: RankPlace) -> list[Any]:
    """``obj`` of every rank, by global rank (``all_gather_object``; no collective in a job of one rank)."""
    if place.world_size == 1:
        return [obj]
    gathered: list[Any] = [None] * place.world_size
    dist.all_gather_object(gathered, obj)
    return gathered
