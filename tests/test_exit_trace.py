"""lightning_zerocopy.exit_trace: a process still stopping after the bound prints every thread's stack, once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_zerocopy.exit_trace import ENV

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = textwrap.dedent(
    """
    import time
    from lightning_zerocopy.exit_trace import trace_a_slow_exit

    def held_in_the_exception_path():
        time.sleep({sleep})

    print(trace_a_slow_exit(), trace_a_slow_exit(), flush=True)
    held_in_the_exception_path()
    """
)


def _run(value: str, sleep: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop(ENV, None)
    if value:
        env[ENV] = value
    return subprocess.run([sys.executable, "-c", _SCRIPT.format(sleep=sleep)], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_a_process_still_stopping_after_the_bound_prints_where_it_waits() -> None:
    done = _run("0.3", sleep=1.5)
    assert done.returncode == 0 and done.stdout.split() == ["True", "False"]  # armed once
    assert "most recent call first" in done.stderr and "held_in_the_exception_path" in done.stderr
    assert done.stderr.count("held_in_the_exception_path") == 1


def test_one_that_ends_in_time_prints_nothing() -> None:
    done = _run("5", sleep=0.0)
    assert done.returncode == 0 and done.stderr == ""


@pytest.mark.parametrize("value", ["", "soon", "0", "-1"])
def test_unset_or_not_a_positive_number_arms_nothing(value: str) -> None:
    done = _run(value, sleep=0.0)
    assert done.returncode == 0 and done.stdout.split() == ["False", "False"]
    assert done.stderr == ("" if not value else f"{ENV}={value!r} is not a positive number of seconds: no exit trace\n")
