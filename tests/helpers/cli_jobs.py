"""A ``python -m lightning_zerocopy`` command a test starts as a job of its own: its environment, the wait for a
marker file it writes (``helpers.cli_markers``) and its end."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional, Union

import pytest

from helpers import free_port

__all__ = ["RANK_VARIABLES", "command_env", "finish", "wait_for_file"]

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
#: The variables a rank or a launcher sets, which the command must not inherit from the test's own environment.
RANK_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "LZC_LAUNCHER_PID")


def command_env(cache: Union[str, Path, None] = None, markers: Optional[Path] = None, *, without_mps: bool = False,
                **extra: str) -> dict[str, str]:  # fmt: skip
    """The test's environment for the command: unbuffered, a free rendezvous port on 127.0.0.1, the repository and
    ``tests/`` on ``PYTHONPATH``, none of :data:`RANK_VARIABLES`; the dataset cache in ``cache`` and the markers of
    ``helpers.cli_markers`` in ``markers`` where given; ``without_mps`` leaves out the MPS variables (``CUDA_MPS_*``,
    ``LZC_MPS*``); ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if not (without_mps and k.startswith(("CUDA_MPS_", "LZC_MPS")))}
    for key in RANK_VARIABLES:
        env.pop(key, None)
    env.update(PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    if cache is not None:
        env["LIGHTNING_ZEROCOPY_CACHE"] = str(cache)
    if markers is not None:
        env["LZC_TEST_MARKERS"] = str(markers)
    env.update(extra)
    return env


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Wait for ``path`` to exist; fail the test with the command's output if ``proc`` ends first, or after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"the command ended before {path.name}: {proc.communicate()[0][-4000:]}")
        assert time.monotonic() < deadline, f"no {path.name} within {timeout} s"
        time.sleep(0.05)


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """The output of ``proc`` (started with ``start_new_session=True``) once it ends; its whole process group is
    killed if it still runs after ``timeout`` seconds (``subprocess.TimeoutExpired`` then fails the test)."""
    try:
        return proc.communicate(timeout=timeout)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
