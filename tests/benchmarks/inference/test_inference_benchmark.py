"""The layer-wise inference benchmark (``benchmarks/inference/``): the ``ci`` preset end to end on the CPU (ours and
the extrapolated sampled predict, the report), and PyG's ``BasicGNN.inference`` row in-process (its torch-sparse
sampling call answered by our sampler where neither backend is installed), whose logits equal ours (1e-5)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch
from helpers import fake_torch_sparse_sampler
from helpers.one_model_runs import run_benchmark

from benchmarks.inference.__main__ import graph_kwargs, parse_args
from benchmarks.inference.report import render
from benchmarks.inference.rows import ROWS, _probe_ids, probe_diff, run_row



@pytest.mark.parametrize("num_nodes", [1, 2, 3_000, 24_000_000, 100_000_001])
def test_probe_ids_stay_within_the_graph(num_nodes: int) -> None:
    # float32 ids above 2**24 round up: the 24M-node GPU run indexed row 24,000,000 of 24M (a device-side assert)
    ids = _probe_ids(num_nodes, 512)
    assert ids.dtype == torch.int64 and ids.numel() == min(512, num_nodes)
    assert int(ids[0]) == 0 and int(ids[-1]) == num_nodes - 1
    assert bool((ids[1:] > ids[:-1]).all())


@pytest.mark.slow
def test_ci_run_times_ours_and_the_sampled_predict_and_reports_them(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_benchmark("benchmarks.inference", "--preset", "ci", "--configs", "ours,sampled", "--out", str(out),
                  "--cache-dir", str(tmp_path / "cache"))  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    runs = {r["row"]: r for r in results["runs"]}
    assert results["graph"]["num_nodes"] == 3000 and set(runs) == {"ours", "sampled"}
    ours, sampled = runs["ours"]["models"]["light"], runs["sampled"]["models"]["light"]
    assert runs["ours"]["status"] == "ok" and runs["sampled"]["status"] == "ok", runs
    assert [layer["layer"] for layer in ours["layers"]] == [0, 1] and all(layer["bytes_read"] > 0 for layer in ours["layers"])
    assert all(0 < layer["sample_s"] < layer["seconds"] for layer in ours["layers"])
    assert ours["total_s"] > 0 and len(ours["probe"]) == 512 and ours["storage"] == "host"
    assert sampled["extrapolated"] and sampled["batches"] == 24 and sampled["measured_batches"] == 5
    report = (out / "report.md").read_text()
    assert "| light | " in report and "(extrap.)" in report


def test_pyg_rows_logits_equal_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch_geometric.typing

    if not any(importlib.util.find_spec(m) for m in ("pyg_lib", "torch_sparse")):
        fake_torch_sparse_sampler()
        monkeypatch.setattr(torch_geometric.typing, "WITH_TORCH_SPARSE", True)
        monkeypatch.setitem(sys.modules, "torch_sparse", types.ModuleType("torch_sparse"))
    args = parse_args(["--preset", "ci", "--num-nodes", "800", "--device", "cpu", "--models", "light,heavy",
                       "--cache-dir", str(tmp_path), "--pyg-workers", "0", "--probe-nodes", "100"])  # fmt: skip
    kwargs = graph_kwargs(args)
    pyg, ours = run_row(ROWS["pyg"], args, kwargs), run_row(ROWS["ours"], args, kwargs)
    assert pyg["status"] == "ok" and ours["status"] == "ok", (pyg, ours)
    for model, layers in (("light", 2), ("heavy", 3)):
        figures = pyg["models"][model]
        assert [layer["layer"] for layer in figures["layers"]] == list(range(layers)) and figures["pyg_workers"] == 0
        assert len(figures["probe"]) == 100
        diff = probe_diff(figures["probe"], ours["models"][model]["probe"])
        assert diff is not None and diff <= 1e-5 * max(1.0, float(torch.tensor(figures["probe"]).abs().max())), diff
    results = {"command": "python -m benchmarks.inference", "graph": {"num_nodes": 800, "num_edges": 1, "features": 16,
               "features_gb": 0.0}, "runs": [pyg, ours, {"row": "sampled", "status": "skipped", "reason": "not asked"}]}  # fmt: skip
    text = render(results)
    assert "| heavy | " in text and "`sampled`: skipped: not asked" in text


@pytest.mark.cuda
def test_gpu_rows_on_the_ci_graph(tmp_path: Path) -> None:
    """Ours on a GPU (features read zero-copy, layers kept on the GPU: they fit) and the sampled predict there."""
    out = tmp_path / "out"
    run_benchmark("benchmarks.inference", "--preset", "ci", "--device", "cuda", "--models", "light,heavy", "--configs",
                  "ours,sampled", "--out", str(out), "--cache-dir", str(tmp_path / "cache"))  # fmt: skip
    runs = {r["row"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert all(r["status"] == "ok" for r in runs.values()), runs
    assert runs["ours"]["models"]["heavy"]["storage"] == "gpu" and len(runs["ours"]["models"]["heavy"]["layers"]) == 3
