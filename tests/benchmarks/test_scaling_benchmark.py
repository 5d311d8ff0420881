"""The scaling benchmark (``benchmarks/scaling/``) end to end in its CPU plumbing mode: one Lightning fit per
configuration in a fresh process, the Strategy's cache decision and the JSON it writes (figures not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run_scaling(tmp_path: Path, *flags: str) -> dict:
    """``benchmarks/scaling/`` in its CPU mode on a 5000-node graph with ``flags``; its JSON report."""
    out = tmp_path / "scaling.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.scaling", "--device", "cpu", "--policies", "auto", "--num-nodes", "5000",
         "--limit-batches", "2", "--batch-size", "128", "--presample-batches", "4",
         "--cache-dir", str(tmp_path / "cache"), "--out", str(out), *flags],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_cpu_plumbing_run_writes_every_configuration(tmp_path: Path) -> None:
    report = _run_scaling(tmp_path, "--gpus", "1", "--budgets", "0,0.3", "--epochs", "2")
    assert report["config"]["device"] == "cpu" and "topo_m" in report["topology"]
    runs = {r["budget_fraction"]: r for r in report["runs"]}
    assert set(runs) == {0.0, 0.3}
    for r in runs.values():
        assert r["returncode"] == 0 and "error" not in r, r
        assert r["epoch_s"] > 0 and r["steps_per_epoch"] == 2
    assert runs[0.0]["chosen_policy"] is None  # no budget, no cache
    cached = runs[0.3]
    assert cached["chosen_policy"] == "replicate" and "one GPU" in cached["note"]
    assert cached["cached_rows"] == int(0.3 * 5000) and 0 < cached["expected_hit_rate"] <= 1


def test_two_cpu_ranks_report_one_shared_host_copy(tmp_path: Path) -> None:
    """Each rank's PSS of the host copy is measured; two ranks on one machine add up to about one copy while each
    maps all of it (RSS) — the issue's 'one host copy per machine', as the GPU runs will report it."""
    runs = {r["gpus"]: r for r in _run_scaling(tmp_path, "--gpus", "1,2", "--budgets", "0.3", "--epochs", "1")["runs"]}
    assert set(runs) == {1, 2}
    for r in runs.values():
        assert "error" not in r, r
        assert r["host_data_GB"] > 0 and 0.5 < r["host_pss_over_data"] < 1.25, r
    # scaling is throughput: every rank trains --limit-batches batches of its own seeds per epoch
    for gpus, r in runs.items():
        assert r["seeds_per_s"] == pytest.approx(gpus * 128 * 2 / r["epoch_s"]) and r["pipeline"] == "off"
    assert runs[2]["speedup_vs_1gpu"] == pytest.approx(runs[2]["seeds_per_s"] / runs[1]["seeds_per_s"])
    pair = runs[2]["per_rank"]
    assert len(pair) == 2 and all(p["host_pss_bytes"] < 0.75 * p["host_rss_bytes"] for p in pair), pair
