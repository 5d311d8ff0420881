"""The rank watch for Lightning's own ``strategy: ddp`` under the ``lightning-zerocopy`` command.

``ZeroCopyDDPStrategy`` watches the other ranks of its machine (:mod:`~lightning_zerocopy.strategies.liveness`) and
launches them without Lightning's observer, which SIGKILLs every rank, itself included, once one has died. With
Lightning's ``DDPStrategy`` a killed rank left the others a gloo ``Connection reset by peer`` traceback (or the
observer's SIGKILL). Through the command the plain strategy gets the same: :func:`watch_plain_ddp` swaps its launcher
for :class:`~lightning_zerocopy.strategies.launcher.ZeroCopyScriptLauncher` and adds :class:`RankWatch`, a callback
that watches the ranks from ``setup`` (the process group exists) to ``teardown``, so the lost rank is named in one
line and the others exit with status 1.
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.strategies import DDPStrategy
from typing_extensions import override

from lightning_zerocopy.data.process_group_exit import destroy_process_group_at_exit, run_failed
from lightning_zerocopy.strategies.launcher import with_rank_watch
from lightning_zerocopy.strategies.liveness import RankLiveness
from lightning_zerocopy.strategies.liveness_lifecycle import launch_watch, stop_watch, trainer_interrupted, watch_ranks
from lightning_zerocopy.strategies.zerocopy_ddp import ZeroCopyDDPStrategy

__all__ = ["RankWatch", "watch_plain_ddp"]

#: Seconds between checks of the other ranks (``ZeroCopyDDPStrategy``'s default ``liveness_interval``).
INTERVAL = 0.5


def watch_plain_ddp(trainer: "pl.Trainer") -> None:
    """Give ``trainer`` the rank watch if its strategy is Lightning's ``DDPStrategy`` (``ZeroCopyDDPStrategy`` has its
    own): the launcher without the SIGKILL observer, and a :class:`RankWatch`."""
    strategy = trainer.strategy
    if not isinstance(strategy, DDPStrategy) or isinstance(strategy, ZeroCopyDDPStrategy):
        return
    launcher = getattr(strategy, "_launcher", None)
    if launcher is not None:
        strategy._launcher = with_rank_watch(launcher, strategy.cluster_environment, strategy.num_processes,
                                             strategy.num_nodes)  # fmt: skip
    trainer.callbacks.append(RankWatch())


class RankWatch(Callback):
    """Watches the other ranks of this machine while a run of Lightning's ``DDPStrategy`` has a process group."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self._watch: Optional[RankLiveness] = None

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        destroy_process_group_at_exit()  # a gloo group left to the interpreter's teardown could abort the exit
        if self._watch is None and trainer.world_size > 1:
            launched = getattr(trainer.strategy.launcher, "launched", lambda: [])()
            early = launch_watch(trainer.global_rank, launched, interval=self.interval)  # this process's, if any
            self._watch = watch_ranks(early, trainer.global_rank, trainer.world_size, self.interval,
                                      stopping=partial(trainer_interrupted, trainer.strategy))  # fmt: skip

    @override
    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            stop_watch(watch)
            trainer.strategy.barrier("lightning_zerocopy_rank_watch_stopped")  # none is taken for dead by the others

    @override
    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        run_failed(exception)  # the process group is then left as it is at exit
        watch, self._watch = self._watch, None
        if watch is not None:
            stop_watch(watch, exception)
