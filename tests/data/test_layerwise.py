"""Layer-wise inference (``data/layerwise.py``): every node's outputs equal a full-graph forward of the same module,
for untyped and typed graphs, float32 on the CPU within ``TOL`` (|diff| <= 1e-5 + 1e-5 |ref|: a node's neighbor sum runs
in another order than the full graph's scatter; measured ~1e-7); host memory holds the features and at most two
layers of outputs; bf16 storage; the last layer on the predicted nodes only; bad input is one line."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import SAGEConv
from torch_geometric.nn.models import GIN
from torch_geometric.nn.models import GraphSAGE as PyGGraphSAGE

from helpers.hetero import PAPER, TinyHeteroDataset
from helpers.layerwise import run_pass
from helpers.layerwise_user import UserGNN
from lightning_zerocopy import ZeroCopyDataModule, ZeroCopyHeteroDataModule
from lightning_zerocopy.data.layer_tables import LayerTable
from lightning_zerocopy.data import layerwise_options
from lightning_zerocopy.data.layerwise_options import LayerwiseOptions, layerwise_placement
from lightning_zerocopy.data.layerwise_plan import batch_bounds
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GAT, GraphSAGE, HeteroLinkPredictor, HeteroNodeClassifier, NodeClassifier
from lightning_zerocopy.models.layerwise import layerwise_module
from lightning_zerocopy.options import RecipeError, RunEnvironmentError

TOL = dict(atol=1e-5, rtol=1e-5)
CPU = torch.device("cpu")
FEATURES = 8


def _with_running_stats(net: torch.nn.Module) -> torch.nn.Module:
    """BatchNorm layers with non-trivial running statistics (eval mode uses them per node)."""
    g = torch.Generator().manual_seed(1)
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.running_mean.copy_(torch.randn(module.num_features, generator=g))
            module.running_var.copy_(torch.rand(module.num_features, generator=g) + 0.5)
    return net


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> SyntheticGraph:
    return SyntheticGraph(num_nodes=600, avg_degree=6, num_features=FEATURES, num_classes=3,
                          cache_dir=str(tmp_path_factory.mktemp("graph")))  # fmt: skip


def _datamodule(dataset: Any, **kwargs: Any) -> ZeroCopyDataModule:
    dm = ZeroCopyDataModule(dataset, fanouts=[4, 4], batch_size=64, num_threads=1, **kwargs)
    dm.setup()
    return dm


def _hidden(net: Any, layers: int, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
    """The first ``layers`` layers of a BasicGNN on the whole graph (PyG's own per-layer function, one batch)."""
    with torch.no_grad():
        for layer in range(layers):
            x = net.inference_per_layer(layer, x, edge_index, x.shape[0])
    return x


@pytest.mark.parametrize("make", [
    lambda: GraphSAGE(FEATURES, 3, hidden_channels=16, num_layers=3),
    lambda: GAT(FEATURES, 3, hidden_channels=16, num_layers=2, heads=2),
    lambda: UserGNN(GIN(FEATURES, 16, 2, 3)),
    lambda: UserGNN(_with_running_stats(PyGGraphSAGE(FEATURES, 16, 3, 3, norm="batch_norm", jk="last"))),
], ids=["sage", "gat", "user-gin", "user-sage-bn-jk"])  # fmt: skip
def test_untyped_outputs_equal_a_full_graph_forward(dataset: SyntheticGraph, make: Any) -> None:
    torch.manual_seed(0)
    model, dm = make().eval(), _datamodule(dataset)
    try:
        result = run_pass(dm, model)
        data = dataset.load()
        with torch.no_grad():
            full = model(data.x, data.edge_index)
        out = result.tables["_N"].data
        assert out.shape == full.shape and result.node_ids["_N"] is None
        torch.testing.assert_close(out, full, **TOL)
        assert all(s.batches > 1 for s in result.stats)  # the graph was cut into batches, every layer
        assert all(0 < s.sample_seconds < s.seconds for s in result.stats)  # the sampler's share, timed
        result.close()
    finally:
        dm.teardown()


def test_a_node_ordered_host_copy_gives_the_datasets_order(dataset: SyntheticGraph) -> None:
    torch.manual_seed(0)
    model, dm = GraphSAGE(FEATURES, 3, hidden_channels=16, num_layers=2).eval(), _datamodule(dataset, node_order="bfs")
    try:
        assert dm.resources.host.order is not None
        result = run_pass(dm, model)
        data = dataset.load()
        with torch.no_grad():
            full = model(data.x, data.edge_index)
        torch.testing.assert_close(result.tables["_N"].data, full, **TOL)
        result.close()
    finally:
        dm.teardown()


@pytest.fixture(scope="module")
def typed_dm() -> Any:
    dm = ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[3, 3], batch_size=8, num_threads=1)
    dm.setup()
    yield dm
    dm.teardown()


