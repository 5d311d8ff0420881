"""The CUDA sampler's graph path (csrc/ops/cuda/sample_neighbors/sample_neighbors_lean_graph.cpp): lean batches of one shape are
captured in a CUDA graph the second time the shape is seen, and replayed from then on. Every replay must give the CPU sample bitwise, outputs must survive
later replays, errors must still raise, and the switch and counters (``ops.set_sampler_graphs``,
``ops.sampler_graph_stats``) must say what ran."""

from __future__ import annotations

import threading

import pytest
import torch
from helpers import load_test_module

from lightning_zerocopy import ops

pytestmark = pytest.mark.cuda


cpu_tests = load_test_module(__file__, "test_sample_neighbors")
cuda_tests = load_test_module(__file__, "test_sample_neighbors_cuda")
FANOUTS = [15, 10, 5]


@pytest.fixture(scope="module")
def graph():
    return cpu_tests.random_graph(60000, 600000, torch.Generator().manual_seed(21), torch.int64)


def _stats() -> dict:
    return ops.sampler_graph_stats()


def _cpu(graph, seeds: torch.Tensor, fanouts, replace: bool, seed: int) -> ops.SampledSubgraph:
    return ops.sample_neighbors(graph.indptr, graph.indices, seeds, fanouts, replace, seed)


@pytest.mark.parametrize("placement", ["gpu", "uva"])
@pytest.mark.parametrize("replace", [False, True])
def test_replays_give_the_cpu_sample_for_every_batch(graph, placement: str, replace: bool) -> None:
    """The first batch launches directly, the second captures the shape, and every later one replays it; each
    batch has its own seeds and random seed."""
    gen = torch.Generator().manual_seed(22)
    batches = [(cpu_tests.random_seeds(graph.num_nodes, 1000, gen), 100 + i) for i in range(6)]
    with cuda_tests.Placed(graph.indptr, graph.indices, placement) as placed:
        before = _stats()
        for seeds, seed in batches:
            out = cuda_tests.sample_cuda(placed, seeds, FANOUTS, replace, seed)
            cpu_tests.assert_same(out, _cpu(graph, seeds, FANOUTS, replace, seed))
        after = _stats()
    # (1, n - 1) fresh; otherwise an earlier parametrization saw (or captured) this shape at the same reused addresses
    delta = (after["captures"] - before["captures"], after["replays"] - before["replays"])
    assert delta in ((1, len(batches) - 1), (1, len(batches)), (0, len(batches)))
    assert after["failures"] == before["failures"]


def test_outputs_survive_later_replays(graph) -> None:
    """The graph's buffers are overwritten by every replay, so the op must hand out copies."""
    gen = torch.Generator().manual_seed(23)
    seeds = [cpu_tests.random_seeds(graph.num_nodes, 512, gen) for _ in range(3)]
    with cuda_tests.Placed(graph.indptr, graph.indices, "gpu") as placed:
        outs = [ops.sample_neighbors(placed.indptr, placed.indices, s.cuda(), FANOUTS, False, 5) for s in seeds]
        torch.cuda.synchronize()
    for s, out in zip(seeds, outs):
        cpu_tests.assert_same(ops.SampledSubgraph(*(t.cpu() for t in out)), _cpu(graph, s, FANOUTS, False, 5))


def test_switch_off_launches_directly_with_the_same_sample(graph) -> None:
    seeds = cpu_tests.random_seeds(graph.num_nodes, 700, torch.Generator().manual_seed(24))
    with cuda_tests.Placed(graph.indptr, graph.indices, "gpu") as placed:
        assert ops.set_sampler_graphs(False) is True
        try:
            before = _stats()
            direct = cuda_tests.sample_cuda(placed, seeds, FANOUTS, False, 9)
            assert _stats()["replays"] == before["replays"] and _stats()["captures"] == before["captures"]
        finally:
            assert ops.set_sampler_graphs(True) is False
        launched = cuda_tests.sample_cuda(placed, seeds, FANOUTS, False, 9)  # first sighting with graphs on
        replayed = cuda_tests.sample_cuda(placed, seeds, FANOUTS, False, 9)
        assert _stats()["replays"] == before["replays"] + 1
    cpu_tests.assert_same(direct, launched)
    cpu_tests.assert_same(direct, replayed)
    cpu_tests.assert_same(direct, _cpu(graph, seeds, FANOUTS, False, 9))


