"""The cache over typed rows decided on two CPU ranks (gloo, subprocesses running ``scripts/typed_cache_gloo_script.py``):
both ranks exchange their facts, sum their presampled counts per type and agree on one plan per featured type."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "typed_cache_gloo_script.py"


def _run(tmp_path: Path, ranking: str, policy: str) -> list[dict]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path), str(r), "2", ranking, policy], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]  # fmt: skip
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("ranking,policy", [("degree", "replicate"), ("presample", "clique")])
def test_two_ranks_agree_on_one_plan_per_featured_type(tmp_path: Path, ranking: str, policy: str) -> None:
    r0, r1 = _run(tmp_path, ranking, policy)
    assert r0["digest"] == r1["digest"] and r0["rows"] == r1["rows"] and r0["bounds"] == r1["bounds"]
    assert set(r0["rows"]) == {"paper", "institution"}  # author has no features: never a candidate
    assert r0["bytes_per_gpu"] <= 1024 and any(r0["rows"].values())
    if policy == "replicate":
        assert [r0["group"], r1["group"]] == [[0], [1]] and r0["shard_index"] == r1["shard_index"] == 0
        assert all(len(b) == 2 for b in r0["bounds"].values())
    else:
        assert r0["group"] == r1["group"] == [0, 1] and [r0["shard_index"], r1["shard_index"]] == [0, 1]
        assert all(len(b) == 3 for b in r0["bounds"].values())  # the same shard count for every type
    assert "paper: " in r0["summary"] and "institution: " in r0["summary"]
