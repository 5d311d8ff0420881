"""A profile of a benchmark row's training steps, the trainer's twin of ``LIGHTNING_ZEROCOPY_WORKER_PROFILE``.

``LIGHTNING_ZEROCOPY_TRAINER_PROFILE=<dir>[:<skip>[:<steps>]]`` makes every row of ``benchmarks.end_to_end`` run
:mod:`torch.profiler` over ``steps`` training steps (default 40) after the first ``skip`` (default 200) and write
``trainer_<row>-<model>_trace_<pid>.json`` and ``..._ops_<pid>.txt`` into ``dir``: every kernel of the step with its
stream, for comparing one kernel's time in ``model_only`` with its time beside the worker. With the worker's variable
set to the same window, the row's two traces cover nearly the same batches (the producer builds ahead by the
pipeline's depth), and :func:`route_worker_profile` puts each row's worker traces in a folder named after the row.
``scripts/diagnostics/worker_trace_summary.py`` reads either trace.
"""

from __future__ import annotations

import os
from typing import Any

from pytorch_lightning.callbacks import Callback

from lightning_zerocopy.pipeline.worker_profile import PROFILE_ENV, ProfileSpec, WorkerProfile, profile_spec

__all__ = ["TRAINER_PROFILE_ENV", "StepProfile", "check_profile_variables", "route_worker_profile",
           "step_profile_callbacks"]  # fmt: skip

TRAINER_PROFILE_ENV = "LIGHTNING_ZEROCOPY_TRAINER_PROFILE"


class StepProfile(Callback):
    """Profiles training steps ``skip`` .. ``skip + steps - 1`` (counted from 0) of one run; ``name`` goes into the
    files' names."""

    def __init__(self, spec: ProfileSpec, name: str) -> None:
        self._profile = WorkerProfile(spec, prefix=f"trainer_{name}", write_at_close=True)  # outside the timed steps

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._profile.before_batch()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._profile.close()  # writes the files (also of a run shorter than the window)


def step_profile_callbacks(name: str) -> list[Callback]:
    """``[StepProfile]`` when :data:`TRAINER_PROFILE_ENV` is set, else ``[]``.

    Raises:
        ValueError: a bad value, named (:func:`~lightning_zerocopy.pipeline.worker_profile.profile_spec`).
    """
    spec = profile_spec(TRAINER_PROFILE_ENV)
    return [] if spec is None else [StepProfile(spec, name)]


def check_profile_variables() -> None:
    """Raise ``ValueError`` naming ``LIGHTNING_ZEROCOPY_TRAINER_PROFILE`` or ``LIGHTNING_ZEROCOPY_WORKER_PROFILE`` if
    either holds a bad value."""
    profile_spec(TRAINER_PROFILE_ENV)
    profile_spec(PROFILE_ENV)


def route_worker_profile(row: str) -> None:
    """In a row's own process, before its worker starts: point ``LIGHTNING_ZEROCOPY_WORKER_PROFILE`` (if set) at
    ``<dir>/<row>``, so the worker traces of several rows written into one folder say whose they are.

    Raises:
        ValueError: a bad value, named.
    """
    spec = profile_spec(PROFILE_ENV)
    if spec is not None:
        os.environ[PROFILE_ENV] = f"{os.path.join(spec.directory, row)}:{spec.skip}:{spec.batches}"
