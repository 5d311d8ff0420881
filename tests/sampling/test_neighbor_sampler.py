"""Tests of :class:`lightning_zerocopy.sampling.NeighborSampler` (PyG NeighborLoader layout)."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import k_hop_subgraph

from lightning_zerocopy.graph import CSCGraph
from lightning_zerocopy.sampling import NeighborSampler, SampledBatch, validate_fanouts


def random_edge_index(num_nodes: int, num_edges: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    dst = torch.multinomial(torch.rand(num_nodes, generator=gen) ** 3 + 1e-3, num_edges, True, generator=gen)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    return torch.stack([src, dst])


@pytest.fixture(scope="module")
def edge_index() -> torch.Tensor:
    return random_edge_index(500, 4000, seed=0)


@pytest.fixture(scope="module")
def graph(edge_index: torch.Tensor) -> CSCGraph:
    return CSCGraph.from_edge_index(edge_index, 500)


def seeds_of(count: int, seed: int = 1) -> torch.Tensor:
    return torch.randperm(500, generator=torch.Generator().manual_seed(seed))[:count]


def test_edges_map_back_to_the_original_edge_list(edge_index: torch.Tensor, graph: CSCGraph) -> None:
    sampler = NeighborSampler(graph, fanouts=[5, 3])
    batch = sampler.sample(seeds_of(40), seed=3)
    assert isinstance(batch, SampledBatch)
    global_edges = batch.n_id[batch.edge_index]  # (2, E) global (source, target)
    assert torch.equal(edge_index[:, batch.e_id], global_edges)
    assert batch.e_id.unique().numel() == batch.e_id.numel()  # no edge twice without replacement
    assert batch.edge_index.shape == (2, sum(batch.num_sampled_edges))
    assert batch.batch_size == 40 and torch.equal(batch.n_id[:40], seeds_of(40))
    assert sum(batch.num_sampled_nodes) == batch.n_id.numel()
    assert all(isinstance(n, int) for n in batch.num_sampled_nodes + batch.num_sampled_edges)
    assert bool((batch.edge_index[1, : batch.num_sampled_edges[0]] < batch.batch_size).all())


def test_full_fanout_reaches_the_k_hop_neighborhood(edge_index: torch.Tensor, graph: CSCGraph) -> None:
    seeds = seeds_of(6, seed=2)
    batch = NeighborSampler(graph, fanouts=[-1, -1]).sample(seeds, seed=0)
    subset, _, _, _ = k_hop_subgraph(seeds, 2, edge_index, num_nodes=500, flow="source_to_target")
    assert sorted(batch.n_id.tolist()) == sorted(subset.tolist())
    # Every incoming edge of every expanded node (seeds and hop-1 nodes) is sampled exactly once.
    expanded = batch.n_id[: batch.num_sampled_nodes[0] + batch.num_sampled_nodes[1]]
    into_expanded = torch.isin(edge_index[1], expanded).nonzero().flatten()
    assert torch.equal(batch.e_id.sort().values, into_expanded)


def test_tensors_and_graph_object_give_the_same_batch(graph: CSCGraph) -> None:
    from_graph = NeighborSampler(graph, fanouts=[4, 4], replace=True).sample(seeds_of(30), seed=9)
    from_tensors = NeighborSampler(graph.indptr, graph.indices, graph.edge_perm, [4, 4], True).sample(
        seeds_of(30), seed=9
    )
    for name in ("n_id", "edge_index", "e_id"):
        assert torch.equal(getattr(from_graph, name), getattr(from_tensors, name)), name
    assert from_graph.num_sampled_edges == from_tensors.num_sampled_edges


def test_without_edge_perm_e_id_is_the_position_in_indices(graph: CSCGraph) -> None:
    batch = NeighborSampler(graph.indptr, graph.indices, None, [3]).sample(seeds_of(20), seed=4)
    assert torch.equal(graph.indices[batch.e_id].long(), batch.n_id[batch.edge_index[0]])


def test_num_threads_gives_the_same_batch_and_restores_threads(graph: CSCGraph) -> None:
    before = torch.get_num_threads()
    one = NeighborSampler(graph, fanouts=[6, 4], num_threads=1).sample(seeds_of(100), seed=5)
    default = NeighborSampler(graph, fanouts=[6, 4]).sample(seeds_of(100), seed=5)
    assert torch.get_num_threads() == before
    assert torch.equal(one.edge_index, default.edge_index) and torch.equal(one.n_id, default.n_id)


def test_batch_feeds_a_pyg_model(graph: CSCGraph) -> None:
    torch.manual_seed(0)
    batch = NeighborSampler(graph, fanouts=[5, 5]).sample(seeds_of(16), seed=1)
    x = torch.randn(500, 8)
    data = Data(x=x[batch.n_id], edge_index=batch.edge_index, n_id=batch.n_id, batch_size=batch.batch_size)
    conv1, conv2 = SAGEConv(8, 16), SAGEConv(16, 3)
    out = conv2(conv1(data.x, data.edge_index).relu(), data.edge_index)[: data.batch_size]
    assert out.shape == (16, 3) and torch.isfinite(out).all()


@pytest.mark.parametrize(
    ("fanouts", "error", "match"),
    [
        ([], ValueError, "`fanouts` is empty"),
        ([5, 0], ValueError, r"`fanouts\[1\]`"),
        ([-2], ValueError, r"`fanouts\[0\]`"),
        ([5, "3"], TypeError, r"`fanouts\[1\]`"),
        ([2.0], TypeError, r"`fanouts\[0\]`"),
        ([True], TypeError, r"`fanouts\[0\]`"),
        (5, TypeError, "`fanouts` must be a sequence"),
    ],
)
def test_bad_fanouts_are_rejected_in_python(fanouts, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        validate_fanouts(fanouts)


def test_constructor_errors(graph: CSCGraph) -> None:
    with pytest.raises(ValueError, match="`fanouts` is required"):
        NeighborSampler(graph)
    with pytest.raises(ValueError, match="either a graph object"):
        NeighborSampler(graph, graph.indices, fanouts=[2])
    with pytest.raises(ValueError, match="`indices` is required"):
        NeighborSampler(graph.indptr, fanouts=[2])
    with pytest.raises(ValueError, match="`edge_perm`"):
        NeighborSampler(graph.indptr, graph.indices, graph.edge_perm[:-1], [2])
    with pytest.raises(ValueError, match="`num_threads`"):
        NeighborSampler(graph, fanouts=[2], num_threads=0)


def test_bad_seeds_raise_naming_seeds(graph: CSCGraph) -> None:
    sampler = NeighborSampler(graph, fanouts=[2])
    with pytest.raises(IndexError, match="`seeds"):
        sampler.sample(torch.tensor([0, 500]), seed=0)
    with pytest.raises(ValueError, match="`seeds` must be unique"):
        sampler.sample(torch.tensor([7, 7]), seed=0)
