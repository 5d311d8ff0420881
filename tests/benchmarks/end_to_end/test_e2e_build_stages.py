"""The e2e benchmark's build split: each pipeline row's producer stages beside their bounds (the gather's PCIe bound,
the ``sample_alone`` row), ``--feature-dtype``, in the row summary and the report; a CPU run end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks.common.measure import BUILD_STAGES, BatchCheck, TrainClock, summarize
from benchmarks.end_to_end import report as e2e_report
from benchmarks.end_to_end.rows import ROWS

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_the_row_summary_carries_the_build_split():
    clock = TrainClock(warmup=0, budget_s=0.0, sync=lambda: None)
    step = {"data/step_ms": 5.0, "data/stall_frac": 0.1, "data/build_ms": 4.0, "data/gather_build_GBps": 20.0,
            "data/gather_bound_ms": 0.5, **{f"data/build_{s}_ms": float(i + 1) for i, s in enumerate(BUILD_STAGES)}}  # fmt: skip
    figures = summarize(clock, SimpleNamespace(history=[step, step]), warmup=0)
    assert figures["build_stages_ms"] == {"sample": 1.0, "gather": 2.0, "assemble": 3.0, "handover": 4.0}
    assert figures["gather_build_GBps"] == 20.0 and figures["gather_bound_ms"] == 0.5
    plain = summarize(clock, SimpleNamespace(history=[{"data/step_ms": 5.0}]), warmup=0)  # no pipeline
    assert plain["build_stages_ms"] == dict.fromkeys(BUILD_STAGES) and plain["gather_bound_ms"] is None


def test_the_batch_check_compares_x_with_the_rows_cast_to_the_stored_dtype():
    from torch_geometric.data import Data

    class _Trainer:
        global_step = 0

    x, y = torch.randn(10, 4) * 3, torch.arange(10)
    n_id = torch.tensor([3, 1, 7])
    batch = Data(x=x[n_id].bfloat16().float(), y=y[n_id], n_id=n_id, edge_index=torch.tensor([[1, 2], [0, 0]]),
                 batch_size=1)  # fmt: skip
    strict = BatchCheck(lambda step: torch.tensor([3]), x, y, count=1)
    strict.on_train_batch_start(_Trainer(), None, batch, 0)
    assert not strict.result["ok"]  # bf16-rounded rows are not the fp32 rows
    stored = BatchCheck(lambda step: torch.tensor([3]), x, y, count=1, stored_dtype=torch.bfloat16)
    stored.on_train_batch_start(_Trainer(), None, batch, 0)
    assert stored.result["ok"], stored.result["problems"]


def _run(row: str, rate: float, **extra) -> dict:
    return {"row": row, "model": "heavy", "kind": ROWS[row].kind, "status": "ok", "steps_per_s": rate,
            "val_curve": [[100, 1.0, 0.8]], "best_val_acc": 0.8, "step_ms": [1000 / rate] * 10, "stall_frac": 0.2,
            "batch_check": {"checked": 3, "ok": True, "problems": [], "first_sample": "s1"}, **extra}  # fmt: skip


def test_the_report_puts_each_stage_beside_its_bound(tmp_path: Path):
    split = {"sample": 6.1, "gather": 5.2, "assemble": 1.3, "handover": 0.4}
    results = {
        "meta": {"commit": "abc"}, "args": {"preset": "issue20", "feature_dtype": "bfloat16"},
        "graph": {"num_nodes": 10, "num_edges": 20},
        "rows": {r: ROWS[r].doc for r in ("zc_gpu_mps", "model_only", "sample_alone")},
        "runs": [
            _run("zc_gpu_mps", 90.0, build_ms=14.7, build_stages_ms=split, gather_build_GBps=11.8, gather_bound_ms=1.25,
                 sampler_placement="gpu", feature_dtype="bfloat16",
                 telemetry={"build_gather_ms": 5.2, "share_cpu": 0.5, "build_sample_host_ms": 6.3,
                            "build_sample_cpu_ms": 0.9}),
            _run("model_only", 120.0, build_stages_ms=dict.fromkeys(split)),
            {"row": "sample_alone", "model": "heavy", "kind": "sample_alone", "status": "ok", "batches": 20,
             "device": "GPU X", "sample_alone_ms": {"cpu": 30.0, "gpu": 2.25}, "sample_alone_errors": {}},
        ],
    }  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(results))
    e2e_report.write_report(results, str(tmp_path), [], "")
    report = (tmp_path / "report.md").read_text()
    assert "## Where a build's time goes" in report
    assert "| `zc_gpu_mps` | bfloat16 | 14.70 | 6.10 | 6.30 / 0.90 | 2.25 | 5.20 | 11.8 | 1.25 | 1.30 | 0.40 |" in report
    assert "| `model_only` | float32 |" not in report  # no producer, no split
    assert "- heavy (20 batches on GPU X): `cpu` 30.00 ms, `gpu` 2.25 ms" in report
    assert ("producer build 14.70 ms per batch: sample 6.10 (alone 2.25), gather 5.20 (PCIe bound 1.25), assemble 1.30,"
            " hand-over 0.40 ms.") in report  # the limit, measured: each stage against its bound
    assert "our rows store the host features as bfloat16" in report
    assert "share_cpu 0.5" in report and "build_gather_ms" not in report.split("## Other DataTelemetry")[1]
    line = e2e_report.one_line(results["runs"][2])
    assert "sampling alone, ms per batch: cpu 30.00, gpu 2.25" in line


def test_a_cpu_run_reports_the_split_and_the_sampler_alone(tmp_path: Path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.end_to_end", "--preset", "ci", "--configs", "cpu_inproc,sample_alone", "--steps", "12",
         "--warmup", "2", "--stage-steps", "4", "--feature-dtype", "bfloat16", "--out", str(out),
         "--cache-dir", str(tmp_path / "cache")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {r["row"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    inproc, alone = runs["cpu_inproc"], runs["sample_alone"]
    assert inproc["status"] == "ok" and inproc["batch_check"]["ok"], inproc.get("batch_check")
    assert inproc["feature_dtype"] == "bfloat16" and inproc["sampler_placement"] == "cpu"
    assert all(inproc["build_stages_ms"][s] is not None and inproc["build_stages_ms"][s] >= 0 for s in BUILD_STAGES)
    assert inproc["build_stages_ms"]["gather"] > 0 and inproc["gather_build_GBps"] > 0
    assert inproc["gather_bound_ms"] is None  # no PCIe on the CPU
    host, cpu = (inproc["telemetry"][f"build_sample_{t}_ms"] for t in ("host", "cpu"))  # the sampling thread's times
    assert host > 0 and 0 <= cpu <= host * 1.05, (host, cpu)
    assert alone["status"] == "ok" and alone["sample_alone_ms"]["cpu"] > 0, alone
    report = (out / "report.md").read_text()
    assert "## Where a build's time goes" in report and "| `cpu_inproc` | bfloat16 |" in report


def test_x_dtype_reaches_our_rows_and_model_only_alike(tmp_path: Path):
    """``--x-dtype bfloat16`` (bf16 host table, bf16-mixed): batch.x is handed over in bf16 by our row and by
    model-only's staged batches alike, checked against the dataset's rows, and the report says so."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.end_to_end", "--preset", "ci", "--configs", "cpu_inproc,model_only",
         "--models", "light", "--steps", "12", "--warmup", "2", "--feature-dtype", "bfloat16", "--x-dtype", "bfloat16",
         "--precision", "bf16-mixed", "--out", str(out), "--cache-dir", str(tmp_path / "cache")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {r["row"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    for name in ("cpu_inproc", "model_only"):
        run = runs[name]
        assert run["status"] == "ok" and run["batch_check"]["ok"], run.get("batch_check")
        assert run["x_dtype"] == "bfloat16" and run["batch_check"]["x_dtype"] == "bfloat16", name
    assert "`x` delivered as bfloat16 by our rows and model-only's" in (out / "report.md").read_text()


def test_a_rows_environment_is_set_in_its_process_before_its_worker_starts(monkeypatch):
    """``zc_gpu_mps_spin``: the pipeline's host waits spin (the worker inherits the row process's environment)."""
    from benchmarks.end_to_end.train import run_row
    from lightning_zerocopy.pipeline.host_waits import SPIN_WAITS_ENV, spin_waits

    monkeypatch.setenv(SPIN_WAITS_ENV, "0")  # restored after the test
    assert run_row(ROWS["zc_gpu_mps"], [], SimpleNamespace(threads=0), {}) == [] and not spin_waits()
    assert run_row(ROWS["zc_gpu_mps_spin"], [], SimpleNamespace(threads=0), {}) == [] and spin_waits()


def test_the_depth_row_gives_its_pipeline_three_slots():
    from benchmarks.end_to_end.train import pipeline_options

    options = pipeline_options(ROWS["zc_gpu_mps_depth3"], SimpleNamespace(worker_sm_percent=10))
    assert options == {"mode": "worker", "mps": True, "depth": 3, "worker_sm_percent": 10}
    assert "depth" not in pipeline_options(ROWS["zc_gpu_mps"], SimpleNamespace(worker_sm_percent=10))
