"""benchmarks/common/sessions.py: a run started in its own session is stopped whole (with what it started), on a timeout
and when the benchmark itself is told to stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from benchmarks.common.sessions import stop_session

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# A run that starts a grandchild (as a row starts loader workers), prints its pid, and waits.
_RUN = "import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); print(g.pid, flush=True); time.sleep(120)"  # noqa: E501


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_stop_session_stops_the_run_and_what_it_started() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _RUN], stdout=subprocess.PIPE, text=True, start_new_session=True)
    grandchild = int(proc.stdout.readline())
    stop_session(proc, grace_s=5)
    assert proc.poll() is not None
    assert _gone(grandchild), "the run's own child outlived stop_session"


def test_a_stop_signal_to_the_benchmark_stops_its_tracked_run() -> None:
    bench = textwrap.dedent(f"""
        import subprocess, sys
        sys.path.insert(0, {REPO_ROOT!r})
        from benchmarks.common.sessions import forward_stop_signals, tracked
        forward_stop_signals()
        proc = subprocess.Popen([sys.executable, "-c", {_RUN!r}], stdout=subprocess.PIPE, text=True, start_new_session=True)
        with tracked(proc):
            print(proc.pid, proc.stdout.readline().strip(), flush=True)
            proc.wait()
    """)
    outer = subprocess.Popen([sys.executable, "-c", bench], stdout=subprocess.PIPE, text=True)
    run_pid, grandchild = map(int, outer.stdout.readline().split())
    outer.send_signal(signal.SIGTERM)
    assert outer.wait(timeout=30) == 128 + signal.SIGTERM
    assert _gone(run_pid) and _gone(grandchild), "the run's session outlived the benchmark"
