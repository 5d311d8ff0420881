"""Tests of :mod:`lightning_zerocopy.sampling.cost_model`: the per-seed size estimate and the online time model."""

from __future__ import annotations

import random

import pytest
import torch

from lightning_zerocopy.graph import CSCGraph
from lightning_zerocopy.sampling import NeighborSampler
from lightning_zerocopy.sampling import cost_model
from lightning_zerocopy.sampling.cost_model import (
    LinearCostModel,
    SampleSizeEstimator,
    TypedSampleSizeEstimator,
    expected_sample_edges,
    expected_typed_sample_edges,
)
from lightning_zerocopy.sampling.neighbor_sampler import HeteroNeighborSampler


def _random_graph(num_nodes: int, num_edges: int, seed: int) -> CSCGraph:
    gen = torch.Generator().manual_seed(seed)
    dst = torch.multinomial(torch.rand(num_nodes, generator=gen) ** 3 + 1e-3, num_edges, True, generator=gen)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    return CSCGraph.from_edge_index(torch.stack([src, dst]), num_nodes)


def _reference(indptr: list[int], indices: list[int], fanouts: list[int], replace: bool) -> list[float]:
    """The recursion of the module docstring, node by node in plain Python."""
    n = len(indptr) - 1
    below = [0.0] * n
    for fanout in reversed(fanouts):
        now = []
        for v in range(n):
            nbrs = indices[indptr[v] : indptr[v + 1]]
            deg = len(nbrs)
            picks = float(deg if fanout < 0 else (fanout if deg and replace else min(deg, fanout)))
            mean = sum(below[u] for u in nbrs) / deg if deg else 0.0
            now.append(picks * (1.0 + mean))
        below = now
    return below


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[4], [5, 3], [3, -1, 2]])
def test_estimate_matches_the_recursion_in_small_chunks(monkeypatch, fanouts: list[int], replace: bool) -> None:
    graph = _random_graph(300, 2500, seed=1)
    monkeypatch.setattr(cost_model, "_CHUNK_EDGES", 37)  # many chunks, and nodes with more edges than a chunk
    got = expected_sample_edges(graph.indptr, graph.indices, fanouts, replace)
    want = torch.tensor(_reference(graph.indptr.tolist(), graph.indices.tolist(), fanouts, replace))
    assert got.dtype == torch.float32 and got.shape == (300,)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_estimate_is_exact_on_a_tree_where_no_node_is_reached_twice() -> None:
    # an in-tree: node v's in-neighbors are its children 3v+1..3v+3, so a sample never meets a node twice
    num_nodes = 1 + 3 + 9 + 27 + 81
    src = torch.arange(1, num_nodes)
    dst = (src - 1) // 3
    graph = CSCGraph.from_edge_index(torch.stack([src, dst]), num_nodes)
    fanouts = [2, 2, 1]
    estimate = SampleSizeEstimator.from_graph(graph.indptr, graph.indices, fanouts)
    sampler = NeighborSampler(graph, fanouts=fanouts)
    seeds = torch.tensor([1, 2, 3])  # disjoint subtrees
    for batch_seed in range(5):
        sample = sampler.sample(seeds, seed=batch_seed)
        assert estimate.size(seeds) == pytest.approx(sum(sample.num_sampled_edges) + seeds.numel())


def test_estimate_tracks_the_mean_sample_and_bounds_it_from_above() -> None:
    graph = _random_graph(2000, 20000, seed=2)
    fanouts = [6, 4]
    estimate = SampleSizeEstimator.from_graph(graph.indptr, graph.indices, fanouts)
    sampler = NeighborSampler(graph, fanouts=fanouts)
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        seeds = torch.randperm(2000, generator=gen)[:64]
        measured = sum(sum(sampler.sample(seeds, seed=s).num_sampled_edges) for s in range(40)) / 40
        predicted = estimate.size(seeds) - seeds.numel()
        assert 0.8 * predicted <= measured <= predicted  # de-duplication only removes edges


def test_estimator_checks_seeds() -> None:
    estimate = SampleSizeEstimator(torch.ones(10))
    assert estimate.size(torch.tensor([], dtype=torch.int64)) == 0.0
    assert estimate.size(torch.tensor([1, 2])) == 4.0
    with pytest.raises(IndexError, match="seed node id 10"):
        estimate.size(torch.tensor([3, 10]))
    with pytest.raises(ValueError, match="fanouts"):
        expected_sample_edges(torch.tensor([0, 0]), torch.tensor([], dtype=torch.int64), [])