@pytest.mark.parametrize("conv", ["sage", "gat"])
def test_typed_outputs_equal_a_full_graph_forward(typed_dm: Any, conv: str) -> None:
    torch.manual_seed(0)
    ds = TinyHeteroDataset()
    model = HeteroNodeClassifier({PAPER: 8, "institution": 4}, 3, hidden_channels=8, num_layers=3, conv=conv, heads=2,
                                 node_types=ds.node_types, edge_types=ds.edge_types, num_nodes=ds.num_nodes,
                                 input_type=PAPER)  # fmt: skip
    result = run_pass(typed_dm, model, batch_size=7, max_batch_edges=20)
    data = ds.load()
    with torch.no_grad():
        full = model.eval().net(data.x, data.edge_index, {t: torch.arange(n) for t, n in data.num_nodes.items()})
    assert list(result.tables) == [PAPER]  # the last layer outputs the input type only
    torch.testing.assert_close(result.tables[PAPER].data, full, **TOL)
    assert [len(s) for _, s in result.live_layers] == [1, 2, 2]
    result.close()


def test_typed_link_encoder_outputs_every_node_type(typed_dm: Any) -> None:
    torch.manual_seed(0)
    ds = TinyHeteroDataset()
    model = HeteroLinkPredictor((ds.node_types, ds.edge_types), {PAPER: 8, "institution": 4}, ds.num_nodes,
                                ds.edge_types[1], hidden_channels=8, num_layers=2)  # fmt: skip
    result = run_pass(typed_dm, model, batch_size=5)
    data, batch = ds.load(), HeteroData()
    for node_type, count in data.num_nodes.items():
        batch[node_type].n_id = torch.arange(count)
        if node_type in data.x:
            batch[node_type].x = data.x[node_type]
    for edge_type, edge_index in data.edge_index.items():
        batch[edge_type].edge_index = edge_index
    with torch.no_grad():
        full = model.eval().embed(batch)
    assert set(result.tables) == set(ds.node_types)
    for node_type, rows in full.items():
        torch.testing.assert_close(result.tables[node_type].data, rows, **TOL)
    result.close()


class MapsRecorder:
    """Wraps a module's contract; at every step records which layers' host tables this process maps (their segments
    are named ``lzc-<pid>-<id>-layer<L>_<type>``, unlinked once mapped: ``(deleted)`` in ``/proc/self/maps``)."""

    def __init__(self, model: Any) -> None:
        self.model, self.seen = model.eval(), []

    def layerwise_layers(self) -> Any:
        return self.model.layerwise_layers()

    def layerwise_step(self, layer: int, block: Any) -> Any:
        with open("/proc/self/maps", encoding="utf-8") as f:
            names = {line.split()[-2] for line in f if "-layer" in line and "(deleted)" in line}
        self.seen.append((layer, sorted({int(n.rsplit("-layer", 1)[1].split("_")[0]) for n in names})))
        return self.model.layerwise_step(layer, block)


def test_host_memory_holds_at_most_two_layers_of_outputs(dataset: SyntheticGraph) -> None:
    torch.manual_seed(0)
    model, dm = GraphSAGE(FEATURES, 3, hidden_channels=16, num_layers=4).eval(), _datamodule(dataset)
    try:
        recorder = MapsRecorder(model)
        result = run_pass(dm, recorder, storage="host")
        probes, steps = recorder.seen[:4], recorder.seen[4:]  # one shape probe per layer first, before any table
        assert [layer for layer, _ in probes] == [0, 1, 2, 3] and all(not mapped for _, mapped in probes)
        last = [mapped for layer, mapped in steps if layer == 3]
        assert last and all(mapped == [2, 3] for mapped in last)  # layer 3 reads layer 2's table, writes its own
        for layer, mapped in recorder.seen:
            assert set(mapped) <= {layer - 1, layer}, (layer, mapped)
        assert result.live_layers == [(0, (0,)), (1, (0, 1)), (2, (1, 2)), (3, (2, 3))]
        assert [t.storage for t in result.tables.values()] == ["host"]
        result.close()
        with open("/proc/self/maps", encoding="utf-8") as f:
            assert not [line for line in f if "-layer" in line and "(deleted)" in line]  # every table unmapped
    finally:
        dm.teardown()


def test_bfloat16_storage_is_close_and_stored_in_bfloat16(dataset: SyntheticGraph) -> None:
    torch.manual_seed(0)
    model, dm = GraphSAGE(FEATURES, 3, hidden_channels=16, num_layers=2).eval(), _datamodule(dataset)
    try:
        result = run_pass(dm, model, dtype="bfloat16")
        data = dataset.load()
        with torch.no_grad():
            full = model(data.x, data.edge_index)
        table = result.tables["_N"]
        assert table.dtype == torch.bfloat16 and table.compute_dtype == torch.float32
        torch.testing.assert_close(table.data.float(), full, atol=5e-2, rtol=5e-2)
        result.close()
    finally:
        dm.teardown()


