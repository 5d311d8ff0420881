"""What a benchmark ran on: GPU, CPU, memory, disk, package versions, our commit (no CUDA initialization)."""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess
from importlib import metadata
from typing import Any, Optional

__all__ = ["cpu_model", "machine_info"]


def _run(cmd: list[str], cwd: Optional[str] = None) -> Optional[str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> Optional[float]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def machine_info(repo_root: str, cache_dir: Optional[str], commit: Optional[str] = None) -> dict[str, Any]:
    """A dict for the report's header; fields that cannot be read here are None.

    ``commit``: what the tree is, where it is no git checkout (a device copy); else ``git rev-parse HEAD``,
    marked ``+dirty`` when tracked files differ from it.
    """
    dirty = None
    if commit is None:
        commit = _run(["git", "rev-parse", "HEAD"], cwd=repo_root)
        dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo_root)
    disk_path = cache_dir or os.environ.get("LIGHTNING_ZEROCOPY_CACHE") or os.path.expanduser("~")
    while not os.path.exists(disk_path):
        disk_path = os.path.dirname(disk_path) or "/"
    disk = shutil.disk_usage(disk_path)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "gpu": _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "disk_free_gib": disk.free / 2**30,
        "python": platform.python_version(),
        "torch": _version("torch"),
        "torch_geometric": _version("torch_geometric"),
        "pytorch_lightning": _version("pytorch_lightning") or _version("pytorch-lightning"),
        "torch_sparse": _version("torch_sparse") or _version("torch-sparse"),
        "pyg_lib": _version("pyg_lib") or _version("pyg-lib"),
        "commit": (commit + ("+dirty" if dirty else "")) if commit else None,
    }
