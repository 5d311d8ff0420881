"""The default process group is destroyed before the interpreter's teardown, whatever the backend.

Lightning registers ``destroy_process_group`` to run at exit for an NCCL group only. A gloo group (CPU ranks) was
left to the interpreter's teardown, where its worker threads can be destroyed while still joinable, or while their
pending work still holds tensors that need the GIL: a finished 2-rank gloo fit printed ``Trainer.fit stopped`` and
then ``terminate called without an active exception`` (SIGABRT), now and then, on a loaded machine (PyTorch's own
tests destroy the group explicitly for the same reason: pytorch/pytorch#65513). :func:`destroy_process_group_at_exit`
registers the destruction with ``atexit`` (which runs while the interpreter is whole, after every exit path that
unwinds: a return, ``sys.exit``, a SIGTERM stop); destroying a gloo group is local to the process, so a rank that exits
first does not wait for the others. The group of a run that failed (:func:`run_failed`: another rank died, an error)
is not destroyed: a peer may still hold a collective of it open, and destroying it would wait for that collective.

A failed run's NCCL group is aborted instead, at once (:func:`abort_collectives`): a collective that one rank launched
and a peer never will (the job's Ctrl-C reaches the ranks a step apart; a peer failed before its all-reduce) leaves a
kernel on this rank's GPU that never ends, and every device-wide wait after it (the DataModule's release of its
pinned host memory, a CUDA context's teardown, Lightning's own exit-time ``destroy_process_group``) waits for ever
(2 x H200, 2026-11-30: ``ctrl_c`` held rank 0 in ``torch.cuda.synchronize`` and rank 1 in ``destroy_process_group``
one time in six). Aborting ends those kernels; the group is gone after it, so nothing destroys it again.
"""

from __future__ import annotations

import atexit
import sys
import threading

__all__ = ["abort_collectives", "destroy_process_group_at_exit", "run_failed"]

_REGISTERED = [False]
_FAILED = [False]
_ABORT_LOCK = threading.Lock()


def destroy_process_group_at_exit() -> None:
    """Once per process, when a default process group exists: destroy it at exit (see the module docstring)."""
    import torch.distributed as dist

    if _REGISTERED[0] or not (dist.is_available() and dist.is_initialized()):
        return
    atexit.register(_destroy)
    _REGISTERED[0] = True


def run_failed(exception: BaseException) -> None:
    """The run stops on ``exception``: unless it is the agreed SIGTERM stop (every rank after the same step, no
    collective open), the group is left as it is at exit, and an NCCL group is aborted now
    (:func:`abort_collectives`). Call it first on an exception path, before anything waits for the GPU."""
    if not any(c.__name__ == "SIGTERMException" for c in type(exception).__mro__):
        _FAILED[0] = True
        abort_collectives()


def abort_collectives() -> bool:
    """Abort the default process group if it runs on NCCL: its communicators stop, a collective kernel that waits for
    a peer returns, and every host wait on this GPU behind it ends. The group is gone afterwards (``dist`` reads
    uninitialised). Safe from any thread, once: a second call, while the first still aborts, waits for it. Whether
    this call aborted the group; a gloo group (CPU ranks, nothing queued on a GPU) is left alone.

    A failed run's own exception path calls it (:func:`run_failed`), and so does the watch of a rank whose peer
    stopped (:mod:`~lightning_zerocopy.strategies.liveness`), from its thread, while the main thread may be held in
    such a wait where no Python signal handler runs."""
    import torch.distributed as dist

    with _ABORT_LOCK:
        if not (dist.is_available() and dist.is_initialized()) or "nccl" not in str(dist.get_backend()).lower():
            return False
        try:
            dist.distributed_c10d._abort_process_group()
        except Exception as error:  # noqa: BLE001 - on a failing run's way out: say it, let the exit go on
            sys.stderr.write(f"lightning_zerocopy: could not abort the NCCL process group: {error}\n")
            return False
        return True


def _destroy() -> None:
    import torch.distributed as dist

    if not _FAILED[0] and dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - at exit, with peers possibly gone: nothing left to report it to
            pass
