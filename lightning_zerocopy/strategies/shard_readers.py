"""A rank that stops on an error keeps its cache shards until the ranks that read them have stopped reading.

Under a ``clique`` cache every rank of a GPU group reads the others' shards over CUDA IPC, in its training steps and
in its pipeline worker. A shard's memory is freed when the process that owns it ends, and CUDA leaves an importer's
reads of freed IPC memory undefined: a kernel of a peer that is still gathering meets an illegal address, which
breaks that peer's CUDA context (2 x H200, 2026-11-29: ``kill_worker1``; rank 1 stopped on its worker's death,
rank 0's worker was still gathering from rank 1's shard when rank 1 exited).

So the readers stop first. A rank whose watch reads the exit note of a rank whose shards it reads kills its
pipeline workers at once (:meth:`~lightning_zerocopy.strategies.liveness.RankLiveness.depend_on`): its main thread
may be held in a CUDA wait behind a collective the stopping rank never joins, and its worker outlived a 5 s wait
(``close()`` gives a worker 5 + 2 s before it kills it). Once they have ended, the watch says so for its rank where
they did all its reads (:func:`stop_workers_reading`): the held main thread would never say it. And a rank that
stops on an exception, once its own reads have ended (its workers closed by the callbacks' ``on_exception``, which
Lightning calls before the strategy's; its current stream drained), says so in the process group's store
(:func:`stop_reading`), then waits until every rank whose shards it reads has said the same or is gone, for at most
``timeout`` seconds (:func:`wait_for_readers`).
Cliques are symmetric (the ranks a rank reads read it), so the ranks it reads are the ones it waits for, and two
ranks stopping together each find the other's word at once. A rank killed outright (SIGKILL) cannot wait: its
peers stop themselves the moment it exits (:meth:`~lightning_zerocopy.strategies.liveness.RankLiveness.depend_on`).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Optional, Protocol, Sequence

__all__ = [
    "DONE_KEY", "Reader", "kill_pipeline_workers", "stop_reading", "stop_workers_reading", "stream_drained",
    "wait_for_readers",
]


class Reader(Protocol):
    """A rank that may read this rank's shards, as the watch knows it (a
    :class:`~lightning_zerocopy.strategies.liveness.RankInfo`)."""

    @property
    def rank(self) -> int: ...

    @property
    def pid(self) -> int: ...


#: seconds a rank's watch waits for its killed pipeline workers to end before it says it reads no peer shard
WORKERS_END_S = 3.0

#: set by a rank once neither it nor its pipeline workers read other ranks' GPU memory any more
DONE_KEY = "lightning_zerocopy/liveness/reads_done/{rank}"


def stop_reading(store: Any, rank: int, kernels_done: Optional[Callable[[], bool]] = None) -> bool:
    """Say in ``store`` that ``rank`` reads no peer's GPU memory any more, once ``kernels_done`` (e.g.
    :func:`stream_drained`) says its queued kernels have ended. Returns whether it said so: not while kernels may
    still read (the readers' wait then runs out instead). A broken CUDA context (the check raises: nothing runs any
    more) or a store gone with its host rank is not an error here: the rank is stopping already."""
    if kernels_done is not None:
        try:
            if not kernels_done():
                return False
        except Exception:  # noqa: BLE001 - a broken context runs no kernel
            pass
    if store is None:
        return False
    try:
        store.set(DONE_KEY.format(rank=rank), "1")
    except Exception:  # noqa: BLE001
        return False
    return True


def kill_pipeline_workers(wait_s: float = 0.0) -> bool:
    """SIGKILL this process's pipeline workers (their GPU work ends with them) and wait up to ``wait_s`` seconds for
    them to end; whether every one has (true where it never imported them: it has none)."""
    workers = sys.modules.get("lightning_zerocopy.pipeline.worker")
    return workers is None or bool(workers.kill_workers(wait_s))


def stop_workers_reading(store: Any, rank: int, wait_s: float = WORKERS_END_S) -> bool:
    """For a rank whose watch read the exit note of a rank whose shards it reads, while its main thread may be held
    in a CUDA wait behind a collective the stopping rank never joins (2 x H200, 2026-11-29, ``kill_worker1``: rank 0
    never reached its own :func:`stop_reading`, so rank 1 waited out its 5 s). SIGKILL this process's pipeline
    workers and wait up to ``wait_s`` seconds for them to end; then, where this process has no cache open itself
    (its workers did all its shard reads), say in ``store`` that ``rank`` reads no peer memory any more. Returns
    whether it said so."""
    if not kill_pipeline_workers(wait_s):
        return False
    caches = sys.modules.get("lightning_zerocopy.cache.sharded_provider")
    if caches is not None and caches.caches_open_here():
        return False  # this process's own kernels may still read: its exception path says so once they have ended
    return stop_reading(store, rank)


def stream_drained(device: Any, timeout: float = 1.0, poll: float = 0.005) -> bool:
    """Whether the work queued so far on ``device``'s current stream ends within ``timeout`` seconds, polled without
    blocking: behind a collective that a stopping peer never joins, the stream never drains, and a blocking
    synchronize would hold this rank's exception path for good."""
    import torch

    marker = torch.cuda.Event()
    marker.record(torch.cuda.current_stream(device))
    deadline = time.monotonic() + timeout
    while not marker.query():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True


def wait_for_readers(
    store: Any,
    readers: Sequence[Reader],
    alive: Callable[[int], bool],
    timeout: float,
    poll: float = 0.02,
) -> list[Reader]:
    """Wait until every rank of ``readers`` has said it stopped reading (:func:`stop_reading`) or is gone, at most
    ``timeout`` seconds. Returns the readers still reading at the deadline (empty when all stopped in time). Without
    a store only the readers' exits are seen."""
    deadline = time.monotonic() + timeout
    while True:
        reading = [r for r in readers if alive(r.pid) and not _said_done(store, r.rank)]
        if not reading or time.monotonic() >= deadline:
            return reading
        time.sleep(poll)


def _said_done(store: Any, rank: int) -> bool:
    if store is None:
        return False
    try:
        return bool(store.check([DONE_KEY.format(rank=rank)]))
    except Exception:  # noqa: BLE001 - the store went with its host rank: only exits tell from now on
        return False
