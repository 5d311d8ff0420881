"""A pre-empted run: SIGTERM saves the current step's state and ends the command with exit status 143.

Schedulers pre-empt or cancel a job with SIGTERM first (SLURM, Kubernetes), then SIGKILL after a grace period.
Lightning alone ends such a run with exit status 0 (its ``SIGTERMException`` is a ``SystemExit`` without a code), so a
scheduler records a pre-empted job as finished, and it saves nothing. The ``lightning-zerocopy`` command instead:

* installs :func:`handle_sigterm` for the whole run (:func:`install`), and :class:`PreemptionCheckpoint` on its trainer;
* on the first SIGTERM during ``fit``, lets the current training step finish, then every rank stops after the same
  step: one rank alone has Lightning's flag set (``trainer.received_sigterm``); with several ranks, the first that
  sees the signal posts a step to stop after in the process group's key-value store, which every rank reads at the
  end of each step (a rank that was not signalled, e.g. under Kubernetes, where only the first process is, stops
  there too). Lightning's own handler is replaced: it ran a broadcast inside the signal handler, which pairs with
  whatever collective another rank is in;
* saves the state after that step (weights, optimizer, loops, and the DataModule's position in the epoch) as the
  run's ``last.ckpt`` (written beside and renamed, so a kill during the write leaves the previous one intact), before
  the pipeline worker and the DataModule are released;
* exits with status 143 (128 + SIGTERM) after one line naming the checkpoint (:func:`report`); ``fit --ckpt_path
  last`` resumes the epoch where it stopped (every seed of it trained once, on any number of ranks).

A SIGTERM before training started, or a second one before the step ended, stops at once through the exception path
(the worker, shared memory and MPS daemon are released as on any error) without a checkpoint of the current step; one
that arrives while the run is already stopping is only noted, so the checkpoint and the clean-up finish. A SIGKILL
after the grace period leaves nothing either: shared segments and the MPS daemon have guardian processes, and the
worker exits when its trainer is gone.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Optional

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.utilities.exceptions import SIGTERMException
from typing_extensions import override

__all__ = [
    "PREEMPTED_EXIT",
    "PreemptedNow",
    "PreemptionCheckpoint",
    "PreemptionRecord",
    "handle_sigterm",
    "exit_if_preempted",
    "install",
    "is_preemption",
    "report",
    "skip_lightnings_step_broadcast",
]

#: The exit status of a run stopped by SIGTERM (128 + 15, as a shell reports a process that SIGTERM ended).
PREEMPTED_EXIT = 128 + int(signal.SIGTERM)
_STOP_KEY = "lightning_zerocopy/preemption/{run}/stop_after"


class PreemptedNow(SIGTERMException):
    """SIGTERM before training started, or a second one before the current step ended: the run stops at once."""


@dataclass
class PreemptionRecord:
    """What this process did about SIGTERM (read by :func:`report`).

    Attributes:
        signals: SIGTERMs received.
        stopping: the run is already stopping (a further SIGTERM is only noted).
        checkpoint: where the state of the last finished step was saved, if it was.
        step, epoch, batch: the global step, epoch and batch of the epoch it holds.
        failure: why saving it failed, if it did.
        rank: this process's global rank (only rank 0 reports).
    """

    signals: int = 0
    stopping: bool = False
    checkpoint: Optional[str] = None
    step: int = 0
    epoch: int = 0
    batch: int = 0
    failure: Optional[str] = None
    rank: int = 0


RECORD = PreemptionRecord()
_ACTIVE: Optional["PreemptionCheckpoint"] = None  # the callback of the fit that runs now


def install() -> None:
    """Handle SIGTERM with :func:`handle_sigterm` from now on (main thread only; the command calls it first)."""
    signal.signal(signal.SIGTERM, handle_sigterm)


def handle_sigterm(signum: int, frame: Any) -> None:
    """The first SIGTERM of a fit stops after the current step (:class:`PreemptionCheckpoint`); one before training,
    or a second one, raises :class:`PreemptedNow` here; one while the run is stopping is only noted."""
    RECORD.signals += 1
    if RECORD.stopping:
        print(f"[lightning-zerocopy] SIGTERM again (rank {RECORD.rank}): already stopping, finishing the checkpoint "
              "and the clean-up", file=sys.stderr, flush=True)  # fmt: skip
        return
    if RECORD.signals == 1 and _ACTIVE is not None and _ACTIVE.stop_after_this_step():
        return
    RECORD.stopping = True
    raise PreemptedNow(PREEMPTED_EXIT)


def is_preemption(exception: BaseException) -> bool:
    """Whether ``exception`` ended the run because of a SIGTERM: Lightning's ``SIGTERMException`` (raised on every rank
    after the agreed step), :class:`PreemptedNow`, or any failure that followed a SIGTERM this process received."""
    return isinstance(exception, SIGTERMException) or RECORD.signals > 0


def exit_if_preempted(exception: BaseException) -> None:
    """If SIGTERM ended the run (:func:`is_preemption`): print :func:`report` on global rank 0 and exit with
    :data:`PREEMPTED_EXIT`; else return."""
    if not is_preemption(exception):
        return
    RECORD.stopping = True
    if RECORD.rank == 0:
        sys.stderr.write(report() + "\n")
        sys.stderr.flush()
    raise SystemExit(PREEMPTED_EXIT) from None


def report() -> str:
    """The one line the command prints (global rank 0) before it exits with :data:`PREEMPTED_EXIT`."""
    if RECORD.checkpoint is not None:
        return (f"stopped by SIGTERM: the state after step {RECORD.step} (epoch {RECORD.epoch}, batch {RECORD.batch}) "
                f"is saved in {RECORD.checkpoint}; `fit --ckpt_path last` (same recipe) resumes there")  # fmt: skip
    if RECORD.failure is not None:
        return f"stopped by SIGTERM; saving the checkpoint of the current step failed: {RECORD.failure}"
    return ("stopped by SIGTERM before a training step finished: the current step is not saved "
            "(`fit --ckpt_path last` resumes from the last checkpoint written, if any)")  # fmt: skip


def skip_lightnings_step_broadcast(trainer: "pl.Trainer") -> None:
    """Under several ranks Lightning's training loop starts every step with ``_broadcast_sigterm_tensor``: a tensor made
    on the device, a broadcast from rank 0 and ``.item()``, i.e. a host-device synchronization every step, after
    which the host can no longer queue a step's kernels ahead of the GPU. While :func:`handle_sigterm` handles SIGTERM,
    :class:`PreemptionCheckpoint` already stops every rank after the same step through the process group's store and
    Lightning's flag is set by nothing else, so the step's broadcast is skipped; under any other handler it runs."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    lightnings = getattr(loop, "_broadcast_sigterm_tensor", None)
    if lightnings is None or getattr(lightnings, "_lzc_skips", False):
        return

    def broadcast_unless_ours() -> None:
        if signal.getsignal(signal.SIGTERM) is not handle_sigterm:
            lightnings()

    broadcast_unless_ours._lzc_skips = True  # type: ignore[attr-defined]
    loop._broadcast_sigterm_tensor = broadcast_unless_ours  # type: ignore[union-attr]


