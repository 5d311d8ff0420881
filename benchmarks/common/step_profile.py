"""A profile of a benchmark row's training steps, the trainer's twin of ``LIGHTNING_ZEROCOPY_WORKER_PROFILE``.

``LIGHTNING_ZEROCOPY_TRAINER_PROFILE=<dir>[:<skip>[:<steps>]]`` makes every row of ``benchmarks.end_to_end`` run
:mod:`torch.profiler` over ``steps`` training steps (default 40) after the first ``skip`` (default 200) and write
``trainer_<row>-<model>_trace_<pid>.json`` and ``..._ops_<pid>.txt`` into ``dir``: every kernel of the step with its
stream, for comparing one kernel's time in ``model_only`` with its time beside the worker. With the worker's variable
set to the same window, the row's two traces cover nearly the same batches (the producer builds ahead by the
pipeline's depth). ``scripts/diagnostics/worker_trace_summary.py`` reads either trace.
"""

from __future__ import annotations

from typing import Any

from pytorch_lightning.callbacks import Callback

from lightning_zerocopy.pipeline.worker_profile import ProfileSpec, WorkerProfile, profile_spec

__all__ = ["TRAINER_PROFILE_ENV", "StepProfile", "step_profile_callbacks"]

TRAINER_PROFILE_ENV = "LIGHTNING_ZEROCOPY_TRAINER_PROFILE"


class StepProfile(Callback):
    """Profiles training steps ``skip`` .. ``skip + steps - 1`` (counted from 0) of one run; ``name`` goes into the
    files' names."""

    def __init__(self, spec: ProfileSpec, name: str) -> None:
        self._profile = WorkerProfile(spec, prefix=f"trainer_{name}")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._profile.before_batch()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._profile.close()  # a run shorter than the window still writes what it profiled


def step_profile_callbacks(name: str) -> list[Callback]:
    """``[StepProfile]`` when :data:`TRAINER_PROFILE_ENV` is set, else ``[]``.

    Raises:
        ValueError: a bad value, named (:func:`~lightning_zerocopy.pipeline.worker_profile.profile_spec`).
    """
    spec = profile_spec(TRAINER_PROFILE_ENV)
    return [] if spec is None else [StepProfile(spec, name)]
