"""When per-step training figures go to Lightning: on its logging steps and on an epoch's last batch, not every step.

A figure handed to ``self.log`` every step costs a host-device synchronization every step on a GPU: a Python
number becomes a tensor on the module's device (a blocking copy), and Lightning turns every progress-bar tensor
back into a number after each step (``.item()``). A step that synchronizes cannot be queued while the GPU still
runs the previous one. So :class:`~lightning_zerocopy.models.NodeClassifier` and
:class:`~lightning_zerocopy.callbacks.DataTelemetry` keep per-step figures where they are made (on the host, or
summed on the device without reading them back) and hand them over on the steps :func:`is_log_step` names, as CPU
tensors, which the progress bar reads without touching the GPU. Imports nothing of this package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_log_step"]


def is_log_step(trainer: Any) -> bool:
    """Whether the training step now running hands its figures over: a step whose figures Lightning sends to the
    loggers (every ``trainer.log_every_n_steps`` steps, or when the trainer stops) or an epoch's last batch (so
    the progress bar shows the epoch's last figures). Call it between ``on_train_batch_start`` and
    ``on_train_batch_end``; ``False`` without a trainer or with ``log_every_n_steps=0`` (except at an epoch's end).
    """
    if trainer is None:
        return False
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    if getattr(getattr(loop, "batch_progress", None), "is_last_batch", False):
        return True
    connector = getattr(trainer, "_logger_connector", None)
    try:  # Lightning's own rule for "this step's figures reach the logger" (it counts optimizer steps)
        return bool(connector.should_update_logs)
    except (AttributeError, NotImplementedError):
        every = int(getattr(trainer, "log_every_n_steps", 0) or 0)
        return every > 0 and (int(getattr(trainer, "global_step", 0)) + 1) % every == 0
