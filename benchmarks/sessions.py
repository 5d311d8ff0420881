"""Benchmark child runs in sessions of their own.

A run (an e2e row, a pipeline configuration, a scaling fit) starts its own processes: loader workers, a pipeline
worker, an MPS launcher, DDP ranks. Started with ``start_new_session=True`` the whole tree can be stopped on a
timeout with one signal to its process group; but then a signal to the benchmark's own group (``timeout`` around
it, Ctrl-C) no longer reaches the run, so :func:`forward_stop_signals` stops the tracked runs before exiting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any, Iterator

#: Runs started in their own session and not finished yet.
_RUNNING: set[subprocess.Popen] = set()


def stop_session(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to ``proc``'s session (the process and everything it started), then SIGKILL after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace_s)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


@contextlib.contextmanager
def tracked(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """While the block runs, a stop signal to this process also stops ``proc``'s session."""
    _RUNNING.add(proc)
    try:
        yield proc
    finally:
        _RUNNING.discard(proc)


def _stop_running_and_exit(signum: int, frame: Any) -> None:
    for proc in list(_RUNNING):
        stop_session(proc)
    raise SystemExit(128 + signum)


def forward_stop_signals() -> dict[int, Any]:
    """On SIGTERM/SIGINT, stop the tracked runs' sessions, then exit (``SystemExit``, so ``finally`` blocks still
    write what finished). Returns the previous handlers (for :func:`restore_signals`); none are set when called
    from a thread other than the main one."""
    previous: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous[sig] = signal.signal(sig, _stop_running_and_exit)
        except ValueError:  # not the main thread
            pass
    return previous


def restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