def test_the_last_layer_runs_on_the_predicted_nodes_only(dataset: SyntheticGraph) -> None:
    torch.manual_seed(0)
    model, dm = GraphSAGE(FEATURES, 3, hidden_channels=16, num_layers=2).eval(), _datamodule(dataset)
    try:
        targets = torch.tensor([590, 3, 17, 3, 250])
        result = run_pass(dm, model, targets={"_N": targets})
        data = dataset.load()
        with torch.no_grad():
            full = model(data.x, data.edge_index)
        ids = result.node_ids["_N"]
        assert ids.tolist() == [3, 17, 250, 590]
        torch.testing.assert_close(result.tables["_N"].data, full[ids], **TOL)
        assert result.stats[-1].dst_nodes == 4 and result.stats[0].dst_nodes == 600
        result.close()
    finally:
        dm.teardown()


def test_a_hidden_layers_embeddings_are_a_memory_mapped_npy(dataset: SyntheticGraph, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, dm = GraphSAGE(FEATURES, 3, hidden_channels=16, num_layers=3).eval(), _datamodule(dataset)
    try:
        path = tmp_path / "emb.npy"
        result = run_pass(dm, model, embeddings=1, embeddings_path=path)
        assert result.embeddings == {"_N": path} and not path.with_name("emb.npy.partial").exists()
        data = dataset.load()
        saved = np.load(path, mmap_mode="r")
        assert saved.dtype == np.float32 and saved.shape == (600, 16)
        torch.testing.assert_close(torch.from_numpy(np.array(saved)), _hidden(model.net, 2, data.x, data.edge_index),
                                   **TOL)  # fmt: skip
        with torch.no_grad():  # and the next layer read the file table: the logits are still exact
            torch.testing.assert_close(result.tables["_N"].data, model(data.x, data.edge_index), **TOL)
        result.close()
    finally:
        dm.teardown()


def test_batches_hold_at_most_batch_size_nodes_and_max_edges_in_edges() -> None:
    degrees = np.array([3, 1, 9, 0, 0, 2, 2, 2, 20, 1])
    cum = np.concatenate([[5], 5 + np.cumsum(degrees)])  # any offset (a CSC pointer's slice)
    bounds = batch_bounds(cum, batch_size=3, max_edges=6)
    assert bounds == [0, 2, 3, 6, 8, 9, 10]  # node 2 (9 in-edges) and node 8 (20) are batches of their own
    for lo, hi in zip(bounds, bounds[1:]):
        assert hi - lo <= 3 and (degrees[lo:hi].sum() <= 6 or hi - lo == 1)
    assert batch_bounds(np.array([0]), 3, 6) == [0]


# ---- bad input: one line each -----------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


def test_a_module_without_the_contract_is_told_what_to_add() -> None:
    class Plain(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.head = SAGEConv(4, 8), torch.nn.Linear(8, 2)

    with pytest.raises(RecipeError) as caught:
        layerwise_module(Plain())
    message = _one_line(caught.value)
    assert "Plain cannot run layer-wise" in message and "layerwise_layers()" in message and "layerwise_step(" in message
    with pytest.raises(RecipeError, match="net is a Sequential, not a PyG BasicGNN") as caught:
        layerwise_module(NodeClassifier(torch.nn.Sequential(torch.nn.Linear(4, 2)), 2)).layerwise_layers()
    _one_line(caught.value)
    with pytest.raises(RecipeError, match="jk='cat'") as caught:
        layerwise_module(UserGNN(PyGGraphSAGE(4, 8, 2, 2, jk="cat")))
    _one_line(caught.value)


def test_a_sampled_fanout_with_layerwise_mode_is_refused(dataset: SyntheticGraph) -> None:
    with pytest.raises(ValueError, match=r"data.init_args.eval_fanouts samples 5 neighbors") as caught:
        ZeroCopyDataModule(dataset, fanouts=[5, 5], eval_fanouts=[5, -1], predict_mode="layerwise")
    _one_line(caught.value)
    ZeroCopyDataModule(dataset, fanouts=[5, 5], eval_fanouts=[-1, -1], predict_mode="layerwise")  # -1: fine
    with pytest.raises(ValueError, match=r"data.init_args.eval_num_neighbors samples 2 neighbors"):
        ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[2], eval_num_neighbors=[2],
                                 predict_mode="layerwise")  # fmt: skip
    with pytest.raises(ValueError, match="data.init_args.predict_mode must be"):
        ZeroCopyDataModule(dataset, predict_mode="exact")  # type: ignore[arg-type]


def test_a_target_path_that_cannot_hold_the_embeddings_is_one_line(
    dataset: SyntheticGraph, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, dm = GraphSAGE(FEATURES, 3, hidden_channels=16, num_layers=2).eval(), _datamodule(dataset)
    try:
        real = shutil.disk_usage
        monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1000))  # a nearly full disk
        path = tmp_path / "emb.npy"
        with pytest.raises(RunEnvironmentError) as caught:
            run_pass(dm, model, embeddings=0, embeddings_path=path)
        message = _one_line(caught.value)
        assert "data.init_args.layerwise.embeddings_path" in message and "38,400 bytes" in message, message
        assert not list(tmp_path.iterdir())  # nothing half-written is left
        monkeypatch.undo()
        with pytest.raises(RunEnvironmentError, match="cannot be written") as caught:
            run_pass(dm, model, embeddings=0, embeddings_path=tmp_path / "missing" / "emb.npy")
        _one_line(caught.value)
    finally:
        dm.teardown()


