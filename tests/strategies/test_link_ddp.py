"""The link data path under ZeroCopyDDPStrategy in a two-rank CPU job (gloo): edge shares, one host copy, the
strategy's cache plan, telemetry, and predictions merged across ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import free_port

SCRIPT = Path(__file__).parents[1] / "scripts" / "link_ddp_script.py"


@pytest.mark.slow
def test_two_ranks_split_the_supervision_edges_and_share_one_host_copy(tmp_path: Path) -> None:
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    env = dict(os.environ, PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    for key in ("LOCAL_RANK", "WORLD_SIZE", "GLOBAL_RANK", "RANK", "NODE_RANK"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in reports] == [2, 2]
    assert reports[0]["paths"] == reports[1]["paths"]  # one host copy, mapped by both ranks
    shares = [[i for batch in r["input_ids"] for i in batch] for r in reports]
    assert len(shares[0]) == len(shares[1]) > 0 and not set(shares[0]) & set(shares[1])  # disjoint, equal
    assert len(set(shares[0]) | set(shares[1])) > reports[0]["num_train_edges"] - 2 * 64  # drop_last: < a batch each
    assert all(r["cache_rows"] > 0 for r in reports)  # the strategy planned a cache from the link plan
    assert "data/stall_frac_epoch" in reports[0]["logged"]  # telemetry reached the logger (epoch figures)
    p = np.load(tmp_path / "predictions.npz")  # rank 0 merged both shares
    assert {"src", "dst", "score", "label", "query"} <= set(p.files) and len(p["src"]) > 0
    assert not list(tmp_path.glob("predictions.rank*.npz"))
    pids = {r["pid"] for r in reports}
    left = {n for n in set(os.listdir("/dev/shm")) - before if any(n.startswith(f"lzc-{pid}-") for pid in pids)}
    assert not left, left
