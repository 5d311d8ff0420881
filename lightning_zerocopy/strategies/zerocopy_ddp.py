"""``ZeroCopyDDPStrategy``: Lightning's DDP plus a hot-feature GPU cache sized by a byte budget.

Registered in Lightning's strategy registry as ``zerocopy_ddp`` (``trainer.strategy: zerocopy_ddp`` in a recipe,
once :mod:`lightning_zerocopy.strategies` is imported; the ``lightning-zerocopy`` command does that) and usable by
``class_path`` with ``init_args``. What it adds to DDP:

* one host copy per machine for all ranks (the :class:`~lightning_zerocopy.data.ZeroCopyDataModule` builds it on
  each machine's local rank 0) and a disjoint, equal seed share per rank (its batch plan);
* a feature cache (``cache_budget``, ``cache_ranking``, ``cache_policy``): the DataModule calls
  :meth:`ZeroCopyDDPStrategy.attach_host_memory` during its ``setup`` (before any pipeline worker starts), the
  strategy decides the cache (:mod:`~lightning_zerocopy.strategies.cache_setup`), fills this rank's shard, swaps
  shard handles within its cache group and hands the picklable
  :class:`~lightning_zerocopy.gather.feature_cache.FeatureCacheSpec` to the DataModule, whose builders (the
  trainer's and a pipeline worker's) gather through it. Caches never span machines;
* a liveness watch (:mod:`~lightning_zerocopy.strategies.liveness`): a rank that dies stops the others of its
  machine with an error naming it.

Resources: the process group in ``setup_environment`` (DDP's), the cache in ``attach_host_memory``, both released
in ``teardown`` and ``on_exception``. The constructor only stores and checks the configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from pytorch_lightning.strategies import DDPStrategy, StrategyRegistry
from pytorch_lightning.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_zerocopy.strategies.budget import CacheBudget, parse_budget, resolve_budget
from lightning_zerocopy.strategies.liveness import RankInfo, RankLiveness, forget_launch_watch, launch_watch
from lightning_zerocopy.strategies.ranking import CacheRanking, check_ranking
from lightning_zerocopy.strategies.topology import CACHE_POLICIES, CachePolicy

if TYPE_CHECKING:
    from lightning_zerocopy.data.datamodule import ZeroCopyDataModule
    from lightning_zerocopy.strategies.cache_setup import CacheDecision
    from lightning_zerocopy.strategies.ranking import CacheScores

__all__ = ["ZeroCopyDDPStrategy"]


class ZeroCopyDDPStrategy(DDPStrategy):
    """DDP with one host copy per machine and a GPU cache of hot feature rows, replicated or sharded over cliques.

    Args:
        cache_budget: bytes each GPU may spend on cached feature rows: a size (``"8GiB"``, ``"512MB"``, an int of
            bytes), a share of the GPU memory free once the model is placed (``"40%"``), or ``0`` (no cache). The
            smallest budget of all ranks applies everywhere. A size above 90 % of the free memory is clamped with a
            warning. When the budget holds the whole feature table, the table is placed on the GPU(s) entirely.
        cache_ranking: which rows are hot: ``"degree"`` (how often a node is some node's in-neighbor) or
            ``"presample"`` (run the DataModule's sampler over the training seeds for ``presample_batches``
            batches, count each node's appearances and blend the counts with the degree prior, its weight chosen
            on held-out batches for the cache's row count; deterministic, spread over the ranks; the logged
            expected hit rate is the held-out one).
        cache_policy: ``"replicate"`` (every GPU holds the same hot rows), ``"clique"`` (GPUs with mutual peer
            access split the hot rows into one shard each, so a clique of k GPUs caches k times the rows; without
            peer access: a warning, then replicate) or ``"auto"`` (clique where peers exist and the hot rows do not
            fit one GPU's budget, else replicate; the log says why).
        presample_batches: batches sampled for ``cache_ranking="presample"`` (at least 2: the even and the odd
            ones are the two halves that choose the prior weight and estimate the hit rate out of sample).
        peer_access: a peer-access matrix over each machine's local ranks to use instead of the measured one
            (``peer_access[i][j]``: local rank i's GPU can read local rank j's); for simulations and tests.
        liveness_interval: seconds between checks that the other ranks of this machine still run; ``0`` turns
            the check off.
        **kwargs: everything :class:`~pytorch_lightning.strategies.DDPStrategy` takes (``timeout``,
            ``process_group_backend``, ``find_unused_parameters``, ...).

    Raises:
        ValueError: an unreadable ``cache_budget``, an unknown ``cache_ranking`` or ``cache_policy``, a negative
            ``presample_batches`` below 2, or a malformed ``peer_access`` (the message names the argument).
    """

    strategy_name = "zerocopy_ddp"

    def __init__(
        self,
        cache_budget: CacheBudget = 0,
        cache_ranking: CacheRanking = "degree",
        cache_policy: CachePolicy = "auto",
        presample_batches: int = 64,
        peer_access: Optional[list[list[bool]]] = None,
        liveness_interval: float = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cache_budget = parse_budget(cache_budget, "cache_budget")
        self.cache_ranking = check_ranking(cache_ranking, "cache_ranking")
        if cache_policy not in CACHE_POLICIES:
            raise ValueError(f"cache_policy must be one of {', '.join(map(repr, CACHE_POLICIES))}, got {cache_policy!r}")
        self.cache_policy = cache_policy
        if isinstance(presample_batches, bool) or not isinstance(presample_batches, int) or presample_batches < 2:
            raise ValueError(f"presample_batches must be an int >= 2, got {presample_batches!r}")
        self.presample_batches = presample_batches
        if peer_access is not None:
            n = len(peer_access)
            if n == 0 or any(len(row) != n for row in peer_access):
                raise ValueError(f"peer_access must be a square, non-empty matrix of booleans, got {peer_access!r}")
        self.peer_access = None if peer_access is None else [[bool(v) for v in row] for row in peer_access]
        if liveness_interval < 0:
            raise ValueError(f"liveness_interval must be >= 0 seconds, got {liveness_interval}")
        self.liveness_interval = float(liveness_interval)
        #: the decided cache of this rank (after the DataModule's setup), for logs and tests
        self.cache_decision: Optional["CacheDecision"] = None
        self._shard: Optional[torch.Tensor] = None
        self._retired: list[torch.Tensor] = []
        self._liveness: Optional[RankLiveness] = None

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        if cls.strategy_name not in strategy_registry:
            strategy_registry.register(
                cls.strategy_name,
                cls,
                description="DDP with one host copy per machine and a hot-feature GPU cache (lightning-zerocopy)",
            )

    # ---- Lightning hooks -----------------------------------------------------------------------------------

    @override
    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self.liveness_interval > 0 and isinstance(self._launcher, _SubprocessScriptLauncher):
            from lightning_zerocopy.strategies.launcher import ZeroCopyScriptLauncher

            self._launcher = ZeroCopyScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    @override
    def setup_environment(self) -> None:
        watch = self._watch_the_launch()  # before the rendezvous, which waits for every rank
        super().setup_environment()  # the process group
        if self.liveness_interval > 0 and self._liveness is None and self.world_size > 1:
            ranks: list[Any] = [None] * self.world_size
            dist.all_gather_object(ranks, RankInfo.here(self.global_rank))
            store, stopping = _default_store(), self._trainer_interrupted
            if watch is None:
                watch = RankLiveness(RankInfo.here(self.global_rank), ranks, interval=self.liveness_interval,
                                     store=store, stopping=stopping)  # fmt: skip
            else:
                watch.watch(ranks, store=store, stopping=stopping, me=RankInfo.here(self.global_rank))
            watch.start()
            self._liveness = watch

    def _watch_the_launch(self) -> Optional[RankLiveness]:
        """The ranks this process launched, or its launcher, watched from before the rendezvous (see
        :func:`~lightning_zerocopy.strategies.liveness.launch_watch`)."""
        if self.liveness_interval <= 0 or self.cluster_environment is None:
            return None
        from lightning_zerocopy.strategies.launcher import ZeroCopyScriptLauncher

        env = self.cluster_environment
        rank = env.node_rank() * self.num_processes + env.local_rank()
        launched = self._launcher.launched() if isinstance(self._launcher, ZeroCopyScriptLauncher) else []
        return launch_watch(rank, launched, interval=self.liveness_interval)

    @override
    def _setup_model(self, model: torch.nn.Module) -> DistributedDataParallel:
        """Wrap ``model`` in DDP on the stream that the training steps run on.

        Lightning 2.6's ``DDPStrategy`` builds DDP under a fresh side stream (for whole-network CUDA graph capture).
        DDP keeps each parameter's ``AccumulateGrad`` node from then on, and an autograd node remembers the stream
        current when it was made; every forward afterwards runs on the device's current (default) stream, so each
        backward hands those nodes gradients from another stream, and torch warns ("The AccumulateGrad node's
        stream does not match ... if you are using DDP") and synchronizes the two streams. Built on the forwards'
        stream, the nodes and the gradients agree (Lightning-AI/pytorch-lightning#21567; fixed upstream the same
        way after 2.6).
        """
        device_ids = self.determine_ddp_device_ids()
        if device_ids is None:
            return DistributedDataParallel(module=model, device_ids=None, **self._ddp_kwargs)
        with torch.cuda.stream(torch.cuda.current_stream(self.root_device)):
            return DistributedDataParallel(module=model, device_ids=device_ids, **self._ddp_kwargs)

    @override
    def teardown(self) -> None:
        liveness, self._liveness = self._liveness, None
        if liveness is not None:
            liveness.stop()
            forget_launch_watch(liveness)
            # no rank leaves before every rank has stopped watching: a rank that finishes first is not taken for dead
            self.barrier("zerocopy_liveness_stopped")
        self._retire_shard()
        super().teardown()

    @override
    def on_exception(self, exception: BaseException) -> None:
        liveness, self._liveness = self._liveness, None  # teardown then skips its barrier (a rank may be gone)
        if liveness is not None:
            liveness.announce(exception)  # first: the other ranks' errors name this rank's cause (or its interrupt)
            liveness.stop()
            forget_launch_watch(liveness)
            liveness.explain(exception)  # a collective's error names no rank: say which one went away
        self._retire_shard()
        super().on_exception(exception)

    def _trainer_interrupted(self) -> bool:
        """Whether Lightning is handling an exception of this rank (it sets the status before any ``on_exception``)."""
        from pytorch_lightning.trainer.states import TrainerStatus

        module = self.lightning_module
        trainer = getattr(module, "_trainer", None) if module is not None else None
        return trainer is not None and trainer.state.status == TrainerStatus.INTERRUPTED

    # ---- the DataModule's host-memory hook (see HostMemoryConsumer) ---------------------------------------

    def attach_host_memory(self, trainer: "pl.Trainer", datamodule: "ZeroCopyDataModule") -> None:
        """Decide and place this rank's feature cache, and hand its spec to ``datamodule``'s builders.

        Called by the DataModule in ``setup`` on every rank, while its shared host memory can still be opened by
        name and before any pipeline worker opens a builder. A collective: every rank calls it.
        """
        from lightning_zerocopy.strategies.cache_setup import decide_cache, needs_read_rates

        self._free_retired()  # shards of an earlier stage: every rank has closed its caches since (teardown)
        if self.cache_budget.is_zero:
            return
        if datamodule.hot_rows > 0:
            raise ValueError(
                f"data.init_args.hot_rows={datamodule.hot_rows} and the strategy's cache_budget="
                f"{self.cache_budget.text!r} both cache feature rows on the GPU: set data.init_args.hot_rows to 0 "
                "(the strategy's cache replaces it) or cache_budget to 0"
            )
        root = self.root_device
        on_gpu = root.type == "cuda" and datamodule.uses_zerocopy_gather
        if root.type == "cuda" and not on_gpu:
            rank_zero_warn(
                f"cache_budget={self.cache_budget.text!r} is not used: the feature cache serves the zero-copy gather, "
                "but data.init_args.gather resolves to 'cpu'"
            )
        host = datamodule.resources.host  # this process's mapping of the host memory
        table = host.features.data
        num_nodes, row_bytes = int(table.shape[0]), int(table[0].numel() * table.element_size()) if table.shape[0] else 0
        scores = self._scores(datamodule, host.graph.indices, num_nodes)
        facts = self._exchange_facts(self._budget_bytes(root, on_gpu))
        rates = None
        if on_gpu and self.world_size > 1 and needs_read_rates(self.cache_policy, facts, scores.hot_rows, num_nodes, row_bytes):
            from lightning_zerocopy.strategies.read_probe import probe_read_rates

            mine = next(f for f in facts if f.rank == self.global_rank)
            rates = probe_read_rates(datamodule.resources.registered_features(), root, self.node_rank,
                                     self.local_rank, mine.peer_access)  # fmt: skip
        decision = decide_cache(self.global_rank, facts, scores, num_nodes, row_bytes, self.cache_policy,
                                read_rates=rates)  # fmt: skip
        self.cache_decision = decision
        rank_zero_info(f"ZeroCopyDDPStrategy: {decision.summary()}")
        if decision.layout.note and self.local_rank == 0 and self.node_rank > 0:
            print(f"[node {self.node_rank}] ZeroCopyDDPStrategy: {decision.layout.note}", flush=True)
        if on_gpu:
            from lightning_zerocopy.strategies.cache_spec import ShardedFeatureCache

            datamodule.set_feature_cache(ShardedFeatureCache(self._place(decision, table, root)))
            if self._liveness is not None and len(decision.group) > 1:
                self._liveness.depend_on(set(decision.group))  # their shards are read here and by our workers

    def cache_counts(self) -> Optional[Any]:
        """Rows this process's builders gathered so far from the local shard(s), peers' shards and host memory (a
        :class:`~lightning_zerocopy.gather.feature_cache.CacheCounts`; reading synchronizes the GPU), or ``None``
        without a cache. A pipeline worker process counts in its own process."""
        from lightning_zerocopy.strategies.cache_spec import open_cache_counts

        decision = self.cache_decision
        return None if decision is None else open_cache_counts(decision.plan.digest)

    @property
    def cache_row_bytes(self) -> int:
        """Bytes of one feature row (0 before the cache is decided)."""
        return 0 if self.cache_decision is None else self.cache_decision.row_bytes

    # ---- internals -----------------------------------------------------------------------------------------

    def _budget_bytes(self, root: torch.device, on_gpu: bool) -> int:
        if not on_gpu:
            if self.cache_budget.kind == "fraction":
                raise ValueError(
                    f"cache_budget={self.cache_budget.text!r} is a share of free GPU memory, but batches are not "
                    f"gathered on a GPU here (the trainer runs on {root.type!r}); give a size like '1GiB' or 0"
                )
            return int(self.cache_budget.amount)
        if self.model is not None:
            self.model_to_device()  # "free memory" means free once the model is there (DDP's setup does it again)
        free, _total = torch.cuda.mem_get_info(root)
        return resolve_budget(self.cache_budget, free, "cache_budget", where=str(root))

    def _scores(self, datamodule: "ZeroCopyDataModule", indices: torch.Tensor, num_nodes: int) -> "CacheScores":
        """The ranking's inputs, identical on every rank: the degree scores, plus for ``presample`` the two halves
        of the presampled counts summed over the ranks (CPU tensors; the ranking itself runs in ``decide_cache``
        once the number of cached rows is known)."""
        from lightning_zerocopy.strategies.ranking import CacheScores, degree_scores

        degree = degree_scores(indices, num_nodes)
        if self.cache_ranking == "degree":
            return CacheScores(degree)
        halves = _presample(datamodule, self.presample_batches, self.global_rank, self.world_size, num_nodes)
        if self.world_size > 1:
            device = self.root_device if dist.get_backend() == "nccl" else torch.device("cpu")
            summed = halves.to(device)
            dist.all_reduce(summed, op=dist.ReduceOp.SUM)
            halves = summed.cpu()
        return CacheScores(degree.cpu(), halves)

    def _exchange_facts(self, budget_bytes: int) -> list[Any]:
        from lightning_zerocopy.strategies.cache_setup import RankFacts
        from lightning_zerocopy.strategies.topology import measure_peer_access

        root = self.root_device
        device = root.index if root.type == "cuda" else None
        devices: list[Any] = [None] * self.world_size
        mine = (self.node_rank, self.local_rank, device)
        if self.world_size > 1:
            dist.all_gather_object(devices, mine)
        else:
            devices = [mine]
        peer = None
        if self.local_rank == 0:
            machine = sorted((d for d in devices if d[0] == self.node_rank), key=lambda d: d[1])
            if self.peer_access is not None:
                if len(self.peer_access) != len(machine):
                    raise ValueError(
                        f"peer_access is {len(self.peer_access)}x{len(self.peer_access)}, but node {self.node_rank} "
                        f"runs {len(machine)} ranks"
                    )
                peer = self.peer_access
            elif device is not None:
                peer = measure_peer_access([d[2] for d in machine])
            else:  # CPU ranks: no peers
                peer = [[i == j for j in range(len(machine))] for i in range(len(machine))]
        fact = RankFacts(self.global_rank, self.node_rank, self.local_rank, device, budget_bytes, peer)
        if self.world_size == 1:
            return [fact]
        facts: list[Any] = [None] * self.world_size
        dist.all_gather_object(facts, fact)
        return facts

    def _place(self, decision: "CacheDecision", table: torch.Tensor, device: torch.device) -> Any:
        """Fill this rank's shard, swap handles within the cache group, return the group's spec."""
        from lightning_zerocopy.gather.feature_cache import FeatureCacheSpec, fill_shard

        shard, handle = fill_shard(decision.plan, decision.shard_index, table, device)
        self._shard = shard
        handles: list[Any] = [None] * self.world_size
        if self.world_size > 1:
            dist.all_gather_object(handles, handle)
        else:
            handles = [handle]
        group = [handles[r] for r in decision.group]
        return FeatureCacheSpec(plan=decision.plan, handles=tuple(group), policy=decision.layout.policy)

    def _retire_shard(self) -> None:
        # The shard may still be open in other processes (peers, a pipeline worker) until their teardown: keep it
        # until the next attach (after a collective every rank reaches only past its teardown) or process exit.
        if self._shard is not None:
            self._retired.append(self._shard)
            self._shard = None

    def _free_retired(self) -> None:
        if self._retired:
            if self.world_size > 1:
                self.barrier("zerocopy_cache_retired")
            self._retired.clear()


def _default_store() -> Any:
    """The default process group's key-value store, for the liveness watch's exit notes (``None`` if unavailable)."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - a torch without it: the watch still names a gone rank, without its cause
        return None


def _presample(
    datamodule: "ZeroCopyDataModule", num_batches: int, rank: int, world_size: int, num_nodes: int
) -> torch.Tensor:
    """This rank's part of the presampling counts, in halves (``[2, num_nodes]``, see
    :func:`~lightning_zerocopy.strategies.ranking.presample_counts`): the DataModule's sampler on CPU over a seeded
    one-rank plan."""
    from lightning_zerocopy.data.batch import BatchBuilder
    from lightning_zerocopy.data.plan import BatchPlan
    from lightning_zerocopy.strategies.ranking import PRESAMPLE_STREAM, presample_counts

    train = datamodule.plan("train")
    # batches of the training plan's seed nodes, as many per batch as its items start from (a link plan's items
    # start from both endpoints of their positive and negative edges)
    plan = BatchPlan(train.input_nodes, train.max_seed_nodes, shuffle=True, seed=datamodule.seed, stream=PRESAMPLE_STREAM)
    # the CPU placement draws bitwise the samples of the GPU placements (same plan item, same seed)
    builder = BatchBuilder(
        datamodule.handles, datamodule.fanouts, replace=datamodule.replace, num_threads=datamodule.num_threads
    ).open(datamodule.resources, place=False)

    def sample(item: Any) -> torch.Tensor:
        return builder.sample_batch(item).sample.n_id

    try:
        return presample_counts(sample, plan, num_batches, num_nodes, rank, world_size, progress=rank == 0)
    finally:
        builder.close()


ZeroCopyDDPStrategy.register_strategies(StrategyRegistry)
