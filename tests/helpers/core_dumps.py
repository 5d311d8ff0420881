"""A child process that writes a long core dump when it aborts, for the watchers that must not wait for one.

A CUDA process holds gigabytes of mapped memory; after a SIGABRT the kernel writes all of it to a core file before
the process ends, where core files are allowed (a 6 GB process took 37 s on the CPU machine). Here a child touches
``gib`` GiB of anonymous memory and allows core files, so its SIGABRT takes seconds to end. (The H200 job that stayed
alive after ``kill -ABRT`` was not dumping: a native handler there caught the signal; see ``tests/test_faults_gpu.py``.)
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path
from typing import Optional

#: The child prints this once its memory is touched.
READY = "touched"


def core_dumps_unavailable() -> Optional[str]:
    """Why a core dump cannot be written to a file in the child's folder here (a reason to skip), or ``None``."""
    try:
        pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    except OSError:
        return "no /proc/sys/kernel/core_pattern"
    if pattern.startswith("|") or "/" in pattern:
        return f"core dumps go to {pattern!r}, not to a file in the process's folder"
    if resource.getrlimit(resource.RLIMIT_CORE)[1] == 0:
        return "the hard core-size limit is 0"
    return None


def _allow_cores() -> None:
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def start_heavy_child(folder: Path, gib: float, code: str = "import time; time.sleep(120)") -> subprocess.Popen:
    """A Python child in ``folder`` (its core file lands there) holding ``gib`` GiB, then running ``code``; returns
    once the memory is touched (the child printed :data:`READY` first)."""
    touch = (f"block = bytearray({int(gib * 2**30)}); block[::4096] = b'x' * len(block[::4096]); "
             f"print({READY!r}, flush=True); ")  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", touch + code], cwd=folder, stdout=subprocess.PIPE, text=True,
                             preexec_fn=_allow_cores)  # fmt: skip
    assert child.stdout is not None and child.stdout.readline().strip() == READY
    return child


def remove_cores(folder: Path) -> None:
    for core in folder.glob("core*"):
        core.unlink(missing_ok=True)
