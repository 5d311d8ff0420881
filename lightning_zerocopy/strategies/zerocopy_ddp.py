"""``ZeroCopyDDPStrategy``: Lightning's DDP plus a hot-feature GPU cache sized by a byte budget.

Registered as ``zerocopy_ddp`` in Lightning's strategy registry (once :mod:`lightning_zerocopy.strategies` is
imported; the ``lightning-zerocopy`` command does that), usable by ``class_path`` too. One host copy per machine and a
disjoint, equal seed share per rank come from the :class:`~lightning_zerocopy.data.ZeroCopyDataModule` (built on each
machine's local rank 0; its batch plan). The hooks delegate the rest:

* the feature cache to :class:`~lightning_zerocopy.cache.setup.RankCache`, when the DataModule's ``setup`` calls
  :meth:`ZeroCopyDDPStrategy.attach_host_memory` (before any pipeline worker starts): decided with the other ranks,
  this rank's shard filled, shard handles swapped within the cache group, the provider handed to the DataModule,
  whose builders (the trainer's and a pipeline worker's) gather through it. Caches never span machines;
* the presampling of ``cache_ranking: presample`` to :mod:`~lightning_zerocopy.strategies.presample`;
* the launch and the watch that stops a machine's ranks, naming the one that died, to
  :mod:`~lightning_zerocopy.strategies.launcher`, :mod:`~lightning_zerocopy.strategies.liveness` and
  :mod:`~lightning_zerocopy.strategies.liveness_lifecycle`.

Resources: the process group and the watch in ``setup_environment``, the cache in ``attach_host_memory``, both
released in ``teardown`` and ``on_exception``. The constructor only stores and checks the configuration.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Mapping, Optional

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy, StrategyRegistry
from pytorch_lightning.utilities import rank_zero_info
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_zerocopy.cache.budget import CacheBudget
from lightning_zerocopy.cache.cliques import CachePolicy
from lightning_zerocopy.cache.ranking import CacheRanking
from lightning_zerocopy.cache.setup import CacheOptions, RankCache, RankPlace
from lightning_zerocopy.data.process_group_exit import destroy_process_group_at_exit, run_failed
from lightning_zerocopy.exit_trace import trace_a_slow_exit
from lightning_zerocopy.strategies.error_line import NOTE_PREFIX, say
from lightning_zerocopy.strategies.launcher import watch_launch, with_rank_watch
from lightning_zerocopy.strategies.liveness import RankLiveness
from lightning_zerocopy.strategies.liveness_lifecycle import stop_watch, trainer_interrupted, watch_ranks
from lightning_zerocopy.strategies.shard_readers import stop_reading, stream_drained, wait_for_readers
from lightning_zerocopy.strategies.ddp_options import (
    StaticGraph,
    StaticGraphChoice,
    accumulates_gradients,
    choose_static_graph,
    explain_graph_change,
)

if TYPE_CHECKING:
    from lightning_zerocopy.cache.decide import CacheDecision
    from lightning_zerocopy.cache.segmented import CacheCounts
    from lightning_zerocopy.data.datamodule import ZeroCopyDataModule

__all__ = ["ZeroCopyDDPStrategy"]


class ZeroCopyDDPStrategy(DDPStrategy):
    """DDP with one host copy per machine and a GPU cache of hot feature rows, replicated or sharded over cliques.

    Args:
        cache_budget: bytes each GPU may spend on cached feature rows: a size (``"8GiB"``, ``"512MB"``, an int of
            bytes), a share of the GPU memory free once the model is placed (``"40%"``), or ``0`` (no cache). The
            smallest budget of all ranks applies everywhere. A size above 90 % of the free memory is clamped with a
            warning. The budget covers the row lookup every GPU builds over the whole table (4 bytes per table
            row, 8 for shards over 2**(31 - shard bits) rows: :func:`~lightning_zerocopy.cache.plan.lookup_bytes`),
            charged before the first row; a budget below it caches nothing. When the budget holds the whole
            feature table and its lookup, the table is placed on the GPU(s) entirely.
            Under a :class:`~lightning_zerocopy.data.datamodule.ZeroCopyHeteroDataModule` (a table per
            featured node type) the budget covers the rows of every featured type: one ranking of ``(type, row)``
            by expected reads per byte, each type's lookup charged first, one shard per type and GPU
            (:mod:`~lightning_zerocopy.cache.cached_rows`); ``auto`` prices the two layouts with the same measured
            read rates, on the bytes the ranking expects each to serve (:mod:`~lightning_zerocopy.cache.decide`).
        cache_ranking: which rows are hot: ``"degree"`` (how often a node is some node's in-neighbor) or
            ``"presample"`` (run the DataModule's sampler over the training seeds, or a link DataModule's training
            link batches, for ``presample_batches`` batches, count each node's appearances and blend the counts with the degree prior, its weight chosen
            on held-out batches for the cache's row count; deterministic, spread over the ranks; the logged
            expected hit rate is the held-out one).
        cache_policy: ``"replicate"`` (every GPU holds the same hot rows), ``"clique"`` (GPUs with mutual peer
            access split the hot rows into one shard each, so a clique of k GPUs caches k times the rows; without
            peer access: a warning, then replicate) or ``"auto"`` (clique where peers exist and the hot rows do not
            fit one GPU's budget, and the measured read rates say it reads faster; else replicate; the log says why).
        presample_batches: batches sampled for ``cache_ranking="presample"`` (at least 2: the even and the odd
            ones are the two halves that choose the prior weight and estimate the hit rate out of sample).
        peer_access: a peer-access matrix over each machine's local ranks to use instead of the measured one
            (``peer_access[i][j]``: local rank i's GPU can read local rank j's); for simulations and tests.
        liveness_interval: seconds between checks that the other ranks of this machine still run; ``0`` turns
            the check off.
        static_graph: DDP's ``static_graph``: ``"auto"`` (default) turns it on when ``find_unused_parameters`` is
            off (so every step uses every parameter, which DDP then already demands), the module optimizes
            automatically and the trainer does not accumulate gradients; ``True``/``False`` as given. DDP then takes
            the first step's used set as fixed (what it changes: :mod:`~lightning_zerocopy.strategies.ddp_options`).
            A later step that uses other parameters raises DDP's error, rewritten into one line naming this key.
        gradient_as_bucket_view: DDP's ``gradient_as_bucket_view`` (default ``True``, torch's is ``False``): the
            gradients are views of the all-reduce buckets, so the reduced buckets are not copied back into them.
        **kwargs: everything :class:`~pytorch_lightning.strategies.DDPStrategy` takes (``timeout``,
            ``process_group_backend``, ``find_unused_parameters``, ...), including the other arguments of
            :class:`~torch.nn.parallel.DistributedDataParallel`, handed to the wrapper as given: ``bucket_cap_mb``
            (25 MiB buckets), ``broadcast_buffers`` (``True``). Their effect on a rank's step time is measured by
            ``python -m benchmarks.scaling.diag`` (``--knobs``) and ``python -m benchmarks.scaling.confirm``.

    Raises:
        ValueError: an unreadable ``cache_budget``, an unknown ``cache_ranking`` or ``cache_policy``,
            ``presample_batches`` below 2, a malformed ``peer_access``, a negative ``liveness_interval`` or a
            ``static_graph`` other than true, false or ``"auto"`` (the message names the argument).

    Example::

        trainer = pl.Trainer(
            accelerator="gpu", devices=4,
            strategy=ZeroCopyDDPStrategy(cache_budget="40%", cache_ranking="presample", cache_policy="auto"),
        )
        trainer.fit(model, datamodule=ZeroCopyDataModule(dataset, gather="zerocopy"))
    """

    strategy_name = "zerocopy_ddp"
    #: seconds a rank stopping on an error waits for the ranks that read its clique shards to stop reading them
    reader_wait_s = 5.0

    def __init__(
        self,
        cache_budget: CacheBudget = 0,
        cache_ranking: CacheRanking = "degree",
        cache_policy: CachePolicy = "auto",
        presample_batches: int = 64,
        peer_access: Optional[list[list[bool]]] = None,
        liveness_interval: float = 0.5,
        static_graph: StaticGraph = "auto",
        gradient_as_bucket_view: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        choose_static_graph(static_graph, False, True)  # checks the value now, not when the model is wrapped
        self.static_graph = static_graph
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        #: the static_graph the wrapper got and why (set when the model is wrapped)
        self.static_graph_choice: Optional[StaticGraphChoice] = None
        options = CacheOptions.parse(cache_budget, cache_ranking, cache_policy, presample_batches, peer_access)
        self.cache_budget, self.cache_ranking, self.cache_policy = options.budget, options.ranking, options.policy
        self.presample_batches, self.peer_access = options.presample_batches, options.peer_access
        if liveness_interval < 0:
            raise ValueError(f"liveness_interval must be >= 0 seconds, got {liveness_interval}")
        self.liveness_interval = float(liveness_interval)
        self._cache = RankCache(options)
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

    # ---- Lightning hooks, in the order they run --------------------------------------------------------------

    @override
    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self.liveness_interval > 0:
            env, processes, nodes = self.cluster_environment, self.num_processes, self.num_nodes
            self._launcher = with_rank_watch(self._launcher, env, processes, nodes, self._preflight)

    @override
    def setup_environment(self) -> None:
        # the launch is watched from before the rendezvous, which waits for every rank
        watch = watch_launch(self._launcher, self.cluster_environment, self.num_processes, self.liveness_interval)
        super().setup_environment()  # the process group
        destroy_process_group_at_exit()  # (Lightning does it for NCCL only; a gloo group could abort the exit)
        if self.liveness_interval > 0 and self._liveness is None and self.world_size > 1:
            self._liveness = watch_ranks(watch, self.global_rank, self.world_size, self.liveness_interval,
                                         stopping=partial(trainer_interrupted, self))  # fmt: skip

    def attach_host_memory(self, trainer: "pl.Trainer", datamodule: "ZeroCopyDataModule") -> None:
        """Decide and place this rank's feature cache, and hand it to ``datamodule``'s builders.

        Called by the DataModule in ``setup`` on every rank (see
        :class:`~lightning_zerocopy.data.HostMemoryConsumer`), while its shared host memory can still be opened by
        name and before any pipeline worker opens a builder. A collective: every rank calls it.
        """
        place = RankPlace(self.global_rank, self.world_size, self.node_rank, self.local_rank, self.root_device)
        placed = self._cache.attach(datamodule, place, self._free_gpu_bytes, partial(self._presample, datamodule),
                                    self.barrier)  # fmt: skip
        if placed is not None and self._liveness is not None and len(placed.group) > 1:
            self._liveness.depend_on(set(placed.group))  # their shards are read here and by our pipeline workers

    @override
    def _setup_model(self, model: torch.nn.Module) -> DistributedDataParallel:
        """Wrap ``model`` in DDP on the stream the training steps run on. Lightning 2.6 builds it under a side stream,
        so every backward handed the ``AccumulateGrad`` nodes gradients from another stream, and torch warned and
        synchronized the two (Lightning-AI/pytorch-lightning#21567; fixed upstream the same way after 2.6)."""
        device_ids = self.determine_ddp_device_ids()
        kwargs = self._wrapper_kwargs(model)
        if device_ids is None:
            return DistributedDataParallel(module=model, device_ids=None, **kwargs)
        with torch.cuda.stream(torch.cuda.current_stream(self.root_device)):
            return DistributedDataParallel(module=model, device_ids=device_ids, **kwargs)

    def _wrapper_kwargs(self, model: torch.nn.Module) -> dict[str, Any]:
        """DDP's arguments for ``model``: the pass-through ones, ``gradient_as_bucket_view`` and the ``static_graph``
        :func:`~lightning_zerocopy.strategies.ddp_options.choose_static_graph` picks (logged once)."""
        automatic = bool(getattr(model, "automatic_optimization", True))
        accumulates = accumulates_gradients(getattr(self.lightning_module, "_trainer", None))
        choice = choose_static_graph(self.static_graph, bool(self._ddp_kwargs.get("find_unused_parameters", False)),
                                     automatic, accumulates)  # fmt: skip
        self.static_graph_choice = choice
        rank_zero_info(f"ZeroCopyDDPStrategy: DDP static_graph={choice.on} ({choice.reason}), "
                       f"gradient_as_bucket_view={self.gradient_as_bucket_view}")  # fmt: skip
        return {**self._ddp_kwargs, "static_graph": choice.on, "gradient_as_bucket_view": self.gradient_as_bucket_view}

    @override
    def teardown(self) -> None:
        liveness, self._liveness = self._liveness, None
        if liveness is not None:
            stop_watch(liveness)
            # no rank leaves before every rank has stopped watching: a rank that finishes first is not taken for dead
            self.barrier("zerocopy_liveness_stopped")
        self._cache.retire()
        super().teardown()

    @override
    def on_exception(self, exception: BaseException) -> None:
        trace_a_slow_exit()
        run_failed(exception)  # the process group is then left as it is at exit
        liveness, self._liveness = self._liveness, None  # teardown then skips its barrier (a rank may be gone)
        if liveness is not None:
            stop_watch(liveness, exception)
            self._leave_after_readers(liveness)
        self._cache.retire()
        if self.static_graph_choice is not None:  # before Lightning's own rewrite of the unused-parameter error
            explain_graph_change(exception, self.static_graph_choice)
        super().on_exception(exception)

    def _leave_after_readers(self, liveness: RankLiveness) -> None:
        """Under a clique cache, on an exception: say this rank reads no peer shard any more (its workers were closed
        by the callbacks' ``on_exception``; its stream drained), then wait, at most
        :attr:`reader_wait_s`, until the ranks that read this rank's shards say the same or are gone
        (:mod:`~lightning_zerocopy.strategies.shard_readers`): its shards go with its process."""
        readers = liveness.mapped_peers
        if not readers:
            return
        device = self.root_device
        if stop_reading(liveness.store, self.global_rank,
                        partial(stream_drained, device) if device.type == "cuda" else None):  # fmt: skip
            liveness.depend_on(set())  # a reader's exit breaks nothing here any more: the watch need not end this rank
        late = wait_for_readers(liveness.store, readers, liveness.alive, self.reader_wait_s)
        if late:
            ranks = ", ".join(str(r.rank) for r in late)
            say(f"{NOTE_PREFIX}rank {self.global_rank}: rank(s) {ranks} still read its cache shards "
                f"{self.reader_wait_s:.0f} s after it stopped; leaving")  # one write: the ranks share stderr

    # ---- heterogeneous DataModules ---------------------------------------------------------------------------

    @property
    def takes_hetero_builders(self) -> bool:
        """Whether a :class:`~lightning_zerocopy.data.datamodule.ZeroCopyHeteroDataModule` may run under this
        strategy: always. One host copy per machine, the seed shares of the plan and the rank watch hold for typed
        data as they are; a ``cache_budget`` covers the rows of every featured type
        (:class:`~lightning_zerocopy.cache.setup.RankCache` reads the host's tables by node type)."""
        return True

    def _preflight(self, trainer: Optional["pl.Trainer"], datamodule: Optional[Any]) -> None:
        """The DataModule's refusals of the trainer's components, before the launcher starts any other rank (so a
        refusal is one error of one process, not one per rank racing the rank watch). A DataModule that refuses some
        (:class:`~lightning_zerocopy.data.datamodule.ZeroCopyHeteroDataModule`) has ``check_consumers``; it
        checks them again in its ``setup`` (launchers that start no rank here, e.g. ``torchrun``)."""
        check = getattr(datamodule, "check_consumers", None)
        if trainer is not None and callable(check):
            check(trainer)

    # ---- the cache, as telemetry and tests read it -------------------------------------------------------------

    @property
    def cache_decision(self) -> Optional["CacheDecision"]:
        """The decided cache of this rank (after the DataModule's setup), for logs and tests."""
        return self._cache.decision

    def cache_counts(self) -> Optional["CacheCounts"]:
        """Rows this process's builders gathered so far from the local shard(s), peers' shards and host memory
        (reading synchronizes the GPU), or ``None`` without a cache. A pipeline worker process counts in its own
        process."""
        return self._cache.counts()

    def cache_counts_per_type(self) -> Optional[dict[str, Optional["CacheCounts"]]]:
        """:meth:`cache_counts` per featured node type (``None`` where this process opened no cache of the type;
        ``None`` without a cache). Each type's row bytes: ``cache_decision.row_bytes``."""
        return self._cache.counts_per_type()

    # ---- what the cache asks of the strategy -------------------------------------------------------------------

    def _free_gpu_bytes(self) -> int:
        if self.model is not None:
            self.model_to_device()  # "free memory" means free once the model is there (DDP's setup does it again)
        return int(torch.cuda.mem_get_info(self.root_device)[0])

    def _presample(self, datamodule: "ZeroCopyDataModule", num_rows: Mapping[str, int]) -> dict[str, torch.Tensor]:
        from lightning_zerocopy.strategies.presample import presample_halves  # imports the DataModule's builders

        return presample_halves(datamodule, self.presample_batches, self.global_rank, self.world_size, num_rows)


ZeroCopyDDPStrategy.register_strategies(StrategyRegistry)
