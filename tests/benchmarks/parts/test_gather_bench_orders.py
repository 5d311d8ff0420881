"""benchmarks/parts/gather.py's node-order helpers (CPU): id maps, page counting, and the --pages-only path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from lightning_zerocopy.gather import frequency_order
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.graph.reorder import NodeOrder, bfs_order, degree_order

_PATH = Path(__file__).resolve().parents[3] / "benchmarks" / "parts" / "gather.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gather_benchmark", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # importing must not need a GPU
    return module


def test_orders_map_the_same_rows_to_new_ids(bench) -> None:
    num_nodes = 3000
    indptr, indices = bench.power_law_csc_gpu(num_nodes, 6.0, 0.6, seed=3, device="cpu")
    assert indptr.device.type == "cpu" and int(indptr[-1]) == indices.numel() == 18000
    ranks, seconds = bench.node_order_ranks(indptr, indices, num_nodes)
    assert set(ranks) == set(bench.ORDERS) == set(seconds)
    graph = CSCGraph(indptr, indices, None, num_nodes)
    expected = {
        "bfs": bfs_order(graph).order,
        "degree": degree_order(graph).order,
        "freq": frequency_order(indices, num_nodes),
    }
    x = torch.randn(num_nodes, 4)
    ids = torch.randint(0, num_nodes, (500,))
    for name, rank in ranks.items():
        order = expected[name]
        assert torch.equal(rank[order], torch.arange(num_nodes)), f"{name}: rank is the inverse of the order"
        renumbered = NodeOrder.from_order(order).relabel_rows(x)  # the table as the order stores it
        assert torch.equal(renumbered[rank[ids]], x[ids]), f"{name}: rank[ids] reads the same rows"
    assert not torch.equal(ranks["bfs"], torch.arange(num_nodes))
    assert torch.equal(ranks["degree"], ranks["freq"]), "degree_order is the frequency order"


def test_degree_order_puts_the_most_sampled_nodes_first() -> None:
    # directed: node 7 is an in-neighbor of every other node (sampled often) but has no in-edges itself
    others = torch.tensor([i for i in range(10) if i != 7])
    edge_index = torch.cat([torch.stack([torch.full_like(others, 7), others]), torch.tensor([[1, 2], [3, 3]])], 1)
    order = degree_order(CSCGraph.from_edge_index(edge_index, num_nodes=10)).order
    assert order[:3].tolist() == [7, 1, 2]


@pytest.mark.parametrize("row_bytes", [128, 100, 2048, 4100, 8192])
def test_pages_touched_counts_every_page_a_row_spans(bench, row_bytes) -> None:
    ids = torch.randint(0, 5000, (700,))
    pages = set()
    for i in ids.tolist():
        start, stop = i * row_bytes, (i + 1) * row_bytes - 1
        pages.update(range(start // 4096, stop // 4096 + 1))
    assert bench.pages_touched(ids, row_bytes) == len(pages)


def test_pages_only_runs_without_a_gpu(bench, tmp_path: Path) -> None:
    common = ["--pages-only", "--device", "cpu", "--batch-size", "32", "--fanouts", "4", "3", "--warmup", "0",
              "--batches", "2", "--out", str(tmp_path / "pages.json")]  # fmt: skip
    report = bench.main([*common, "--table-gib", "0.001", "--row-bytes", "128,512"])
    assert (tmp_path / "pages.json").is_file()
    for r in report["results"]:
        assert set(r["pages_per_batch_mean"]) == {"shuffled", *bench.ORDERS}
        for pages in r["pages_per_batch_mean"].values():
            assert 0 < pages <= r["rows_per_batch_mean"]
    synthetic = bench.main([*common, "--graph", "synthetic", "--synthetic-nodes", "2000", "--avg-degree", "8",
                            "--row-bytes", "128", "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    assert synthetic["results"][0]["num_rows"] == 2000
