"""Layer-wise inference on a GPU (``data/layerwise.py``): every node's outputs equal a full-graph forward of the same
module on the CPU, for each sampler placement and table storage, untyped and typed, within ``GPU_TOL``
(|diff| <= 1e-4 + 1e-4 |ref|, TF32 off: the GPU sums a node's messages in another order than the CPU, with atomics);
the GPU holds a batch's working set only (its peak does not grow with the graph, and stays far below the features
and a layer's outputs), so a graph whose features and layers do not fit in the GPU's allowance still runs.

Run on a GPU machine: ``REQUIRE_CUDA=1 python -m pytest -q -p no:cacheprovider -m cuda tests/data/test_layerwise_gpu.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch_geometric.nn.models import GIN

from helpers.hetero import PAPER, TinyHeteroDataset
from helpers.layerwise import run_pass
from helpers.layerwise_user import UserGNN
from lightning_zerocopy import ZeroCopyDataModule, ZeroCopyHeteroDataModule
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GAT, GraphSAGE, HeteroNodeClassifier

pytestmark = pytest.mark.cuda

GPU_TOL = dict(atol=1e-4, rtol=1e-4)
FEATURES = 8
CUDA = torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def no_tf32() -> Iterator[None]:
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _on_gpu(dm: Any) -> Any:
    """``dm`` set up as under a one-GPU trainer (placement and gather resolved for ``cuda:0``)."""
    dm.trainer = pl.Trainer(accelerator="gpu", devices=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False)  # fmt: skip
    dm.setup()
    return dm


def _dataset(tmp: Path, num_nodes: int, features: int = FEATURES) -> SyntheticGraph:
    return SyntheticGraph(num_nodes=num_nodes, avg_degree=6, num_features=features, num_classes=3,
                          cache_dir=str(tmp / f"graph{num_nodes}x{features}"))  # fmt: skip


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> SyntheticGraph:
    return _dataset(tmp_path_factory.mktemp("gpu-layerwise"), 600)


MODELS = {
    "sage": lambda: GraphSAGE(FEATURES, 3, hidden_channels=16, num_layers=3),
    "gat": lambda: GAT(FEATURES, 3, hidden_channels=16, num_layers=2, heads=2),
    "user-gin": lambda: UserGNN(GIN(FEATURES, 16, 2, 3)),
}


@pytest.mark.parametrize("placement,storage,model,node_order", [
    ("gpu", "gpu", "sage", "none"),
    ("gpu", "host", "user-gin", "none"),
    ("gpu", "auto", "sage", "bfs"),
    ("uva", "host", "gat", "none"),
    ("cpu", "host", "sage", "none"),
])  # fmt: skip
def test_untyped_outputs_on_a_gpu_equal_a_full_graph_forward(dataset: SyntheticGraph, placement: str, storage: str,
                                                              model: str, node_order: str) -> None:  # fmt: skip
    torch.manual_seed(0)
    net = MODELS[model]().eval()
    data = dataset.load()
    with torch.no_grad():
        full = net(data.x, data.edge_index)  # on the CPU, before the pass moves the module
    dm = _on_gpu(ZeroCopyDataModule(dataset, fanouts=[4, 4], batch_size=64, num_threads=1, sampler_placement=placement,
                                    node_order=node_order))  # fmt: skip
    try:
        result = run_pass(dm, net, CUDA, storage=storage)
        table = result.tables["_N"]
        assert table.storage == ("gpu" if storage == "auto" else storage)  # auto: a small graph's layers fit
        torch.testing.assert_close(table.data.to("cpu", torch.float32), full, **GPU_TOL)
        assert all(s.batches > 1 for s in result.stats)
        assert all(0 < s.sample_seconds < s.seconds for s in result.stats)
        result.close()
    finally:
        dm.teardown()


@pytest.mark.parametrize("placement,expected", [("cpu", "uva"), ("hybrid", "uva"), ("gpu", "gpu")])
def test_the_command_samples_the_pass_on_the_gpu_with_the_same_outputs(dataset: SyntheticGraph, placement: str,
                                                                      expected: str) -> None:  # fmt: skip
    """``layerwise.sampler_placement: auto`` (the default): a DataModule that samples on CPU threads (or hybrid) runs
    the predict command's pass on the GPU sampler reading the graph in place; the outputs are a full-graph forward's."""
    torch.manual_seed(0)
    net = MODELS["sage"]().eval()
    data = dataset.load()
    with torch.no_grad():
        full = net(data.x, data.edge_index)
    dm = _on_gpu(ZeroCopyDataModule(dataset, fanouts=[4, 4], batch_size=64, num_threads=1, sampler_placement=placement))
    try:
        assert dm.builder("predict", layerwise=True).sampler_placement == expected
        result = run_pass(dm, net, CUDA, as_the_command=True)
        torch.testing.assert_close(result.tables["_N"].data.to("cpu", torch.float32), full, **GPU_TOL)
        result.close()
    finally:
        dm.teardown()


def test_a_hidden_layers_embeddings_and_bfloat16_tables_on_a_gpu(dataset: SyntheticGraph, tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = GraphSAGE(FEATURES, 3, hidden_channels=16, num_layers=3).eval()
    data = dataset.load()
    with torch.no_grad():
        full = net(data.x, data.edge_index)
        hidden = data.x
        for layer in range(2):
            hidden = net.net.inference_per_layer(layer, hidden, data.edge_index, data.num_nodes)
    dm = _on_gpu(ZeroCopyDataModule(dataset, fanouts=[4, 4], batch_size=64, num_threads=1))
    try:
        path = tmp_path / "emb.npy"
        result = run_pass(dm, net, CUDA, storage="host", embeddings=1, embeddings_path=path)
        torch.testing.assert_close(torch.from_numpy(np.load(path)), hidden, **GPU_TOL)  # the file table, from a GPU
        torch.testing.assert_close(result.tables["_N"].data.float(), full, **GPU_TOL)  # layer 2 read the file
        result.close()
        result = run_pass(dm, net, CUDA, storage="host", dtype="bfloat16")
        assert result.tables["_N"].dtype == torch.bfloat16
        torch.testing.assert_close(result.tables["_N"].data.float(), full, atol=5e-2, rtol=5e-2)
        result.close()
    finally:
        dm.teardown()


@pytest.mark.parametrize("conv,storage", [("sage", "host"), ("gat", "gpu")])
def test_typed_outputs_on_a_gpu_equal_a_full_graph_forward(conv: str, storage: str) -> None:
    torch.manual_seed(0)
    ds = TinyHeteroDataset()
    model = HeteroNodeClassifier({PAPER: 8, "institution": 4}, 3, hidden_channels=8, num_layers=3, conv=conv, heads=2,
                                 node_types=ds.node_types, edge_types=ds.edge_types, num_nodes=ds.num_nodes,
                                 input_type=PAPER).eval()  # fmt: skip
    data = ds.load()
    with torch.no_grad():
        full = model.net(data.x, data.edge_index, {t: torch.arange(n) for t, n in data.num_nodes.items()})
    dm = _on_gpu(ZeroCopyHeteroDataModule(ds, num_neighbors=[3, 3], batch_size=8, num_threads=1))
    try:
        result = run_pass(dm, model, CUDA, batch_size=7, max_batch_edges=20, storage=storage)
        torch.testing.assert_close(result.tables[PAPER].data.to("cpu", torch.float32), full, **GPU_TOL)
        result.close()
    finally:
        dm.teardown()


def _peak_gpu_bytes(tmp: Path, num_nodes: int, width: int, batch_size: int, max_edges: int) -> tuple[int, int]:
    """The pass's peak GPU memory above what was allocated before it, and the bytes of the features."""
    dataset = _dataset(tmp, num_nodes, width)
    dm = _on_gpu(ZeroCopyDataModule(dataset, fanouts=[4, 4], batch_size=64, num_threads=1, sampler_placement="uva"))
    try:
        torch.manual_seed(0)
        net = GraphSAGE(width, 3, hidden_channels=width, num_layers=3).to(CUDA)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(CUDA)
        base = torch.cuda.memory_allocated(CUDA)
        result = run_pass(dm, net, CUDA, storage="host", batch_size=batch_size, max_batch_edges=max_edges)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(CUDA) - base
        assert all(t.storage == "host" for t in result.tables.values())
        result.close()
        return peak, num_nodes * width * 4
    finally:
        dm.teardown()


