"""Starting a machine's other local ranks (Lightning's subprocess launcher) so that a rank's death ends the job cleanly.

Lightning's launcher re-runs the command once per other local rank and, from then on, polls them every 5 s: when one
fails it SIGKILLs every rank, itself included. A rank killed that way cannot close what it holds (its pipeline
worker, GPU mappings, host registrations), and the job's exit status is 137. :class:`ZeroCopyScriptLauncher` starts
the ranks the same way but leaves the watching to the strategy's liveness watch
(:mod:`~lightning_zerocopy.strategies.liveness`), which names the rank that died and lets the others end through
their exception path (or ends a stuck one after a grace period). It also tells the ranks it starts who launched them
(:data:`~lightning_zerocopy.strategies.liveness.LAUNCHER_ENV`), so that they stop if it dies, during the rendezvous
too.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from lightning_fabric.utilities.distributed import _set_num_threads_if_needed
from pytorch_lightning.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from typing_extensions import override

from lightning_zerocopy.strategies import error_line
from lightning_zerocopy.strategies.liveness import LAUNCHER_ENV, RankLiveness
from lightning_zerocopy.strategies.liveness_lifecycle import launch_watch

__all__ = ["ZeroCopyScriptLauncher", "watch_launch", "with_rank_watch"]


class ZeroCopyScriptLauncher(_SubprocessScriptLauncher):
    """Lightning's ``popen`` launcher without its SIGKILL observer; see the module docstring.

    After :meth:`launch` started them, :meth:`launched` gives the ``(global rank, pid)`` of the ranks it started.

    Args:
        cluster_environment, num_processes, num_nodes: as Lightning's launcher takes them.
        preflight: ``preflight(trainer, datamodule)``, called before any rank is started (``datamodule``: the
            ``LightningDataModule`` handed to the trainer's entry point, or ``None``): a refusal raised there is one
            error of one process, before any rank starts or any data is built.
    """

    def __init__(
        self,
        cluster_environment: Any,
        num_processes: int,
        num_nodes: int,
        preflight: Optional[Callable[[Any, Any], None]] = None,
    ) -> None:
        super().__init__(cluster_environment, num_processes, num_nodes)
        self.preflight = preflight

    @override
    def launch(self, function: Callable, *args: Any, trainer: Optional[Any] = None, **kwargs: Any) -> Any:
        if self.preflight is not None:
            self.preflight(trainer, _datamodule_of(args, kwargs))
        self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        if not self.cluster_environment.creates_processes_externally:
            os.environ[LAUNCHER_ENV] = str(os.getpid())  # the ranks started next inherit it
            error_line.hand_down()  # and claim the job's one error line through this process's file
            self._call_children_scripts()
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)

    def launched(self) -> list[tuple[int, int]]:
        """``(global rank, pid)`` of each rank this process started (empty in a rank it started)."""
        base = self.cluster_environment.node_rank() * self.num_processes
        return [(base + local_rank, proc.pid) for local_rank, proc in enumerate(getattr(self, "procs", []), start=1)]


def _datamodule_of(args: tuple, kwargs: dict) -> Optional[Any]:
    """The ``LightningDataModule`` among the arguments of the trainer's entry point (``_fit_impl``, ``_test_impl``,
    ...: where it sits differs between them), or ``None``."""
    from pytorch_lightning import LightningDataModule

    return next((a for a in (*args, *kwargs.values()) if isinstance(a, LightningDataModule)), None)


def with_rank_watch(
    launcher: Any,
    cluster_environment: Any,
    num_processes: int,
    num_nodes: int,
    preflight: Optional[Callable[[Any, Any], None]] = None,
) -> Any:
    """``launcher`` as the strategy uses it with a liveness watch: Lightning's ``popen`` launcher replaced by a
    :class:`ZeroCopyScriptLauncher` (any other launcher as it is), which calls ``preflight`` before it starts a
    rank."""
    if isinstance(launcher, _SubprocessScriptLauncher) and not isinstance(launcher, ZeroCopyScriptLauncher):
        return ZeroCopyScriptLauncher(cluster_environment, num_processes, num_nodes, preflight)
    return launcher


def watch_launch(
    launcher: Any, cluster_environment: Any, num_processes: int, interval: float
) -> Optional[RankLiveness]:
    """The ranks this process launched, or its launcher, watched from before the rendezvous (see
    :func:`~lightning_zerocopy.strategies.liveness_lifecycle.launch_watch`); ``None`` with ``interval`` 0 or nothing to
    watch."""
    if interval <= 0 or cluster_environment is None:
        return None
    rank = cluster_environment.node_rank() * num_processes + cluster_environment.local_rank()
    launched = launcher.launched() if isinstance(launcher, ZeroCopyScriptLauncher) else []
    return launch_watch(rank, launched, interval=interval)
