"""A profile of the pipeline worker's own GPU work, for finding where a batch's build time goes.

``LIGHTNING_ZEROCOPY_WORKER_PROFILE=<dir>[:<skip>[:<batches>]]`` in the trainer's environment (the worker inherits
it) makes the producer run :mod:`torch.profiler` over ``batches`` batches (default 40) after the first ``skip``
(default 200, past warm-up and allocator growth; a batch here is each time the producer builds), then write into
``dir``:

* ``worker_trace_<pid>.json``: the Chrome trace (every kernel, copy and CUDA runtime call of the process, each with
  its stream or thread), for ``chrome://tracing`` / Perfetto or :mod:`scripts.diagnostics.worker_trace_summary`;
* ``worker_ops_<pid>.txt``: the operators' table, sorted by their CUDA time.

The trainer checks the value before it starts a worker (:func:`profile_spec`), so a bad one fails by name. The e2e
benchmark profiles the trainer's steps the same way (``LIGHTNING_ZEROCOPY_TRAINER_PROFILE``,
``benchmarks/common/step_profile.py``), so the two traces of one window can be read side by side.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["PROFILE_ENV", "ProfileSpec", "WorkerProfile", "profile_spec"]

PROFILE_ENV = "LIGHTNING_ZEROCOPY_WORKER_PROFILE"


@dataclass(frozen=True)
class ProfileSpec:
    """Where to write the profile, how many batches to let pass first, and how many to profile."""

    directory: str
    skip: int = 200
    batches: int = 40


def profile_spec(env: str = PROFILE_ENV) -> Optional[ProfileSpec]:
    """The profile the variable ``env`` asks for (``None`` when unset).

    Raises:
        ValueError: a count is not a whole number (``skip`` >= 0, ``batches`` >= 1), or the directory cannot be made.
    """
    raw = os.environ.get(env, "").strip()
    if not raw:
        return None
    directory, *counts = raw.split(":")
    try:
        numbers = [int(c) for c in counts]
    except ValueError:
        numbers = [-1]
    if not directory or len(numbers) > 2 or (numbers and numbers[0] < 0) or (len(numbers) == 2 and numbers[1] < 1):
        raise ValueError(
            f"{env}={raw!r}: expected <dir>[:<skip>[:<batches>]], e.g. /tmp/prof:200:40 (skip >= 0 batches, "
            "then profile >= 1)"
        )
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{env}={raw!r}: cannot make the directory {directory!r}: {err}") from err
    return ProfileSpec(directory, *numbers)


class WorkerProfile:
    """Counts the producer's batches and runs the profiler over the window :func:`profile_spec` asks for (the
    profiler records the whole process's GPU work: the sampling thread's too); ``prefix`` starts the files' names.
    The files are written when the window ends, or with ``write_at_close`` by :meth:`close`: writing takes seconds
    (the operators' table of a 57k-event CPU profile: 2.6 s), which a trainer's timed steps would count; a worker
    writes at once, as the trainer gives it only seconds to exit."""

    def __init__(self, spec: Optional[ProfileSpec], prefix: str = "worker", write_at_close: bool = False) -> None:
        self._spec, self._prefix, self._write_at_close = spec, prefix, write_at_close
        self._seen = 0
        self._profiler: Optional[Any] = None
        self._stopped = False

    def before_batch(self) -> None:
        """Called before each batch the producer builds: starts the profiler before batch ``skip`` (counting from
        0) and stops it before batch ``skip + batches``."""
        spec = self._spec
        if spec is None:
            return
        if self._seen == spec.skip:
            import torch.profiler as tp

            self._profiler = tp.profile(activities=[tp.ProfilerActivity.CPU, tp.ProfilerActivity.CUDA])
            self._profiler.start()
        elif self._seen == spec.skip + spec.batches and self._profiler is not None:
            if self._write_at_close:
                self._profiler.stop()
                self._stopped = True
            else:
                self.close()
        self._seen += 1

    def close(self) -> None:
        """Stop a running profile and write its files (once)."""
        profiler, self._profiler = self._profiler, None
        if profiler is None or self._spec is None:
            return
        if not self._stopped:
            profiler.stop()
        pid = os.getpid()
        profiler.export_chrome_trace(os.path.join(self._spec.directory, f"{self._prefix}_trace_{pid}.json"))
        table = profiler.key_averages().table(sort_by="cuda_time_total", row_limit=40)
        with open(os.path.join(self._spec.directory, f"{self._prefix}_ops_{pid}.txt"), "w") as out:
            out.write(table)
        self._spec = None  # one window per process
