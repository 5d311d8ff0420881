"""The link-prediction benchmark (``benchmarks/link/``): the ``ci`` preset end to end on CPU rows, the report."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import fake_torch_sparse_sampler

from benchmarks.link.__main__ import PRESETS, ROWS, parse_args, select_rows

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(*flags: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.link", *flags], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ``--preset ci`` run (CPU rows on a few thousand nodes); its output folder."""
    tmp = tmp_path_factory.mktemp("link")
    _run("--preset", "ci", "--out", str(tmp / "out"), "--cache-dir", str(tmp / "cache"))
    return tmp / "out"


def test_ci_run_writes_json_report_and_plot(ci_run: Path) -> None:
    results = json.loads((ci_run / "results.json").read_text())
    preset = PRESETS["ci"]
    assert results["graph"]["num_nodes"] == preset.num_nodes and results["graph"]["splits"]["val"]["negatives"] > 0
    runs = {r["row"]: r for r in results["runs"]}
    assert list(runs) == preset.configs.split(",")
    for row in ("cpu", "model_only"):
        r = runs[row]
        assert r["status"] == "ok", r
        assert r["steps_per_s"] > 0 and r["steps"] == preset.steps
        assert len(r["val_curve"]) == preset.steps // preset.val_every
        assert r["batch_check"]["ok"] and r["batch_check"]["checked"] >= 1, r["batch_check"]
        assert 0.0 <= r["stall_frac"] <= 1.0 and r["wait_ms"] is not None
        assert r["best_val_auroc"] > 0.5  # learns something already in 16 steps
    # model-only trains on the plan's own batches, pre-staged: the same AUROC at every validation
    assert [v[2] for v in runs["cpu"]["val_curve"]] == pytest.approx([v[2] for v in runs["model_only"]["val_curve"]], abs=1e-6)
    if not torch.cuda.is_available():
        assert runs["zc_gpu"]["status"] == "skipped" and "CUDA" in runs["zc_gpu"]["reason"]
    pyg = runs["pyg"]
    if any(importlib.util.find_spec(m) for m in ("pyg_lib", "torch_sparse")):
        assert pyg["status"] == "ok" and pyg["batch_check"]["ok"], pyg
    else:  # PyG cannot sample without a backend: the row says so instead of failing
        assert pyg["status"] == "skipped" and "pyg-lib or torch-sparse" in pyg["reason"], pyg

    report = (ci_run / "report.md").read_text()
    assert "| row | steps/s | × PyG | × model-only | stall |" in report
    for row in runs:
        assert f"`{row}`" in report
    if importlib.util.find_spec("matplotlib") is not None:
        assert (ci_run / "link.png").stat().st_size > 0


def test_report_only_rerenders_from_the_json(ci_run: Path, tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text((ci_run / "results.json").read_text())
    proc = _run("--report-only", str(tmp_path))
    assert "report.md" in proc.stdout
    assert (tmp_path / "report.md").read_text() == (ci_run / "report.md").read_text()


def test_append_keeps_the_other_rows(ci_run: Path, tmp_path: Path) -> None:
    import shutil

    out = tmp_path / "out"
    shutil.copytree(ci_run, out)
    cache = ci_run.parent / "cache"  # the same graph as the ci run
    _run("--preset", "ci", "--configs", "zc_gpu", "--append", "--out", str(out), "--cache-dir", str(cache))
    before = json.loads((ci_run / "results.json").read_text())
    after = json.loads((out / "results.json").read_text())
    assert sorted(r["row"] for r in after["runs"]) == sorted(r["row"] for r in before["runs"])
    assert [r for r in after["runs"] if r["row"] == "cpu"] == [r for r in before["runs"] if r["row"] == "cpu"]
    assert "; then " in after["command"]
    proc = _run("--preset", "ci", "--num-nodes", "2000", "--configs", "zc_gpu", "--append", "--out", str(out),
                "--cache-dir", str(cache), check=False)  # fmt: skip
    assert proc.returncode != 0 and "another graph" in proc.stdout + proc.stderr


def test_share_rows_take_their_own_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """The link benchmark's zc_gpu_mps_20/_30/_auto: the row's share reaches the MPS launcher and the report."""
    from benchmarks.link import report as link_report
    from benchmarks.e2e.rows import mps_prefix
    from lightning_zerocopy.pipeline import mps

    monkeypatch.setattr(mps, "mps_processes", lambda: [])
    args = parse_args(["--worker-sm-percent", "auto"])
    shares = {name: mps_prefix(args, ROWS[name])[-2] for name in ("zc_gpu_mps", "zc_gpu_mps_20", "zc_gpu_mps_30", "zc_gpu_mps_auto")}
    assert shares == {"zc_gpu_mps": "10", "zc_gpu_mps_20": "20", "zc_gpu_mps_30": "30", "zc_gpu_mps_auto": "10"}
    run = {"row": "zc_gpu_mps_auto", "kind": "ours", "status": "ok", "steps_per_s": 50.0, "step_ms": [20.0],
           "worker_sm_percent": "auto", "chosen_worker_sm_percent": 30, "batch_check": {"checked": 3, "ok": True}}  # fmt: skip
    assert "share 30 %, auto" in link_report.one_line(run)
    assert any(line.startswith("| `zc_gpu_mps_auto` (share 30 %, auto) | 50.0 |")
               for line in link_report._table({"args": {}, "runs": [run]}))


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown row"):
        select_rows("cpu,nope")
    assert [r.name for r in select_rows("all")] == list(ROWS)
    for bad in (["--configs", "cpu,nope"], ["--neg-ratio", "0"], ["--warmup", "20", "--steps", "10"], ["--num-neighbors", "5,x"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    args = parse_args(["--preset", "gpu", "--steps", "80"])
    assert args.steps == 80 and args.fanouts == [10, 5] and args.batch_size == PRESETS["gpu"].batch_size


def test_pyg_row_trains_through_link_neighbor_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PyG row end to end (worker sweep, the fixed val negatives, batch check), with PyG's torch-sparse sampling
    call answered by our sampler where neither backend is installed (on the GPU box the real torch-sparse runs)."""
    import types

    import torch_geometric.typing

    from benchmarks.link.__main__ import dataset_kwargs
    from benchmarks.link.train import build_dataset, run_row

    if not any(importlib.util.find_spec(m) for m in ("pyg_lib", "torch_sparse")):
        fake_torch_sparse_sampler()
        monkeypatch.setattr(torch_geometric.typing, "WITH_TORCH_SPARSE", True)
        monkeypatch.setitem(sys.modules, "torch_sparse", types.ModuleType("torch_sparse"))
    args = parse_args(["--preset", "ci", "--pyg-workers", "0,1", "--sweep-batches", "3", "--cache-dir", str(tmp_path)])
    kwargs = dataset_kwargs(args, "cpu")
    build_dataset(kwargs).prepare()
    result = run_row(ROWS["pyg"], args, kwargs)
    assert result["status"] == "ok", result
    assert result["pyg_workers"] in (0, 1) and set(result["pyg_sweep_batches_per_s"]) == {0, 1}
    assert result["steps"] == args.steps and len(result["val_curve"]) == args.steps // args.val_every
    assert result["batch_check"]["checked"] == 3 and result["batch_check"]["ok"], result["batch_check"]
    assert result["best_val_auroc"] > 0.5 and result["stall_frac"] is not None