def test_bad_seeds_raise_through_a_captured_graph_and_leave_it_usable(graph) -> None:
    gen = torch.Generator().manual_seed(25)
    good = cpu_tests.random_seeds(graph.num_nodes, 300, gen)
    with cuda_tests.Placed(graph.indptr, graph.indices, "gpu") as placed:
        before = _stats()
        first = cuda_tests.sample_cuda(placed, good, FANOUTS, False, 1)  # the shape's first sighting
        out_of_range = good.clone()
        out_of_range[17] = graph.num_nodes + 5
        with pytest.raises(IndexError, match=r"`seeds\[17\]`"):
            ops.sample_neighbors(placed.indptr, placed.indices, out_of_range.cuda(), FANOUTS, False, 1)
        repeated = good.clone()
        repeated[40] = repeated[3]
        with pytest.raises(ValueError, match="`seeds` must be unique"):
            ops.sample_neighbors(placed.indptr, placed.indices, repeated.cuda(), FANOUTS, False, 1)
        again = cuda_tests.sample_cuda(placed, good, FANOUTS, False, 1)
    assert _stats()["replays"] - before["replays"] >= 3  # the two failed batches and the last one replayed
    cpu_tests.assert_same(again, first)
    cpu_tests.assert_same(first, _cpu(graph, good, FANOUTS, False, 1))


def test_each_shape_is_captured_once_and_the_cache_stays_bounded(graph) -> None:
    """Batch sizes cycle through more shapes than the cache holds, each sampled twice (launch, then capture and
    replay): every batch is still right, and shapes seen again after eviction are captured again."""
    gen = torch.Generator().manual_seed(26)
    sizes = [61, 122, 183, 244, 305, 61, 122]  # [7, 3] with these seed counts is sampled nowhere else
    with cuda_tests.Placed(graph.indptr, graph.indices, "gpu") as placed:
        before = _stats()
        for i, size in enumerate(sizes):
            for repeat in range(2):
                seeds = cpu_tests.random_seeds(graph.num_nodes, size, gen)
                cpu_tests.assert_same(cuda_tests.sample_cuda(placed, seeds, [7, 3], False, 2 * i + repeat),
                                      _cpu(graph, seeds, [7, 3], False, 2 * i + repeat))  # fmt: skip
        after = _stats()
    assert after["cached"] <= 4
    assert after["evictions"] > before["evictions"]
    assert after["captures"] - before["captures"] == len(sizes)  # 61 and 122 were evicted before they came back
    assert after["replays"] - before["replays"] == len(sizes)


def test_threads_on_their_own_streams_share_a_graph_safely(graph) -> None:
    """Two threads sample the same shape on two streams at once; the replays take turns and every output is
    the thread's own batch."""
    gen = torch.Generator().manual_seed(27)
    work = [[(cpu_tests.random_seeds(graph.num_nodes, 800, gen), 50 * t + i) for i in range(8)] for t in range(2)]
    results: list[list] = [[], []]
    errors: list[BaseException] = []
    with cuda_tests.Placed(graph.indptr, graph.indices, "gpu") as placed:

        def run(t: int) -> None:
            try:
                with torch.cuda.stream(torch.cuda.Stream()):
                    for seeds, seed in work[t]:
                        out = ops.sample_neighbors(placed.indptr, placed.indices, seeds.cuda(), FANOUTS, False, seed)
                        results[t].append(ops.SampledSubgraph(*(x.cpu() for x in out)))
            except BaseException as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(t,)) for t in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
        assert not any(th.is_alive() for th in threads)
    assert not errors, errors
    for t in range(2):
        for (seeds, seed), out in zip(work[t], results[t]):
            cpu_tests.assert_same(out, _cpu(graph, seeds, FANOUTS, False, seed))
