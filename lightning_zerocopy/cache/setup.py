"""One DDP rank's feature cache, set up with the other ranks: decided, filled, shared, given to the DataModule, retired.

:class:`RankCache` is what :class:`~lightning_zerocopy.strategies.ZeroCopyDDPStrategy` delegates its cache to. Its
:meth:`RankCache.attach` is a collective (every rank calls it, during the DataModule's ``setup``, while the shared host
memory can still be opened by name and before any pipeline worker opens a builder):

1. the budget in bytes on this rank's GPU (:mod:`~lightning_zerocopy.cache.budget`);
2. the ranking's inputs, identical on every rank: degree scores, plus for ``presample`` the presampled counts summed
   over the ranks (:mod:`~lightning_zerocopy.cache.ranking`; the sampling itself is the caller's, it needs the
   DataModule);
3. the facts every rank tells the others (:class:`~lightning_zerocopy.cache.decide.RankFacts`: device, budget, the
   machine's measured peer-access matrix), exchanged with ``all_gather_object``;
4. for ``cache_policy: auto`` on GPUs with peers, the measured read rates (:mod:`~lightning_zerocopy.cache.probe`);
5. the decision, the same on every rank of a group (:func:`~lightning_zerocopy.cache.decide.decide_cache`);
6. this rank's shard filled and exported, the group's shard handles swapped, and the provider
   (:class:`~lightning_zerocopy.cache.sharded_provider.ShardedFeatureCache`) set on the DataModule.

A filled shard may be read by peers and pipeline workers until their own teardown, so :meth:`RankCache.retire` only
sets it aside; it is freed at the next :meth:`RankCache.attach` (after a barrier every rank reaches only past its
teardown) or at process exit.

A heterogeneous DataModule's host memory has a table per featured node type (``resources.host.features`` is a
dict): then the cache covers the rows of every featured type under the one budget (:mod:`~lightning_zerocopy.cache.typed`:
candidates ranked by expected reads per byte, each type's lookup charged before its first row;
:mod:`~lightning_zerocopy.cache.typed_decide`: one layout, one plan per type with the same shard count), each rank
fills one shard per type, and the DataModule gets a
:class:`~lightning_zerocopy.cache.typed_provider.TypedFeatureCache` (a spec per type). ``auto`` measures the same read
rates as for one table where it has a choice (step 4, timed on the largest featured table: the rates are the
hardware's) and prices the typed ranking's expected byte hit rates with them (see
:mod:`~lightning_zerocopy.cache.typed_decide`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Union

import torch
import torch.distributed as dist
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

from lightning_zerocopy.cache.budget import BudgetSpec, CacheBudget, parse_budget, resolve_budget
from lightning_zerocopy.cache.cliques import CACHE_POLICIES, measure_peer_access
from lightning_zerocopy.cache.decide import (
    CacheDecision,
    RankFacts,
    decide_cache,
    needs_read_rates,
    rows_per_gpu_of,
)
from lightning_zerocopy.cache.provider import FeatureCacheSpec
from lightning_zerocopy.cache.ranking import CacheScores, check_ranking, degree_scores
from lightning_zerocopy.cache.segmented import CacheCounts, SegmentedCacheSpec
from lightning_zerocopy.cache.shards import fill_shard
from lightning_zerocopy.cache.typed import typed_degree_scores
from lightning_zerocopy.cache.typed_decide import TypedCacheDecision, decide_typed_cache, needs_typed_read_rates

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
    resources: Any  # DeviceResources: ``host`` (features, graph) and ``registered_features()``

    def set_feature_cache(self, spec: Optional[FeatureCacheSpec]) -> None: ...


class RankCache:
    """This rank's part of the job's feature cache; see the module docstring.

    Args:
        options: the checked options.

    The constructor only stores them; :meth:`attach` takes GPU memory, :meth:`retire` sets it aside.
    """

    def __init__(self, options: CacheOptions) -> None:
        self.options = options
        #: the decided cache of this rank (after :meth:`attach`), for logs and tests
        self.decision: Optional[Union[CacheDecision, TypedCacheDecision]] = None
        self._shard: Optional[torch.Tensor] = None
        self._typed_shards: list[torch.Tensor] = []  # one per featured type (typed rows)
        self._retired: list[torch.Tensor] = []

    def attach(
        self,
        datamodule: CachedDataModule,
        place: RankPlace,
        free_gpu_bytes: Callable[[], int],
        presample: Callable[[Any], Any],
        barrier: Callable[[str], None],
    ) -> Optional[Union[CacheDecision, TypedCacheDecision]]:
        """Decide and place this rank's cache and set it on ``datamodule``. A collective: every rank calls it.

        Args:
            datamodule: the DataModule being set up (its host memory mapped in this process).
            place: where this rank runs.
            free_gpu_bytes: the GPU memory free once the model is placed (called only for a cache on the GPU).
            presample: ``presample(num_nodes)``: this rank's presampled counts in halves (``[2, num_nodes]``;
                called only for ``cache_ranking: presample``); for typed rows ``num_nodes`` is a dict of rows per
                featured type and the answer a dict of such halves.
            barrier: the strategy's barrier (waits for every rank), called before shards of an earlier stage are
                freed.

        Returns:
            The decision when a GPU cache was placed and set on ``datamodule`` (its ``group`` names the ranks whose
            GPU memory this process now reads), else ``None`` (also for one table when the budget holds no row
            beside the row lookup: nothing is placed).

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
        budget_bytes = lambda: self._budget_bytes(root, on_gpu, free_gpu_bytes)  # noqa: E731
        if isinstance(host.features, dict):  # a table per featured node type
            return self._attach_typed(datamodule, host, place, on_gpu, budget_bytes, presample)
        table = host.features.data
        num_nodes, row_bytes = int(table.shape[0]), int(table[0].numel() * table.element_size()) if table.shape[0] else 0
        scores = self._scores(host.graph.indices, num_nodes, place, presample)
        facts = self._exchange_facts(budget_bytes(), place)
        rates = None
        hot_rows = scores.hot_rows
        if on_gpu and place.world_size > 1 and needs_read_rates(options.policy, facts, hot_rows, num_nodes, row_bytes):
            from lightning_zerocopy.cache.probe import probe_read_rates

            mine = next(f for f in facts if f.rank == place.rank)
            rates = probe_read_rates(datamodule.resources.registered_features(), root, place.node_rank,
                                     place.local_rank, mine.peer_access)  # fmt: skip
        decision = decide_cache(place.rank, facts, scores, num_nodes, row_bytes, options.policy, read_rates=rates)
        self.decision = decision
        rank_zero_info(f"ZeroCopyDDPStrategy: {decision.summary()}")
        if decision.layout.note and place.local_rank == 0 and place.node_rank > 0:
            print(f"[node {place.node_rank}] ZeroCopyDDPStrategy: {decision.layout.note}", flush=True)
        if not on_gpu:
            return None
        if rows_per_gpu_of(facts, row_bytes, num_nodes) == 0:
            # the row lookup fills the budget: nothing is cached on any rank (a clique's lookup is never smaller),
            # so no rank places a cache (the same answer everywhere: the facts are every rank's)
            return None
        from lightning_zerocopy.cache.sharded_provider import ShardedFeatureCache

        datamodule.set_feature_cache(ShardedFeatureCache(self._place(decision, table, place)))
        return decision

    def retire(self) -> None:
        """Set this rank's shard aside (teardown, or an exception): peers and pipeline workers may read it until
        their own teardown, so it is freed at the next :meth:`attach` or at process exit."""
        if self._shard is not None:
            self._retired.append(self._shard)
            self._shard = None
        self._retired.extend(self._typed_shards)
        self._typed_shards = []

    def counts(self) -> Optional[CacheCounts]:
        """Rows this process's builders gathered so far from the local shard(s), peers' shards and host memory
        (reading synchronizes the GPU), or ``None`` without a cache. A pipeline worker process counts in its own
        process."""
        from lightning_zerocopy.cache.segmented import CacheCounts
        from lightning_zerocopy.cache.sharded_provider import open_cache_counts

        decision = self.decision
        if decision is None:
            return None
        if isinstance(decision, CacheDecision):
            return open_cache_counts(decision.plan.digest)
        per_type = [c for c in self.counts_per_type().values() if c is not None]  # type: ignore[union-attr]
        if not per_type:
            return None
        return CacheCounts(*(sum(getattr(c, f) for c in per_type) for f in ("local", "peer", "host")))

    def counts_per_type(self) -> Optional[dict[str, Optional[CacheCounts]]]:
        """For a cache over typed rows: :meth:`counts` of each featured type (``None`` for a type whose cache this
        process has not opened); ``None`` for a cache of one table or without a cache."""
        from lightning_zerocopy.cache.sharded_provider import open_cache_counts

        decision = self.decision
        if not isinstance(decision, TypedCacheDecision):
            return None
        return {t: open_cache_counts(plan.digest) for t, plan in decision.plans.items()}

    @property
    def row_bytes(self) -> int:
        """Bytes of one feature row (0 before the cache is decided, and for typed rows, whose widths differ: see
        :meth:`counts_per_type` and the decision's ``row_bytes`` per type)."""
        return self.decision.row_bytes if isinstance(self.decision, CacheDecision) else 0

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
        self, indices: torch.Tensor, num_nodes: int, place: RankPlace, presample: Callable[[int], torch.Tensor]
    ) -> CacheScores:
        """The ranking's inputs, identical on every rank: the degree scores, plus for ``presample`` the two halves
        of the presampled counts summed over the ranks (CPU tensors; the ranking itself runs in ``decide_cache``
        once the number of cached rows is known)."""
        degree = degree_scores(indices, num_nodes)
        if self.options.ranking == "degree":
            return CacheScores(degree)
        halves = presample(num_nodes)
        if place.world_size > 1:
            summed = halves.to(place.device if dist.get_backend() == "nccl" else torch.device("cpu"))
            dist.all_reduce(summed, op=dist.ReduceOp.SUM)
            halves = summed.cpu()
        return CacheScores(degree.cpu(), halves)

    def _exchange_facts(self, budget_bytes: int, place: RankPlace) -> list[RankFacts]:
        root = place.device
        device = root.index if root.type == "cuda" else None
        mine = (place.node_rank, place.local_rank, device)
        devices: list[Any] = [mine]
        if place.world_size > 1:
            devices = [None] * place.world_size
            dist.all_gather_object(devices, mine)
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
        fact = RankFacts(place.rank, place.node_rank, place.local_rank, device, budget_bytes, peer)
        if place.world_size == 1:
            return [fact]
        facts: list[Any] = [None] * place.world_size
        dist.all_gather_object(facts, fact)
        return facts

    def _place(self, decision: CacheDecision, table: torch.Tensor, place: RankPlace) -> SegmentedCacheSpec:
        """Fill this rank's shard, swap handles within the cache group, return the group's spec."""
        shard, handle = fill_shard(decision.plan, decision.shard_index, table, place.device)
        self._shard = shard
        handles: list[Any] = [handle]
        if place.world_size > 1:
            handles = [None] * place.world_size
            dist.all_gather_object(handles, handle)
        group = [handles[r] for r in decision.group]
        return SegmentedCacheSpec(plan=decision.plan, handles=tuple(group), policy=decision.layout.policy)

    def _attach_typed(
        self,
        datamodule: CachedDataModule,
        host: Any,
        place: RankPlace,
        on_gpu: bool,
        budget_bytes: Callable[[], int],
        presample: Callable[[Any], Any],
    ) -> Optional[TypedCacheDecision]:
        """:meth:`attach` over the rows of every featured type (``host.features`` a dict of tables)."""
        tables = {t: table.data for t, table in host.features.items()}
        num_rows = {t: int(x.shape[0]) for t, x in tables.items()}
        row_bytes = {t: int(x.shape[1]) * x.element_size() if x.dim() == 2 else 0 for t, x in tables.items()}
        priors = typed_degree_scores(host.graphs, host.num_nodes, list(tables))
        scores = {t: CacheScores(priors[t]) for t in tables}
        if self.options.ranking == "presample":
            halves = presample(num_rows)
            if place.world_size > 1:  # one all-reduce over every type's halves
                flat = torch.cat([halves[t].reshape(-1) for t in tables])
                flat = flat.to(place.device if dist.get_backend() == "nccl" else torch.device("cpu"))
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                parts = flat.cpu().split([2 * num_rows[t] for t in tables])
                halves = {t: part.reshape(2, num_rows[t]) for t, part in zip(tables, parts)}
            scores = {t: CacheScores(priors[t], halves[t]) for t in tables}
        facts = self._exchange_facts(budget_bytes(), place)
        rates = None
        if on_gpu and place.world_size > 1 and needs_typed_read_rates(self.options.policy, facts, scores, num_rows,
                                                                      row_bytes):  # fmt: skip
            from lightning_zerocopy.cache.probe import probe_read_rates

            mine = next(f for f in facts if f.rank == place.rank)
            # the largest table (the same choice on every rank): host reads spread over it, as a batch's misses are
            probed = max((t for t in tables if tables[t].dim() == 2 and tables[t].numel() > 0),
                         key=lambda t: (num_rows[t] * row_bytes[t], t))  # fmt: skip
            rates = probe_read_rates(datamodule.resources.registered_features(probed), place.device,
                                     place.node_rank, place.local_rank, mine.peer_access)  # fmt: skip
        decision = decide_typed_cache(place.rank, facts, scores, num_rows, row_bytes, self.options.policy,
                                      read_rates=rates)  # fmt: skip
        self.decision = decision
        rank_zero_info(f"ZeroCopyDDPStrategy: {decision.summary()}")
        if decision.layout.note and place.local_rank == 0 and place.node_rank > 0:
            print(f"[node {place.node_rank}] ZeroCopyDDPStrategy: {decision.layout.note}", flush=True)
        if not on_gpu:
            return None
        datamodule.set_feature_cache(self._place_typed(decision, tables, place))
        return decision

    def _place_typed(self, decision: TypedCacheDecision, tables: dict[str, torch.Tensor], place: RankPlace) -> Any:
        """Fill this rank's shard of every type, swap the handles within the cache group, return the typed spec."""
        from lightning_zerocopy.cache.typed_provider import TypedFeatureCache

        mine: dict[str, Any] = {}
        for node_type, plan in decision.plans.items():
            shard, handle = fill_shard(plan, decision.shard_index, tables[node_type], place.device)
            self._typed_shards.append(shard)
            mine[node_type] = handle
        handles: list[Any] = [mine]
        if place.world_size > 1:
            handles = [None] * place.world_size
            dist.all_gather_object(handles, mine)
        group = [handles[r] for r in decision.group]
        specs = tuple(
            (t, SegmentedCacheSpec(plan=plan, handles=tuple(h[t] for h in group), policy=decision.layout.policy))
            for t, plan in decision.plans.items()
        )
        return TypedFeatureCache(specs)

    def _free_retired(self, place: RankPlace, barrier: Callable[[str], None]) -> None:
        # shards of an earlier stage: every rank has closed its caches since (its teardown) once all pass the barrier
        if self._retired:
            if place.world_size > 1:
                barrier("zerocopy_cache_retired")
            self._retired.clear()
