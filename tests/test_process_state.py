"""Whether a process runs: gone, zombie, and dying while it writes its core dump."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.core_dumps import core_dumps_unavailable, remove_cores, start_heavy_child
from helpers.slow_exit import exit_slowly, slow_exit_unavailable
from lightning_zerocopy import process_state
from lightning_zerocopy.process_state import PF_EXITING, exit_signal, process_alive, process_dying, process_ended


def test_a_running_process_is_alive_and_an_unreaped_exited_one_is_not() -> None:
    assert process_alive(os.getpid()) and not process_dying(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child.pid}").exists() and process_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process_alive(child.pid)  # a zombie until waited for
    child.wait()
    assert not process_alive(child.pid) and not process_dying(child.pid)


def test_a_process_has_ended_only_once_nothing_of_it_runs() -> None:
    """An exiting process (its main thread gone, the rest still closing) has not ended: its CUDA context may still
    read another process's memory. A zombie has."""
    reason = slow_exit_unavailable()
    if reason:
        pytest.skip(reason)
    import multiprocessing

    assert not process_ended(os.getpid())
    child = multiprocessing.get_context("fork").Process(target=exit_slowly, args=(1.5,))
    child.start()
    try:
        deadline = time.monotonic() + 30
        while not process_dying(child.pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert process_dying(child.pid) and not process_ended(child.pid)
        while not process_ended(child.pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert process_ended(child.pid) and Path(f"/proc/{child.pid}").exists()  # a zombie: ended, not reaped
    finally:
        child.kill()
        child.join()
    assert child.exitcode == -signal.SIGKILL and process_ended(child.pid)


@pytest.mark.parametrize(("state", "flags", "status", "signal_number"), [
    ("R", PF_EXITING, signal.SIGKILL, signal.SIGKILL),  # killed, its exit still running
    ("D", PF_EXITING, signal.SIGABRT | 0x80, signal.SIGABRT),  # the core flag set
    ("R", PF_EXITING, 3 << 8, None),  # an exit code: known once it has ended
    ("R", 0, signal.SIGKILL, None),  # not exiting
    ("Z", 0, signal.SIGTERM, signal.SIGTERM),  # a zombie
])
def test_the_signal_ending_an_exiting_process_is_read_before_it_ends(monkeypatch, state, flags, status,
                                                                      signal_number) -> None:  # fmt: skip
    fields = [state, *["0"] * 5, str(flags), *["0"] * 42, str(status), "0"]  # index 6: flags, 49: exit_code
    monkeypatch.setattr(process_state, "_stat", lambda pid, task="": fields)
    assert exit_signal(4242) == signal_number


def test_a_process_writing_its_core_dump_names_its_signal_before_it_ends(tmp_path: Path) -> None:
    reason = core_dumps_unavailable()
    if reason:
        pytest.skip(reason)
    child = start_heavy_child(tmp_path, gib=1.5)
    try:
        assert exit_signal(child.pid) is None
        child.send_signal(signal.SIGABRT)
        seen: set[object] = set()
        while child.poll() is None:
            seen.add(exit_signal(child.pid))
            time.sleep(0.005)
        assert signal.SIGABRT in seen, seen
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        remove_cores(tmp_path)


def test_a_process_writing_its_core_dump_is_dying_before_it_ends(tmp_path: Path) -> None:
    """Before, a watcher saw such a process as alive until the whole core was written."""
    reason = core_dumps_unavailable()
    if reason:
        pytest.skip(reason)
    child = start_heavy_child(tmp_path, gib=1.5)
    try:
        assert process_alive(child.pid)
        start = time.monotonic()
        child.send_signal(signal.SIGABRT)
        seen_dying_while_there = False
        while child.poll() is None:
            if not process_alive(child.pid) and Path(f"/proc/{child.pid}").exists():
                seen_dying_while_there = True
            time.sleep(0.005)
        took = time.monotonic() - start
        if not seen_dying_while_there and took < 0.5:
            pytest.skip(f"the core dump took only {took:.2f} s: too short to observe")
        assert seen_dying_while_there, f"alive during its whole {took:.1f} s core dump"
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        remove_cores(tmp_path)
