"""Running the one-model benchmarks (``python -m benchmarks.end_to_end.link``, ``python -m benchmarks.end_to_end.hetero``) from the tests,
as a user runs them: in a process of their own, from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
#: the one-model benchmarks: their ``python -m`` modules by name
ONE_MODEL = {"link": "benchmarks.end_to_end.link", "hetero": "benchmarks.end_to_end.hetero"}


def run_benchmark(module: str, *flags: str, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m module flags`` from the checkout; with ``check``, it must exit 0."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", module, *flags], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
