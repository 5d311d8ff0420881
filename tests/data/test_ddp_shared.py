"""Two CPU ranks (gloo DDP, launched by a script): disjoint equal seed shares, one shared host copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "ddp_script.py"


@pytest.mark.slow
def test_two_ranks_share_host_memory_and_split_seeds(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), str(tmp_path / "cache")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in reports] == [2, 2]
    assert reports[0]["pid"] != reports[1]["pid"]

    # every rank mapped the same segments (local rank 0 created them, rank 1 opened them by name)
    assert reports[0]["mapped"] and reports[0]["mapped"] == reports[1]["mapped"]
    assert all(os.path.basename(path).startswith("lzc-") for path in reports[0]["mapped"])

    # disjoint, equal-length shares of the training split
    shares = [[s for batch in r["seeds"] for s in batch] for r in reports]
    assert len(reports[0]["seeds"]) == len(reports[1]["seeds"]) > 0
    assert len(shares[0]) == len(shares[1])
    assert not set(shares[0]) & set(shares[1])
    train = set(reports[0]["train_idx"])
    assert set(shares[0]) | set(shares[1]) <= train
    assert len(train) - len(shares[0]) - len(shares[1]) < 2 * 64  # drop_last drops less than a batch per rank

    # nothing left in /dev/shm by the job
    pids = {r["pid"] for r in reports}
    leftovers = {name for name in set(os.listdir("/dev/shm")) - before if any(name.startswith(f"lzc-{p}-") for p in pids)}
    assert not leftovers, leftovers
