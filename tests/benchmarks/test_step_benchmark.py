"""The training-step benchmark (``benchmarks/step.py``) end to end on the CPU at tiny sizes: every row, sane figures."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.step import parse_args
from benchmarks.step_rows import ROWS

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS, WARMUP = 4, 2


@pytest.fixture(scope="module")
def step_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny run of every row on the light model; its output folder."""
    tmp = tmp_path_factory.mktemp("step")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.step", "--device", "cpu", "--models", "light", "--num-nodes", "3000",
         "--features", "16", "--classes", "4", "--batch-size", "32", "--warmup", str(WARMUP), "--steps", str(STEPS),
         "--stage-batches", "3", "--threads", "1", "--out", str(tmp / "out"), "--cache-dir", str(tmp / "cache")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp / "out"


def test_every_row_runs_with_sane_figures(step_run: Path) -> None:
    results = json.loads((step_run / "results.json").read_text())
    assert results["graph"]["num_nodes"] == 3000 and results["device"] == "cpu"
    info = results["models"]["light"]
    assert info["staged_batches"] == 3 and info["nodes_per_batch"] > 32 and info["edges_per_batch"] > 0
    runs = {r["row"]: r for r in results["runs"]}
    assert set(runs) == set(ROWS) and {r["model"] for r in results["runs"]} == {"light"}
    for name, r in runs.items():
        assert r["status"] == "ok", r
        assert r["timed_steps"] == STEPS, name
        assert 0 < r["median_ms"] < 60_000 and 0 < r["mean_ms"] < 60_000, name
        assert math.isfinite(r["final_loss"]) and r["initial_loss"] > 0, name
        assert r["initial_loss_ok"], (name, r["initial_loss_rel_diff"])  # same weights, same first batch
    report = (step_run / "report.md").read_text()
    assert "| row | light ms/step | × bare | what |" in report
    for name in ROWS:
        assert f"| `{name}` | " in report
    assert "matches the plain loop's" in report


def test_unknown_rows_and_models_are_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--rows", "bare,nope"])
    assert "unknown row(s) ['nope']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--models", "gat"])
    assert "--models: unknown model(s) ['gat']" in capsys.readouterr().err
    assert [r.name for r in parse_args(["--rows", "ours,plain"]).row_list] == ["ours", "plain"]
