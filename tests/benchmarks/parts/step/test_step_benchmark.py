"""The training-step benchmark (``benchmarks/parts/step/``) end to end on the CPU at tiny sizes: every row, sane figures."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.parts.step.__main__ import parse_args
from benchmarks.parts.step.rows import ROWS

REPO_ROOT = Path(__file__).resolve().parents[4]
STEPS, WARMUP = 4, 2


@pytest.fixture(scope="module")
def step_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny run of every row on the light model; its output folder."""
    tmp = tmp_path_factory.mktemp("step")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.parts.step", "--device", "cpu", "--models", "light", "--num-nodes", "3000",
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


def _profile_run(tmp_path: Path, device: str, rows: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.parts.step", "--device", device, "--models", "light", "--num-nodes", "2000",
         "--features", "8", "--hidden", "8", "--classes", "4", "--batch-size", "16", "--warmup", "2", "--steps", "3",
         "--stage-batches", "2", "--threads", "1", "--rows", rows, "--profile", "--profile-steps", "4",
         "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    profiles = {p["row"]: p for p in json.loads((tmp_path / "out" / "profile.json").read_text())["profiles"]}
    assert set(profiles) == set(rows.split(","))
    return profiles


@pytest.mark.cuda
def test_profile_runs_on_a_gpu(tmp_path: Path) -> None:
    profiles = _profile_run(tmp_path, "cuda", "plain,ours_e2e_bf16,ours_fused")
    for name, p in profiles.items():
        assert p["cprofile_ms_per_step"] > 0 and p["ops_per_step"] > 10 and p["groups_us"].get("optimizer", 0) > 0, name
    assert profiles["ours_e2e_bf16"]["groups_us"]["our callbacks"] > 0


def test_profile_writes_a_host_time_breakdown_per_step(tmp_path: Path) -> None:
    """``--profile``: each row's host time per step by group (Lightning loop, our callbacks, ...) and its top
    functions and operators, in profile.json and profile.md."""
    profiles = _profile_run(tmp_path, "cpu", "plain,ours_e2e")
    for name, p in profiles.items():
        assert p["profile_steps"] == 4 and p["cprofile_ms_per_step"] > 0 and p["torch_ms_per_step"] > 0, name
        # the groups are the profiled time, split: about the wall time under cProfile
        assert 0.3 < sum(p["groups_us"].values()) / (1e3 * p["cprofile_ms_per_step"]) < 1.3, (name, p["groups_us"])
        assert p["groups_us"].get("optimizer", 0) > 0 and p["ops_per_step"] > 10, name
        assert len(p["top_cumulative"]) > 5 and len(p["top_self"]) > 5 and len(p["top_ops"]) > 5, name
    ours, plain = profiles["ours_e2e"]["groups_us"], profiles["plain"]["groups_us"]
    for group in ("lightning loop", "our callbacks", "our module"):
        assert ours.get(group, 0) > 0 and plain.get(group, 0) == 0, group
    hooks = [t["function"] for t in profiles["ours_e2e"]["top_cumulative"]]
    assert any("training_step" in f for f in hooks)
    report = (tmp_path / "out" / "profile.md").read_text()
    assert "| lightning loop µs |" in report and "### `ours_e2e` (light)" in report


def test_step_profiler_covers_whole_steps_from_warmup() -> None:
    from benchmarks.parts.step.profiling import StepProfiler, group_of

    profiler = StepProfiler("cprofile", warmup=1, steps=2)
    for i in range(4):
        profiler.step_start(i)
        sum(range(1000))
    assert profiler.result is not None and profiler.result["cprofile_ms_per_step"] > 0
    with pytest.raises(ValueError, match="cprofile"):
        StepProfiler("perf", 0, 1)
    assert group_of("/x/site-packages/pytorch_lightning/loops/fit_loop.py") == "lightning loop"
    assert group_of("/repo/lightning_zerocopy/callbacks/telemetry.py") == "our callbacks"
    assert group_of("/x/site-packages/torch/optim/adam.py") == "optimizer"
    assert group_of("/tmp/torch_geometric.nn.conv.sage_conv_SAGEConv_propagate_ab12.py") == "PyG"
