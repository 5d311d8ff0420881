"""A cache build killed on the way leaves its hidden ``.<name>.tmp-*`` folder; the next build of that cache removes it
when its builder is gone (a live builder's folder, and another host's, are left alone). The node-order and cast-feature
caches are built the same way (``ArrayCache.build``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from lightning_zerocopy.datasets.base import ArrayCache
from lightning_zerocopy.datasets.cache_builds import build_folder

ROOT = Path(__file__).resolve().parents[2]

_KILLED_BUILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    sys.path.insert(0, {root!r})
    from lightning_zerocopy.datasets.base import ArrayCache

    def write(out):
        np.save(out / "x.npy", np.ones((1000, 64), dtype=np.float32))
        print("WRITING", flush=True)
        time.sleep(60)
        return {{}}

    ArrayCache({path!r}).build(write)
    """
)


def _temporaries(cache: Path) -> list[str]:
    return sorted(n for n in os.listdir(cache.parent) if n.startswith(f".{cache.name}.tmp-"))


def test_the_folder_of_a_killed_build_is_swept_by_the_next_build(tmp_path: Path) -> None:
    cache = tmp_path / "synthetic-abc"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_BUILD.format(root=str(ROOT), path=str(cache))],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "WRITING"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    left = _temporaries(cache)
    assert len(left) == 1 and f"-{proc.pid}-" in left[0], left
    live = build_folder(cache)  # a build of this process, still running: kept
    ArrayCache(cache).build(lambda out: np.save(out / "x.npy", np.zeros(3)) or {})
    assert _temporaries(cache) == [live.name] and ArrayCache(cache).exists()
    os.rmdir(live)


def test_another_hosts_folder_is_left_alone(tmp_path: Path) -> None:
    cache = tmp_path / "synthetic-abc"
    other = tmp_path / f".{cache.name}.tmp-otherhost-1-xyz"
    other.mkdir()
    ArrayCache(cache).build(lambda out: np.save(out / "x.npy", np.zeros(3)) or {})
    assert other.is_dir()
