"""The link-prediction benchmark (``benchmarks/end_to_end/link/``): what only it has (link splits, AUROC, the plot, ``--append``,
the share rows, PyG's ``LinkNeighborLoader`` row). What it shares with the heterogeneous benchmark (rows, flags, the
report, the ``ci`` preset end to end): ``test_one_model_benchmarks.py``."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Callable

import pytest
from helpers import fake_torch_sparse_sampler
from helpers.one_model_runs import run_benchmark

from benchmarks.end_to_end.link.__main__ import PRESETS, ROWS, parse_args


@pytest.fixture(scope="module")
def ci_run(one_model_ci_run: Callable[[str], Path]) -> Path:
    """The session's ``--preset ci`` run (CPU rows on a few thousand nodes); its output folder."""
    return one_model_ci_run("link")


def test_ci_run_splits_the_links_learns_them_and_plots(ci_run: Path) -> None:
    """What only the link benchmark's ``ci`` run shows (the rest: ``test_one_model_benchmarks.py``)."""
    results = json.loads((ci_run / "results.json").read_text())
    preset = PRESETS["ci"]
    assert results["graph"]["num_nodes"] == preset.num_nodes and results["graph"]["splits"]["val"]["negatives"] > 0
    runs = {r["row"]: r for r in results["runs"]}
    for row in ("cpu", "model_only"):
        assert runs[row]["best_val_auroc"] > 0.5  # learns something already in 16 steps
    if importlib.util.find_spec("matplotlib") is not None:
        assert (ci_run / "link.png").stat().st_size > 0


def test_append_keeps_the_other_rows(ci_run: Path, tmp_path: Path) -> None:
    import shutil

    out = tmp_path / "out"
    shutil.copytree(ci_run, out)
    cache = ci_run.parent / "cache"  # the same graph as the ci run
    run_benchmark("benchmarks.end_to_end.link", "--preset", "ci", "--configs", "zc_gpu", "--append", "--out", str(out), "--cache-dir",
                  str(cache))  # fmt: skip
    before = json.loads((ci_run / "results.json").read_text())
    after = json.loads((out / "results.json").read_text())
    assert sorted(r["row"] for r in after["runs"]) == sorted(r["row"] for r in before["runs"])
    assert [r for r in after["runs"] if r["row"] == "cpu"] == [r for r in before["runs"] if r["row"] == "cpu"]
    assert "; then " in after["command"]
    proc = run_benchmark("benchmarks.end_to_end.link", "--preset", "ci", "--num-nodes", "2000", "--configs", "zc_gpu", "--append",
                         "--out", str(out), "--cache-dir", str(cache), check=False)  # fmt: skip
    assert proc.returncode != 0 and "another graph" in proc.stdout + proc.stderr


def test_share_rows_take_their_own_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """The link benchmark's zc_gpu_mps_20/_30/_auto: the row's share reaches the MPS launcher and the report."""
    from benchmarks.end_to_end.link import report as link_report
    from benchmarks.end_to_end.rows import mps_prefix
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


def test_negatives_ratio_must_be_positive(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--neg-ratio", "0"])
    assert "--neg-ratio must be > 0" in capsys.readouterr().err


def test_pyg_row_trains_through_link_neighbor_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PyG row end to end (worker sweep, the fixed val negatives, batch check), with PyG's torch-sparse sampling
    call answered by our sampler where neither backend is installed (on the GPU box the real torch-sparse runs)."""
    import types

    import torch_geometric.typing

    from benchmarks.end_to_end.link.__main__ import dataset_kwargs
    from benchmarks.end_to_end.link.train import build_dataset, run_row

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
