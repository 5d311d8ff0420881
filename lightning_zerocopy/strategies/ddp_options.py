"""The ``DistributedDataParallel`` options :class:`~lightning_zerocopy.strategies.ZeroCopyDDPStrategy` sets by default.

* ``gradient_as_bucket_view=True``: each parameter's gradient is a view of its all-reduce bucket, so DDP does not copy
  the reduced bucket back into the gradients after every step (one copy kernel per parameter less, and the
  gradients' memory once instead of twice). The one thing it forbids, ``param.grad.detach_()``, raises.
* ``static_graph``, chosen by :func:`choose_static_graph` when left at ``"auto"``: on when every step uses every
  parameter, which DDP already demands while ``find_unused_parameters`` is off (a step that leaves one unused raises
  at the next step), and with automatic optimization (one forward and one backward per step). DDP then takes the
  first step's used set and hook counts as fixed: it delays that step's all-reduce to the end of its backward and
  skips the unused-parameter search afterwards (a search that runs only with ``find_unused_parameters``, so with it
  off the per-step saving is small; torch's docs name reentrant backward and activation checkpointing as what it
  adds). Off with ``find_unused_parameters=True`` (the used set may change from step to step), under manual
  optimization (several backward passes in a step) and with gradient accumulation (``accumulate_grad_batches > 1`` or
  a ``GradientAccumulationScheduler``: Lightning runs those steps under DDP's ``no_sync``, and torch 2.11's reducer
  then fails an internal assertion under ``static_graph``). A step whose used parameters differ from the first
  step's raises in DDP (``Your training graph has changed in this iteration`` or ``Expected to have finished
  reduction in the prior iteration``) on the next step, never silently (checked on two gloo ranks for a parameter
  used late, used early and used on one rank only); :func:`explain_graph_change` rewrites that error into one line
  naming the setting to change.

Their effect on a rank's step time is what ``python -m benchmarks.scaling.confirm`` measures (``2gpu`` against
``2gpu-torch``); the diagnostic call's 1.30x for both was run-to-run drift (docs/scaling/h200x2-diag-2026-11-28).
"""

from __future__ import annotations

import re
from typing import Any, Literal, NamedTuple, Union

__all__ = ["StaticGraph", "StaticGraphChoice", "accumulates_gradients", "choose_static_graph", "explain_graph_change"]

#: ``static_graph``'s values: on, off, or decided per model (:func:`choose_static_graph`)
StaticGraph = Union[bool, Literal["auto"]]

_GRAPH_CHANGED = re.compile(r"Your training graph has changed in this iteration|Expected to have finished reduction in "
                            r"the prior iteration", re.DOTALL)  # fmt: skip


class StaticGraphChoice(NamedTuple):
    """Whether DDP runs with ``static_graph`` and why (the reason is logged and named in errors)."""

    on: bool
    reason: str


def choose_static_graph(setting: StaticGraph, find_unused_parameters: bool, automatic_optimization: bool,
                        accumulates: bool = False) -> StaticGraphChoice:  # fmt: skip
    """DDP's ``static_graph`` for a module (see the module docstring).

    Args:
        setting: the strategy's ``static_graph`` (``True``/``False`` are kept as given).
        find_unused_parameters: the strategy's ``find_unused_parameters``.
        automatic_optimization: the LightningModule's ``automatic_optimization``.
        accumulates: the trainer accumulates gradients over several batches (any epoch).

    Raises:
        ValueError: ``setting`` is neither a bool nor ``"auto"``.
    """
    if isinstance(setting, bool):
        return StaticGraphChoice(setting, "static_graph set to " + ("true" if setting else "false"))
    if setting != "auto":
        raise ValueError(f"static_graph must be true, false or 'auto', got {setting!r}")
    if find_unused_parameters:
        return StaticGraphChoice(False, "auto: off, find_unused_parameters is on (the used parameters may change)")
    if not automatic_optimization:
        return StaticGraphChoice(False, "auto: off, the module optimizes manually (a step may run several backwards)")
    if accumulates:
        return StaticGraphChoice(False, "auto: off, the trainer accumulates gradients (DDP's no_sync)")
    return StaticGraphChoice(True, "auto: on, find_unused_parameters is off, so every step uses every parameter")


def accumulates_gradients(trainer: Any) -> bool:
    """Whether ``trainer`` (``None``: no trainer) accumulates gradients over batches in some epoch: its
    ``accumulate_grad_batches`` above 1, or a ``GradientAccumulationScheduler`` among its callbacks."""
    if trainer is None:
        return False
    if int(getattr(trainer, "accumulate_grad_batches", 1) or 1) > 1:
        return True
    from pytorch_lightning.callbacks import GradientAccumulationScheduler

    return any(isinstance(c, GradientAccumulationScheduler) for c in getattr(trainer, "callbacks", None) or [])


def explain_graph_change(exception: BaseException, choice: StaticGraphChoice) -> bool:
    """Rewrite DDP's error for a step whose used parameters differ from the first step's, under ``static_graph``,
    into one line naming the settings to change (in place). Returns whether it did."""
    if not choice.on:
        return False
    args = list(exception.args)
    for i, arg in enumerate(args):
        if isinstance(arg, str) and _GRAPH_CHANGED.search(arg):
            args[i] = (
                "a training step used other parameters than the first step did (a parameter left unused, or used "
                f"only from some step on), which DDP's static_graph does not allow ({choice.reason}): set "
                "trainer.strategy.init_args.find_unused_parameters=true if the used parameters change from step to "
                "step (static_graph 'auto' then turns off), or trainer.strategy.init_args.static_graph=false"
            )
            exception.args = tuple(args)
            return True
    return False
