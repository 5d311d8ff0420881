"""When a process starts, switches over and stops its rank-liveness watch, across the stages of a run.

* at launch, before the process group exists: :func:`launch_watch` watches the ranks this launch knows (the ranks a
  launcher started, or a launched rank's launcher), once per process;
* once the process group exists: :func:`watch_ranks` exchanges every rank's :class:`RankInfo` and watches every
  other rank of this machine, with the process group's store for exit notes (:func:`trainer_interrupted` tells it
  when Lightning is already stopping this rank);
* at the end of the run, or when this rank fails: :func:`stop_watch` leaves the exit note, stops the watch and
  explains a collective's error by the rank that went away.

The watch itself (:class:`~lightning_zerocopy.strategies.liveness.RankLiveness`) and why it exists are
:mod:`lightning_zerocopy.strategies.liveness`.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable, Optional, Sequence

from lightning_zerocopy.strategies import error_line
from lightning_zerocopy.strategies.liveness import LAUNCHER_ENV, RankInfo, RankLiveness, process_alive

__all__ = [
    "launch_watch",
    "stop_watch",
    "trainer_interrupted",
    "watch_ranks",
]

_LAUNCH_WATCH: Optional[RankLiveness] = None


def launch_watch(
    rank: int, launched: Sequence[tuple[int, int]] = (), interval: float = 0.5, grace: float = 6.0
) -> Optional[RankLiveness]:
    """Start (once per process) the watch of the ranks this launch knows before the process group exists.

    Args:
        rank: this process's global rank.
        launched: ``(global rank, pid)`` of the ranks this process launched (Lightning's launcher: the machine's
            other local ranks). Empty in a launched rank, which watches its launcher instead, if its parent is the
            process named by :data:`LAUNCHER_ENV`.
        interval, grace: as for :class:`RankLiveness`.

    Returns:
        The watch (call :meth:`RankLiveness.watch` once the ranks have met), the one started earlier in this process,
        or ``None`` when there is nothing to watch. Call from the main thread.
    """
    global _LAUNCH_WATCH
    if _LAUNCH_WATCH is not None:
        return _LAUNCH_WATCH
    host = socket.gethostname()
    peers = [RankInfo(r, host, pid) for r, pid in launched]
    if not peers:
        launcher = os.environ.get(LAUNCHER_ENV, "")
        if not launcher.isdigit() or int(launcher) == os.getpid():
            return None
        pid = int(launcher)
        if pid != os.getppid() and process_alive(pid):
            return None  # the variable was inherited from a process that did not start this one
        # (a launcher that is gone already is watched too: the watch stops this rank at once)
        launcher_rank = rank - int(os.environ.get("LOCAL_RANK", "0") or 0)  # the launcher is local rank 0
        peers = [RankInfo(launcher_rank, host, pid)]
        error_line.take_up(pid)  # the launcher's claim of the job's one error line, while the launcher runs
    watch = RankLiveness(RankInfo.here(rank), peers, interval=interval, grace=grace, starting=True)
    watch.start()
    _LAUNCH_WATCH = watch
    return watch


def forget_launch_watch(watch: RankLiveness) -> None:
    """``watch`` (from :func:`launch_watch`) was stopped: a later stage of this process starts afresh."""
    global _LAUNCH_WATCH
    if _LAUNCH_WATCH is watch:
        _LAUNCH_WATCH = None


def watch_ranks(
    watch: Optional[RankLiveness], rank: int, world_size: int, interval: float, stopping: Callable[[], bool]
) -> RankLiveness:
    """Once the process group exists: every rank's :class:`RankInfo` exchanged, and the other ranks of this machine
    watched, by ``watch`` (the launch's, switched over to them) or by a new watch. The ranks of a machine claim the
    job's error line through the claim file of its lowest rank (:mod:`~lightning_zerocopy.strategies.error_line`),
    exchanged with them. A collective; call from the main thread.

    Args:
        watch: the watch :func:`launch_watch` started in this process, or ``None``.
        rank, world_size: this rank and the job's ranks (the default process group's).
        interval: seconds between polls.
        stopping: whether this rank is already stopping on an exception of its own (see :class:`RankLiveness`).
    """
    import torch.distributed as dist

    me = RankInfo.here(rank)
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, (me, error_line.share()))
    ranks = [info for info, _ in gathered]
    store = _default_store()
    keeper = next((ref for info, ref in gathered if info.host == me.host and ref is not None), None)
    error_line.join(keeper, store)
    if watch is None:
        watch = RankLiveness(me, ranks, interval=interval, store=store, stopping=stopping)
    else:
        watch.watch(ranks, store=store, stopping=stopping, me=me)
    watch.start()
    return watch


def stop_watch(watch: RankLiveness, exception: Optional[BaseException] = None) -> None:
    """Stop ``watch`` for good. On ``exception`` (this rank is failing): first leave its exit note, so the other
    ranks' errors name this rank's cause (or its interrupt); then stop; then explain the exception by the rank that
    went away when a collective's error names none."""
    if exception is not None:
        watch.announce(exception)
    watch.stop()
    forget_launch_watch(watch)
    if exception is not None:
        watch.explain(exception)


def trainer_interrupted(strategy: Any) -> bool:
    """Whether Lightning is handling an exception of the rank ``strategy`` runs (the trainer's status is
    ``INTERRUPTED``, set before any ``on_exception``): a ``stopping`` for :func:`watch_ranks`."""
    from pytorch_lightning.trainer.states import TrainerStatus

    module = strategy.lightning_module
    trainer = getattr(module, "_trainer", None) if module is not None else None
    return trainer is not None and trainer.state.status == TrainerStatus.INTERRUPTED


def _default_store() -> Any:
    """The default process group's key-value store, for the watch's exit notes (``None`` if unavailable)."""
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - a torch without it: the watch still names a gone rank, without its cause
        return None