# ---- typed graphs: the same recursion with types as data ---------------------------------------------------------

USER, ITEM = "user", "item"
FOLLOWS, RATES, RATED_BY = (USER, "follows", USER), (USER, "rates", ITEM), (ITEM, "rated_by", USER)
TYPED_NODES = {USER: 70, ITEM: 30}


def _typed_graph(seed: int, pad: bool = False) -> dict:
    """Three edge types over two node types of different sizes; every CSC covers the larger type's id space (as the
    typed host copy sizes it, so the kernel's bounds hold), ``pad`` ten targets more."""
    gen = torch.Generator().manual_seed(seed)
    graphs = {}
    for et, num_edges in ((FOLLOWS, 300), (RATES, 200), (RATED_BY, 200)):
        src, _, dst = et
        edges = torch.stack([torch.randint(0, TYPED_NODES[src], (num_edges,), generator=gen),
                             torch.randint(0, TYPED_NODES[dst], (num_edges,), generator=gen)])  # fmt: skip
        graphs[et] = CSCGraph.from_edge_index(edges, max(TYPED_NODES.values()) + (10 if pad else 0))
    return graphs


def _typed_reference(graphs: dict, fanouts: dict, replace: bool) -> dict[str, list[float]]:
    """The typed recursion of the module docstring, node by node in plain Python."""
    hops = len(next(iter(fanouts.values())))
    below = {t: [0.0] * n for t, n in TYPED_NODES.items()}
    for hop in reversed(range(hops)):
        now = {t: [0.0] * n for t, n in TYPED_NODES.items()}
        for et, graph in graphs.items():
            src, _, dst = et
            indptr, indices, fanout = graph.indptr.tolist(), graph.indices.tolist(), fanouts[et][hop]
            for v in range(TYPED_NODES[dst]):
                nbrs = indices[indptr[v] : indptr[v + 1]]
                deg = len(nbrs)
                picks = float(deg if fanout < 0 else (fanout if deg and replace else min(deg, fanout)))
                mean = sum(below[src][u] for u in nbrs) / deg if deg else 0.0
                now[dst][v] += picks * (1.0 + mean)
        below = now
    return below


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("replace", [False, True])
def test_typed_estimate_matches_the_recursion_per_type(pad: bool, replace: bool) -> None:
    graphs = _typed_graph(seed=4, pad=pad)
    fanouts = {FOLLOWS: [3, 2, 1], RATES: [2, -1, 2], RATED_BY: [4, 1, 3]}
    got = expected_typed_sample_edges({et: (g.indptr, g.indices) for et, g in graphs.items()}, TYPED_NODES, fanouts,
                                      replace)  # fmt: skip
    want = _typed_reference(graphs, fanouts, replace)
    assert set(got) == set(TYPED_NODES)
    for node_type, values in want.items():
        assert got[node_type].dtype == torch.float32 and got[node_type].shape == (TYPED_NODES[node_type],)
        torch.testing.assert_close(got[node_type], torch.tensor(values), rtol=1e-5, atol=1e-4)


def test_the_homogeneous_estimate_is_the_one_type_case() -> None:
    graph = _random_graph(200, 1500, seed=5)
    et = ("v", "e", "v")
    typed = expected_typed_sample_edges({et: (graph.indptr, graph.indices)}, {"v": 200}, {et: [4, 3]})
    assert torch.equal(typed["v"], expected_sample_edges(graph.indptr, graph.indices, [4, 3]))


@pytest.mark.parametrize("seeded", [[USER], [ITEM], [USER, ITEM]])
def test_typed_size_is_exact_for_one_full_hop_whatever_types_are_seeded(seeded: list[str]) -> None:
    # with every neighbor taken on one hop the sample has exactly the in-edges of its seeds (no de-duplication of
    # edges), so the size is the batch's edges over every edge type plus one per seed
    graphs = _typed_graph(seed=6)
    fanouts = {et: [-1] for et in graphs}
    estimate = TypedSampleSizeEstimator.from_graphs({et: (g.indptr, g.indices) for et, g in graphs.items()},
                                                    TYPED_NODES, fanouts)  # fmt: skip
    sampler = HeteroNeighborSampler(graphs, list(TYPED_NODES), fanouts, num_threads=1)
    gen = torch.Generator().manual_seed(7)
    seeds = {t: torch.randperm(TYPED_NODES[t], generator=gen)[:9] for t in seeded}
    sample = sampler.sample(seeds, seed=3)
    edges = sum(sum(counts) for counts in sample.num_sampled_edges.values())
    assert estimate.size(seeds) == pytest.approx(edges + 9 * len(seeded))