def test_options_that_do_not_fit_are_one_line(dataset: SyntheticGraph) -> None:
    model, dm = GraphSAGE(FEATURES, 3, hidden_channels=16, num_layers=2).eval(), _datamodule(dataset)
    try:
        with pytest.raises(RecipeError, match="storage: gpu keeps every layer's outputs in one GPU's memory"):
            run_pass(dm, model, storage="gpu")
        with pytest.raises(ValueError, match="embeddings is 2, but the model has 2 layers"):
            run_pass(dm, model, embeddings=2, embeddings_path=Path("unused.npy"))
        with pytest.raises(ValueError, match="data.init_args.layerwise.max_batch_edges must be >= 1"):
            LayerwiseOptions(max_batch_edges=0)
    finally:
        dm.teardown()


@pytest.mark.parametrize("choice,placement,gather,device,expected", [
    ("auto", "gpu", "zerocopy", 0, "gpu"),
    ("auto", "uva", "zerocopy", 0, "uva"),
    ("auto", "cpu", "zerocopy", 0, "uva"),  # CPU threads give way to the GPU sampler reading the graph in place
    ("auto", "hybrid", "zerocopy", 0, "uva"),
    ("auto", "cpu", "cpu", 0, "cpu"),  # a GPU run that gathers on the CPU keeps the CPU
    ("auto", "cpu", "cpu", None, "cpu"),
    ("cpu", "gpu", "zerocopy", 0, "cpu"),
    ("gpu", "cpu", "zerocopy", 0, "gpu"),
])  # fmt: skip
def test_the_passs_sampler_placement(monkeypatch: pytest.MonkeyPatch, choice: str, placement: str, gather: str,
                                     device: Any, expected: str) -> None:  # fmt: skip
    monkeypatch.setattr(layerwise_options, "cuda_build_problem", lambda: None)  # as on a CUDA build
    assert layerwise_placement(choice, placement, gather, device) == expected


def test_auto_keeps_the_cpu_where_the_build_has_no_cuda_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layerwise_options, "cuda_build_problem", lambda: "this torch is a CPU-only build")
    assert layerwise_placement("auto", "cpu", "zerocopy", 0) == "cpu"


def test_a_gpu_sampler_placement_without_a_gpu_is_one_line(dataset: SyntheticGraph) -> None:
    with pytest.raises(RecipeError, match=r"layerwise.sampler_placement='uva' samples on a CUDA GPU, but this run has "
                                         r"none: use 'auto' or 'cpu'"):  # fmt: skip
        layerwise_placement("uva", "cpu", "cpu", None)
    with pytest.raises(ValueError, match="data.init_args.layerwise.sampler_placement"):
        LayerwiseOptions(sampler_placement="tpu")  # type: ignore[arg-type]
    dm = _datamodule(dataset, layerwise=LayerwiseOptions(sampler_placement="gpu"))
    try:
        with pytest.raises(RecipeError, match="layerwise.sampler_placement='gpu' samples on a CUDA GPU"):
            dm.builder("predict", layerwise=True)
    finally:
        dm.teardown()


def test_the_commands_builder_takes_every_in_neighbor_on_the_cpu(dataset: SyntheticGraph, typed_dm: Any) -> None:
    dm = _datamodule(dataset)
    try:
        builder = dm.builder("predict", layerwise=True)
        assert (builder.sampler_placement, builder.fanouts, builder.node_keyed) == ("cpu", [-1], False)
    finally:
        dm.teardown()
    typed = typed_dm.builder("predict", layerwise=True)
    assert typed.fanouts == {et: [-1] for et in typed_dm.schema.edge_types}


def test_a_closed_table_says_so() -> None:
    table = LayerTable(torch.zeros(2, 2), "gpu", 1, "_N", torch.float32)
    table.close()
    with pytest.raises(RuntimeError, match="table of layer 1"):
        table.gather(torch.tensor([0]), CPU)
