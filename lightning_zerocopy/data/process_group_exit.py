"""The default process group is destroyed before the interpreter's teardown, whatever the backend.

Lightning registers ``destroy_process_group`` to run at exit for an NCCL group only. A gloo group (CPU ranks) was
left to the interpreter's teardown, where its worker threads can be destroyed while still joinable, or while their
pending work still holds tensors that need the GIL: a finished 2-rank gloo fit printed ``Trainer.fit stopped`` and
then ``terminate called without an active exception`` (SIGABRT), now and then, on a loaded machine (PyTorch's own
tests destroy the group explicitly for the same reason: pytorch/pytorch#65513). :func:`destroy_process_group_at_exit`
registers the destruction with ``atexit`` (which runs while the interpreter is whole, after every exit path that
unwinds: a return, ``sys.exit``, a SIGTERM stop); destroying a gloo group is local to the process, so a rank that exits
first does not wait for the others. A run that failed (:func:`run_failed`: another rank died, an error) leaves the group
as before: a peer may still hold a collective of it open, and destroying it would wait for that collective.
"""

from __future__ import annotations

import atexit

__all__ = ["destroy_process_group_at_exit", "run_failed"]

_REGISTERED = [False]
_FAILED = [False]


def destroy_process_group_at_exit() -> None:
    """Once per process, when a default process group exists: destroy it at exit (see the module docstring)."""
    import torch.distributed as dist

    if _REGISTERED[0] or not (dist.is_available() and dist.is_initialized()):
        return
    atexit.register(_destroy)
    _REGISTERED[0] = True


def run_failed(exception: BaseException) -> None:
    """The run stops on ``exception``: unless it is the agreed SIGTERM stop (every rank after the same step, no
    collective open), the group is left as it is at exit."""
    if not any(c.__name__ == "SIGTERMException" for c in type(exception).__mro__):
        _FAILED[0] = True


def _destroy() -> None:
    import torch.distributed as dist

    if not _FAILED[0] and dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - at exit, with peers possibly gone: nothing left to report it to
            pass