def test_typed_estimate_checks_its_inputs() -> None:
    graphs = {et: (g.indptr, g.indices) for et, g in _typed_graph(seed=8).items()}
    fanouts = {et: [2, 2] for et in graphs}
    with pytest.raises(ValueError, match="`fanouts` must name exactly the edge types"):
        expected_typed_sample_edges(graphs, TYPED_NODES, {FOLLOWS: [2, 2]})
    with pytest.raises(ValueError, match="as many fanouts"):
        expected_typed_sample_edges(graphs, TYPED_NODES, {**fanouts, RATES: [2]})
    with pytest.raises(ValueError, match="names 'item', not one of the node types"):
        expected_typed_sample_edges(graphs, {USER: 70}, fanouts)
    estimate = TypedSampleSizeEstimator.from_graphs(graphs, TYPED_NODES, fanouts)
    assert estimate.size({}) == 0.0
    with pytest.raises(ValueError, match="`seeds` names 'shop', not one of the node types"):
        estimate.size({"shop": torch.tensor([0])})
    with pytest.raises(IndexError, match="seed node id 30 is out of range for a graph of 30 nodes"):
        estimate.size({USER: torch.tensor([1]), ITEM: torch.tensor([30])})


def test_linear_model_fits_a_line_and_floors_predictions() -> None:
    model = LinearCostModel(forgetting=1.0)
    assert not model.calibrated and model.predict(100.0) == model.min_seconds
    rng = random.Random(0)
    for _ in range(50):
        size = rng.uniform(1e3, 1e5)
        model.observe(size, 2e-3 + 3e-8 * size)
    a, b = model.coefficients
    assert a == pytest.approx(2e-3, rel=1e-3) and b == pytest.approx(3e-8, rel=1e-3)
    assert model.predict(5e4) == pytest.approx(2e-3 + 1.5e-3, rel=1e-3)
    model.observe(float("nan"), 1.0)  # ignored
    model.observe(10.0, -1.0)  # ignored
    assert model.observations == 50


def test_linear_model_forgets_and_follows_a_slower_device() -> None:
    model = LinearCostModel(forgetting=0.9)
    rng = random.Random(1)
    for _ in range(40):
        size = rng.uniform(1e3, 1e4)
        model.observe(size, 1e-3 + 1e-7 * size)
    assert model.predict(5e3) == pytest.approx(1.5e-3, rel=0.01)
    for _ in range(60):  # the device now takes three times as long (it trains a model, say)
        size = rng.uniform(1e3, 1e4)
        model.observe(size, 3 * (1e-3 + 1e-7 * size))
    assert model.predict(5e3) == pytest.approx(4.5e-3, rel=0.02)


def test_linear_model_survives_constant_sizes_without_windup() -> None:
    model = LinearCostModel(forgetting=0.8)
    for _ in range(2000):  # no excitation in size: the covariance would grow as 0.8^-n without the cap
        model.observe(1000.0, 0.01)
    assert model.predict(1000.0) == pytest.approx(0.01, rel=1e-6)
    assert all(abs(v) < 1e6 for row in model._fit.p for v in row)
    model.observe(2000.0, 0.02)
    assert 0.0 < model.predict(1500.0) < 0.05


def test_linear_model_checks_arguments() -> None:
    with pytest.raises(ValueError, match="forgetting"):
        LinearCostModel(forgetting=0.0)
    with pytest.raises(ValueError, match="max_trace"):
        LinearCostModel(max_trace=0)


def test_linear_model_jumps_on_a_regime_change_but_not_on_one_outlier() -> None:
    model = LinearCostModel(forgetting=0.95)
    for i in range(100):
        model.observe(1e3 * (1 + i % 7), 1e-3 * (1 + i % 7))
    model.observe(3e3, 30e-3)  # one stray stall
    assert model.resets == 0
    model.observe(3e3, 3e-3)
    assert model.predict(3e3) < 6e-3
    for i in range(2):  # the device got ten times slower: the second far-off observation resets the fit
        model.observe(2e3 * (1 + i), 20e-3 * (1 + i))
    assert model.resets == 1
    assert model.predict(4e3) == pytest.approx(40e-3, rel=0.1)
