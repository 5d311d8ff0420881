"""The temporary folders of cache builds, and sweeping those a killed build left behind.

Every on-disk cache (a dataset's, the node-order cache, the cast feature file: each an
:class:`~lightning_zerocopy.datasets.base.ArrayCache`) is written into a hidden temporary folder next to it and renamed
into place when complete. A build killed on the way (SIGKILL, the OOM killer) left that folder forever: 51 MB per kill
on a 1.5M-node graph, gigabytes on the recipes' graphs. The folder's name now says which process builds it
(``.<cache name>.tmp-<host>-<pid>-<random>``), and :func:`sweep_abandoned_builds` removes, before a build, the folders
of builders that no longer run on this host. Folders of other hosts (a cache on a shared file system) and of live
builders are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

from lightning_zerocopy.process_state import process_alive

__all__ = ["build_folder", "sweep_abandoned_builds"]


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:64] or "host"


def build_folder(cache_path: Path) -> Path:
    """A new temporary folder for building the cache ``cache_path``, next to it, named after this host and process."""
    prefix = f".{cache_path.name}.tmp-{_host()}-{os.getpid()}-"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=cache_path.parent))


def sweep_abandoned_builds(cache_path: Path) -> list[Path]:
    """Remove the temporary build folders of ``cache_path`` whose builder process on this host is gone.

    Returns:
        The folders removed.
    """
    pattern = re.compile(rf"^\.{re.escape(cache_path.name)}\.tmp-{re.escape(_host())}-(\d+)-[^/]+$")
    try:
        entries = list(os.scandir(cache_path.parent))
    except OSError:
        return []
    removed = []
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False) or process_alive(int(match.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.exists(entry.path):
            removed.append(Path(entry.path))
    return removed