def test_the_gpu_holds_a_batchs_working_set_only(tmp_path: Path) -> None:
    """Features (fp32) and each layer's outputs stay in host memory: the GPU's peak during the pass is bounded by the
    batch (``batch_size`` nodes, ``max_batch_edges`` in-edges), the same for a graph three times larger."""
    width, batch_size, max_edges = 128, 256, 2048
    small, _ = _peak_gpu_bytes(tmp_path, 40_000, width, batch_size, max_edges)
    large, features = _peak_gpu_bytes(tmp_path, 120_000, width, batch_size, max_edges)
    working_set = (batch_size + max_edges) * width * 4  # one batch's gathered rows
    assert large <= 16 * working_set, (large, working_set)  # rows, messages, a layer's activations, the output
    assert large <= features // 4, (large, features)  # far from the features, let alone features + two layers
    assert large <= 1.25 * small + (1 << 20), (small, large)  # does not grow with the graph


def test_a_graph_beyond_the_gpus_allowance_runs(tmp_path: Path) -> None:
    """The caching allocator capped below the features alone (``set_per_process_memory_fraction``): the pass runs.
    The graph is large enough that half its features leave room for the allocator's 20 MiB segments (a 2 MiB block
    takes one): at 120,000 nodes the 30 MiB left once failed on such a segment (2 x H200, 2026-11-28)."""
    width, num_nodes = 128, 400_000
    dataset = _dataset(tmp_path, num_nodes, width)
    features = num_nodes * width * 4
    dm = _on_gpu(ZeroCopyDataModule(dataset, fanouts=[4, 4], batch_size=64, num_threads=1, sampler_placement="uva"))
    total = torch.cuda.get_device_properties(CUDA).total_memory
    try:
        torch.manual_seed(0)
        net = GraphSAGE(width, 3, hidden_channels=width, num_layers=2).to(CUDA)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        allowance = torch.cuda.memory_allocated(CUDA) + features // 2
        torch.cuda.set_per_process_memory_fraction(allowance / total, CUDA)
        try:
            result = run_pass(dm, net, CUDA, storage="host", batch_size=512, max_batch_edges=4096)
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, CUDA)
        assert result.tables["_N"].data.shape == (num_nodes, 3) and torch.isfinite(result.tables["_N"].data).all()
        result.close()
    finally:
        dm.teardown()
