"""The heterogeneous benchmark (``benchmarks/e2e/hetero/``): its command line, its parts (the batch check on PyG-layout
batches, PyG's ``HeteroData`` of a dataset, the model, the report), and the ``ci`` preset end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.hetero_batches import mag_like_graph, sample_batch

from benchmarks.e2e.hetero.__main__ import PRESETS, ROWS, dataset_kwargs, parse_args
from benchmarks.e2e.hetero.report import mag_epoch_steps, render
from benchmarks.e2e.hetero.train import HeteroBatchCheck, build_model, hetero_data
from lightning_zerocopy.datasets.hetero import HeteroNodeData

REPO_ROOT = Path(__file__).resolve().parents[2]



def _node_data() -> tuple[SimpleNamespace, HeteroNodeData]:
    g = mag_like_graph()
    perm = torch.randperm(g.num_nodes["paper"], generator=torch.Generator().manual_seed(0))
    data = HeteroNodeData(num_nodes=g.num_nodes, edge_index=g.edge_index, x=g.x, input_type="paper", y=g.y,
                          train_idx=perm[:200].sort().values, val_idx=perm[200:250], test_idx=perm[250:])  # fmt: skip
    return g, data


def test_presets_and_rows() -> None:
    args = parse_args([])
    assert args.preset == "mag10x" and args.features == 128 and args.batch_size == 1024
    total = args.papers + args.authors + args.institutions + args.fields
    assert 18e6 < total < 22e6  # about 10x ogbn-mag's 1.94M nodes
    assert set(PRESETS["ci"].configs.split(",")) <= set(ROWS) and "pyg" in ROWS and "model_only" in ROWS
    ci = parse_args(["--preset", "ci", "--papers", "500"])
    assert ci.papers == 500 and ci.fanouts == [5, 5] and dataset_kwargs(ci)["num_papers"] == 500
    assert mag_epoch_steps() == 615
    mag = parse_args(["--preset", "mag"])  # ogbn-mag's own counts (1,939,743 nodes)
    assert mag.papers + mag.authors + mag.institutions + mag.fields == 1_939_743
    assert all(set(p.configs.split(",")) <= set(ROWS) for p in PRESETS.values())
    with pytest.raises(SystemExit):
        parse_args(["--configs", "nope"])


def test_batch_check_accepts_a_right_batch_and_names_a_wrong_one() -> None:
    g, data = _node_data()
    batch = sample_batch(g, data.train_idx[:16], [4, 3])
    check = HeteroBatchCheck(data, count=2)
    trainer = SimpleNamespace(global_step=0)
    check.on_train_batch_start(trainer, None, batch, 0)
    assert check.result == {"checked": 1, "ok": True, "problems": []}
    batch["paper"].x = batch["paper"].x + 1
    trainer.global_step = 1
    check.on_train_batch_start(trainer, None, batch, 1)
    assert not check.result["ok"] and "paper.x differs" in check.result["problems"][0]


def test_pyg_hetero_data_and_the_model_of_a_dataset() -> None:
    g, data = _node_data()
    graph = hetero_data(data)
    assert graph.metadata()[0] == list(g.num_nodes) and set(graph.edge_types) == set(g.edge_index)
    assert torch.equal(graph["paper"].x, g.x["paper"]) and "x" not in graph["author"]
    dataset = SimpleNamespace(num_features={"paper": 8}, num_classes=4)
    args = parse_args(["--preset", "ci", "--hidden", "8"])
    model = build_model(args, dataset, data)
    out = model(sample_batch(g, data.train_idx[:8], [3, 2]))
    assert out.shape[1] == 4


def test_report_renders_from_results(tmp_path: Path) -> None:
    run = {"row": "cpu", "kind": "ours", "status": "ok", "steps_per_s": 10.0, "best_val_acc": 0.8, "mag_epoch_s": 61.5,
           "val_curve": [[10, 1.0, 0.5], [20, 2.0, 0.8]], "step_ms": [100.0, 110.0], "batch_check": {"checked": 3, "ok": True}}  # fmt: skip
    results = {"args": {"preset": "ci", "fanouts": [5, 5]}, "graph": {"num_nodes": {"paper": 10}, "num_edges": {"a__b__c": 5}},
               "rows": {"cpu": "doc", "pyg": "doc"}, "runs": [run, {"row": "pyg", "status": "skipped", "reason": "no pyg-lib"}]}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(results))
    text = Path(render(str(tmp_path))).read_text()
    assert "| `cpu` | 10.00 |" in text and "61.5" in text and "skipped: no pyg-lib" in text


def test_ci_preset_end_to_end(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.e2e.hetero", "--preset", "ci", "--out", str(tmp_path / "out"),
                           "--cache-dir", str(tmp_path / "cache")], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = {r["row"]: r for r in results["runs"]}
    assert runs["cpu"]["status"] == "ok" and runs["cpu"]["batch_check"]["ok"], runs["cpu"]
    assert runs["model_only"]["status"] == "ok", runs["model_only"]
    assert (tmp_path / "out" / "report.md").exists()
