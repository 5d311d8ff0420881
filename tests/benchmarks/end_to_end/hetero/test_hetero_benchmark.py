"""The heterogeneous benchmark (``benchmarks/end_to_end/hetero/``): its presets' graphs and its parts (the batch check on
PyG-layout batches, PyG's ``HeteroData`` of a dataset, the model). What it shares with the link benchmark (rows,
flags, the report, the ``ci`` preset end to end): ``test_one_model_benchmarks.py``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch
from helpers.one_model_runs import ONE_MODEL, run_benchmark
from helpers.hetero_batches import mag_like_graph, sample_batch

from benchmarks.end_to_end.hetero.__main__ import dataset_kwargs, parse_args
from benchmarks.end_to_end.hetero.report import mag_epoch_steps
from benchmarks.end_to_end.hetero.train import HeteroBatchCheck, build_model, hetero_data
from lightning_zerocopy.datasets.hetero import HeteroNodeData


def _node_data() -> tuple[SimpleNamespace, HeteroNodeData]:
    g = mag_like_graph()
    perm = torch.randperm(g.num_nodes["paper"], generator=torch.Generator().manual_seed(0))
    data = HeteroNodeData(num_nodes=g.num_nodes, edge_index=g.edge_index, x=g.x, input_type="paper", y=g.y,
                          train_idx=perm[:200].sort().values, val_idx=perm[200:250], test_idx=perm[250:])  # fmt: skip
    return g, data


def test_the_presets_graphs() -> None:
    """What a preset's graph is (rows, flags and their checks: ``test_one_model_benchmarks.py``)."""
    args = parse_args([])
    assert args.preset == "mag10x" and args.features == 128 and args.batch_size == 1024
    total = args.papers + args.authors + args.institutions + args.fields
    assert 18e6 < total < 22e6  # about 10x ogbn-mag's 1.94M nodes
    ci = parse_args(["--preset", "ci", "--papers", "500"])
    assert ci.papers == 500 and ci.fanouts == [5, 5] and dataset_kwargs(ci)["num_papers"] == 500
    assert mag_epoch_steps() == 615
    mag = parse_args(["--preset", "mag"])  # ogbn-mag's own counts (1,939,743 nodes)
    assert mag.papers + mag.authors + mag.institutions + mag.fields == 1_939_743


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


def test_batch_check_takes_the_host_tables_dtype() -> None:
    """With ``--feature-dtype bfloat16`` our rows hand over the dataset's rows rounded to bf16 (then cast to float32):
    right for a check told the stored dtype, wrong for one that compares with the float32 rows."""
    g, data = _node_data()
    batch = sample_batch(g, data.train_idx[:16], [4, 3])
    for node_type in batch.node_types:
        if "x" in batch[node_type]:
            batch[node_type].x = batch[node_type].x.to(torch.bfloat16).float()
    trainer = SimpleNamespace(global_step=0)
    told = HeteroBatchCheck(data, count=1, stored_dtype=torch.bfloat16)
    told.on_train_batch_start(trainer, None, batch, 0)
    assert told.result == {"checked": 1, "ok": True, "problems": []}
    untold = HeteroBatchCheck(data, count=1)
    untold.on_train_batch_start(trainer, None, batch, 0)
    assert not untold.result["ok"] and "paper.x differs" in untold.result["problems"][0]


def test_a_bf16_host_table_trains_our_rows_only(one_model_ci_run: Callable[[str], Path], tmp_path: Path) -> None:
    """``--feature-dtype bfloat16``: our row stores the paper features as bf16 and passes its batch check (against the
    rounded rows); model-only keeps float32; the report says so."""
    cache = one_model_ci_run("hetero").parent / "cache"  # the ci graph, drawn once
    out = tmp_path / "out"
    run_benchmark(ONE_MODEL["hetero"], "--preset", "ci", "--configs", "cpu,model_only", "--feature-dtype", "bfloat16",
                  "--out", str(out), "--cache-dir", str(cache))  # fmt: skip
    runs = {r["row"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert runs["cpu"]["status"] == "ok" and runs["cpu"]["batch_check"]["ok"], runs["cpu"]
    assert runs["cpu"]["feature_dtype"] == "bfloat16" and runs["model_only"]["feature_dtype"] == "float32"
    assert "our rows hold them as bfloat16" in (out / "report.md").read_text()


def test_the_cache_row_trains_under_the_strategy_with_the_budget_flag() -> None:
    """``zerocopy_ddp_mps``: ``zc_gpu_mps``'s data path under ``ZeroCopyDDPStrategy(cache_budget=--cache-budget)``;
    every other row keeps Lightning's default strategy."""
    from benchmarks.end_to_end.hetero.__main__ import ROWS
    from benchmarks.end_to_end.train import row_strategy
    from lightning_zerocopy.strategies import ZeroCopyDDPStrategy

    row, plain = ROWS["zerocopy_ddp_mps"], ROWS["zc_gpu_mps"]
    assert row.data == plain.data and row.pipeline == plain.pipeline and row.mps
    args = parse_args(["--cache-budget", "15%"])
    strategy = row_strategy(row, args)
    assert isinstance(strategy, ZeroCopyDDPStrategy) and strategy.cache_budget.text == "15%"
    assert row_strategy(plain, args) == "auto" and parse_args([]).cache_budget == "20%"


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
