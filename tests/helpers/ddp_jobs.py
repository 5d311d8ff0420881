"""Running a test script as a job of CPU ranks (gloo), as ``tests/data/test_ddp.py`` and ``test_link_ddp.py`` do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers import free_port

ROOT = Path(__file__).resolve().parents[2]


def run_ddp_script(script: Path, tmp_path: Path, name: str, cache: str, **config: Any) -> Path:
    """Run ``script`` with ``config`` written to ``tmp_path/<name>.json`` (its ``out`` is ``tmp_path/name``, its
    dataset cache ``cache``), on a free port, without the rank variables of the calling process; assert it exited 0
    with a batch plan that stayed the same on every rank. Returns the output folder."""
    out = tmp_path / name
    out.mkdir()
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(dict(config, out=str(out), cache=cache)))
    env = dict(os.environ, PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GLOBAL_RANK", "RANK"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(script), str(path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "batch plan changed" not in proc.stderr
    return out


def shm_names() -> set[str]:
    """The names in ``/dev/shm`` now (a job must leave none of its own behind)."""
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def rank_reports(out: Path, world_size: int) -> list[dict[str, Any]]:
    """The ``rank<r>.json`` that each rank of a script's job wrote into ``out``."""
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]
