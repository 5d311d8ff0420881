"""The heterogeneous benchmark (``benchmarks/end_to_end/hetero/``): its presets' graphs and its parts (the batch check on
PyG-layout batches, PyG's ``HeteroData`` of a dataset, the model). What it shares with the link benchmark (rows,
flags, the report, the ``ci`` preset end to end): ``test_one_model_benchmarks.py``."""

from __future__ import annotations

from types import SimpleNamespace

import torch
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