class PreemptionCheckpoint(Callback):
    """Saves the state after the last finished training step as ``last.ckpt`` when SIGTERM stops a fit.

    Added by the ``lightning-zerocopy`` command to every trainer it builds (first among the callbacks, so it saves
    before others release what the run holds). The checkpoint goes where ``--ckpt_path last`` looks: the
    ``dirpath`` of the first ``ModelCheckpoint(save_last=True)``, else ``<log_dir>/checkpoints``.
    """

    def __init__(self) -> None:
        self._trainer: Optional[pl.Trainer] = None
        self._pending = False  # this rank saw SIGTERM and has not posted a step to stop after yet
        self._ended = 0  # training steps ended in this fit (equal on every rank: they run in lockstep)
        self._stop_after: Optional[int] = None
        self._key: Optional[str] = None

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        global _ACTIVE
        self._trainer, self._pending, self._ended, self._stop_after = trainer, False, 0, None
        RECORD.rank = trainer.global_rank
        _ACTIVE = self if stage == "fit" else None
        self._key = _STOP_KEY.format(run=_next_run_id()) if stage == "fit" else None
        connector = trainer._signal_connector
        register = connector.register_signal_handlers
        if getattr(register, "_lzc_wrapped", False):
            return

        def register_then_ours() -> None:  # Lightning's own handler broadcasts inside the handler: keep ours
            previous = signal.getsignal(signal.SIGTERM)
            register()
            if callable(previous) and previous is handle_sigterm:
                signal.signal(signal.SIGTERM, handle_sigterm)

        register_then_ours._lzc_wrapped = True  # type: ignore[attr-defined]
        connector.register_signal_handlers = register_then_ours
        skip_lightnings_step_broadcast(trainer)

    def stop_after_this_step(self) -> bool:
        """Called by :func:`handle_sigterm` on the first SIGTERM: whether this fit stops after its current step."""
        trainer = self._trainer
        if trainer is None or trainer.sanity_checking or not trainer.training and not trainer.validating:
            return False
        if _world_size() > 1:
            self._pending = True  # posted at the end of this step (no store call inside a signal handler)
        else:
            trainer._signal_connector.received_sigterm = True  # Lightning's loops stop after the step
        return True

    @override
    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        self._ended += 1
        if self._key is None or _world_size() <= 1:
            return
        store = _default_store()
        if store is None:
            return
        if self._pending:  # the first poster wins; every rank is at most one step from this one
            self._pending = False
            self._stop_after = int(store.compare_set(self._key, "", str(self._ended + 1)).decode())
        elif self._stop_after is None and store.check([self._key]):
            self._stop_after = int(store.get(self._key).decode())
        if self._stop_after is not None and self._ended >= self._stop_after:
            trainer._signal_connector.received_sigterm = True  # every rank raises after this same step

    @override
    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        RECORD.stopping = True
        if isinstance(exception, PreemptedNow) or not isinstance(exception, SIGTERMException):
            return
        if trainer.state.fn != "fit" or trainer.sanity_checking or trainer.global_step == 0:
            return
        path = preemption_checkpoint_path(trainer)
        partial = f"{path}.tmp-{os.getpid()}"
        try:
            trainer.save_checkpoint(partial)  # every rank (a collective), rank 0 writes
            if trainer.is_global_zero:
                os.replace(partial, path)  # a kill during the write leaves the previous last.ckpt intact
        except Exception as exc:  # noqa: BLE001 - reported in the exit line; the clean-up must go on
            RECORD.failure = f"{path}: {exc}"
            if trainer.is_global_zero and os.path.exists(partial):
                os.unlink(partial)
            return
        loop = trainer.fit_loop.epoch_loop
        RECORD.checkpoint, RECORD.step = path, trainer.global_step
        RECORD.epoch, RECORD.batch = trainer.current_epoch, loop.batch_progress.current.completed

    @override
    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        self._trainer = None


def preemption_checkpoint_path(trainer: "pl.Trainer") -> str:
    """Where a pre-empted fit's ``last.ckpt`` goes: beside the first ``ModelCheckpoint(save_last=True)``'s files, else
    in ``<log_dir>/checkpoints`` (where ``--ckpt_path last`` looks too)."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.save_last and callback.dirpath:
            return os.path.join(callback.dirpath, f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}")
    folder = os.path.join(trainer.log_dir or trainer.default_root_dir, "checkpoints")
    if trainer.is_global_zero:
        os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, "last.ckpt")


_RUNS = [0]


def _next_run_id() -> int:
    _RUNS[0] += 1
    return _RUNS[0]


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _default_store() -> Any:
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store: every rank stops on its own signal only
        return None
