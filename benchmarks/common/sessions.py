"""Benchmark child runs in sessions of their own.

A run (an e2e row, a pipeline configuration, a scaling fit) starts its own processes: loader workers, a pipeline
worker, an MPS launcher, DDP ranks. Started with ``start_new_session=True`` the whole tree can be stopped on a
timeout with one signal to its process group; but then a signal to the benchmark's own group (``timeout`` around
it, Ctrl-C) no longer reaches the run, so :func:`forward_stop_signals` stops the tracked runs before exiting.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from typing import Any, Iterator, Optional

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


def run_script(script: str, flags: list[str], spec: Any, log_path: str, timeout: float, cwd: str,
               prefix: Optional[list[str]] = None) -> tuple[Any, Optional[str]]:  # fmt: skip
    """Run ``python script flags --_spec=<pickled spec> --_result=<json file>`` in a session of its own (behind
    ``prefix``, e.g. the MPS launcher), its output appended to ``log_path``; stopped whole after ``timeout`` seconds.

    Returns:
        the JSON the script wrote to its ``--_result`` file and None, or None and why there is none.
    """
    with tempfile.TemporaryDirectory(prefix="lzc-run-") as tmp:
        spec_path, result_path = os.path.join(tmp, "spec.pkl"), os.path.join(tmp, "result.json")
        with open(spec_path, "wb") as f:
            pickle.dump(spec, f)
        cmd = [*(prefix or []), sys.executable, os.path.abspath(script), *flags, f"--_spec={spec_path}", f"--_result={result_path}"]
        with open(log_path, "a") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)
            with tracked(proc):
                try:
                    code = proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    stop_session(proc, grace_s=15)
                    return None, f"timed out after {timeout:.0f} s; see {log_path}"
        if not os.path.exists(result_path):
            return None, f"exit {code} without a result; see {log_path}: {_tail(log_path)}"
        with open(result_path) as f:
            return json.load(f), None


def _tail(path: str, chars: int = 800) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-chars:].strip()
