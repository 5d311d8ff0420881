"""``zerocopy::sample_neighbors(..., node_keyed=True)`` (CPU kernel): evaluation sampling whose picks are keyed by
node id and whose nodes are deduplicated per hop, so a seed's computation graph does not depend on its batch."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from helpers import load_test_module, opcheck

from lightning_zerocopy import ops

cpu_tests = load_test_module(__file__, "test_sample_neighbors")
PickFn, all_neighbors, assert_same = cpu_tests.PickFn, cpu_tests.all_neighbors, cpu_tests.assert_same
expected_picks, kernel_picks = cpu_tests.expected_picks, cpu_tests.kernel_picks
random_graph, random_seeds = cpu_tests.random_graph, cpu_tests.random_seeds


def layered_reference(
    indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, num_hops: int, picks: PickFn
) -> ops.SampledSubgraph:
    """Slow reference: each hop's neighbors form the next level, deduplicated within that level only."""
    ptr, nbr = indptr.tolist(), indices.tolist()
    n_id = seeds.tolist()
    row, col, pos = [], [], []
    nodes_per_hop, edges_per_hop = [len(n_id)], []
    begin = 0
    for hop in range(num_hops):
        end, level = len(n_id), {}
        for target in range(begin, end):
            v = n_id[target]
            for p in picks(hop, v, ptr[v], ptr[v + 1]):
                u = nbr[p]
                if u not in level:
                    level[u] = len(n_id)
                    n_id.append(u)
                row.append(level[u])
                col.append(target)
                pos.append(p)
        edges_per_hop.append(len(row) - sum(edges_per_hop))
        nodes_per_hop.append(len(n_id) - end)
        begin = end
    t = lambda values: torch.tensor(values, dtype=torch.int64)  # noqa: E731
    return ops.SampledSubgraph(t(n_id), t(row), t(col), t(pos), t(nodes_per_hop), t(edges_per_hop))


def picks_by_level_node(out: ops.SampledSubgraph) -> dict[tuple[int, int], list[int]]:
    """(hop, target global id) -> the edge positions it picked, in pick order."""
    hop_of_edge = torch.repeat_interleave(torch.arange(out.num_sampled_edges.numel()), out.num_sampled_edges)
    by_target: dict[tuple[int, int], list[int]] = defaultdict(list)
    for hop, target, p in zip(hop_of_edge.tolist(), out.n_id[out.col].tolist(), out.edge_pos.tolist()):
        by_target[(hop, target)].append(p)
    return dict(by_target)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[3, 2], [5, -1, 2], [90], [-1, -1]])
def test_structure_is_layered(index_dtype: torch.dtype, replace: bool, fanouts: list[int]) -> None:
    gen = torch.Generator().manual_seed(2)
    graph = random_graph(400, 6000, gen, index_dtype)  # dense: seeds reach each other, nodes recur across hops
    seeds = random_seeds(graph.num_nodes, 60, gen)
    out = ops.sample_neighbors(graph.indptr, graph.indices, seeds, fanouts, replace, 11, node_keyed=True)
    picks = kernel_picks(out)

    def checked(hop: int, node: int, begin: int, end: int) -> list[int]:
        chosen = picks(hop, node, begin, end)
        assert len(chosen) == expected_picks(end - begin, fanouts[hop], replace), (hop, node)
        assert all(begin <= p < end for p in chosen), (hop, node, chosen)
        assert replace or len(set(chosen)) == len(chosen), (hop, node, chosen)
        return chosen

    assert_same(out, layered_reference(graph.indptr, graph.indices, seeds, len(fanouts), checked))
    levels = torch.split(out.n_id, out.num_sampled_nodes.tolist())
    assert all(level.unique().numel() == level.numel() for level in levels)  # unique within a level
    assert out.n_id.unique().numel() < out.n_id.numel()  # ... but nodes recur across levels in this dense graph
    # edges only run from level k + 1 to level k
    starts = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long), out.num_sampled_nodes]), 0)
    for hop, (row, col) in enumerate(zip(out.row.split(out.num_sampled_edges.tolist()),
                                         out.col.split(out.num_sampled_edges.tolist()))):  # fmt: skip
        assert bool(((starts[hop] <= col) & (col < starts[hop + 1])).all())
        assert bool(((starts[hop + 1] <= row) & (row < starts[hop + 2])).all())


def test_full_neighborhoods_match_layered_reference() -> None:
    gen = torch.Generator().manual_seed(1)
    graph = random_graph(300, 1500, gen)
    seeds = random_seeds(graph.num_nodes, 13, gen)
    out = ops.sample_neighbors(graph.indptr, graph.indices, seeds, [-1, -1], False, 7, node_keyed=True)
    assert_same(out, layered_reference(graph.indptr, graph.indices, seeds, 2, all_neighbors))


@pytest.mark.parametrize("replace", [False, True])
def test_a_node_picks_the_same_neighbors_in_any_batch(replace: bool) -> None:
    """The defect node-keyed sampling fixes: keyed by frontier position, a node's neighbors depended on its batch."""
    gen = torch.Generator().manual_seed(5)
    graph = random_graph(2000, 30000, gen)
    order = torch.randperm(graph.num_nodes, generator=gen)
    fanouts = [10, 5, 70]  # 70 > kFloydMaxPicks: the hash-table pick path too
    shared = order[:40]
    batch_a = torch.cat([shared, order[40:200]])
    batch_b = torch.cat([order[500:520], shared.flip(0), order[600:900]])  # other companions and positions

    def picks(batch: torch.Tensor, node_keyed: bool) -> dict[tuple[int, int], list[int]]:
        out = ops.sample_neighbors(graph.indptr, graph.indices, batch, fanouts, replace, 3, node_keyed=node_keyed)
        return picks_by_level_node(out)

    for node_keyed in (False, True):
        a, b = picks(batch_a, node_keyed), picks(batch_b, node_keyed)
        common = a.keys() & b.keys()
        assert len(common) > 200
        same = all(a[key] == b[key] for key in common)
        assert same == node_keyed  # positional streams differ between batches; node-keyed ones never do
    # a seed's whole computation tree (its picks, their picks, ...) is the same in both batches
    a, b = picks(batch_a, True), picks(batch_b, True)
    frontier = set(shared.tolist())
    for hop in range(len(fanouts)):
        nxt = set()
        for node in frontier:
            assert a.get((hop, node), []) == b.get((hop, node), []), (hop, node)
            nxt.update(int(graph.indices[p]) for p in a.get((hop, node), []))
        frontier = nxt


def test_training_sampling_is_untouched_by_the_flag() -> None:
    gen = torch.Generator().manual_seed(6)
    graph = random_graph(1000, 12000, gen)
    seeds = random_seeds(graph.num_nodes, 100, gen)
    default = ops.sample_neighbors(graph.indptr, graph.indices, seeds, [8, 4], False, 9)
    explicit = ops.sample_neighbors(graph.indptr, graph.indices, seeds, [8, 4], False, 9, node_keyed=False)
    keyed = ops.sample_neighbors(graph.indptr, graph.indices, seeds, [8, 4], False, 9, node_keyed=True)
    assert_same(explicit, default)
    assert not torch.equal(keyed.edge_pos, default.edge_pos)


def test_bitwise_deterministic_across_thread_counts() -> None:
    gen = torch.Generator().manual_seed(8)
    graph = random_graph(60000, 900000, gen)
    seeds = random_seeds(graph.num_nodes, 4000, gen)  # hops above the parallel relabel's threshold
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 4):
            torch.set_num_threads(threads)
            outs.append(ops.sample_neighbors(graph.indptr, graph.indices, seeds, [15, 10], False, 4, node_keyed=True))
    finally:
        torch.set_num_threads(before)
    assert outs[0].num_sampled_edges[1] >= 1 << 15
    assert_same(outs[1], outs[0])


def test_opcheck() -> None:
    gen = torch.Generator().manual_seed(9)
    graph = random_graph(300, 2000, gen, torch.int32)
    args = (graph.indptr, graph.indices, random_seeds(300, 20, gen), [4, -1, 2], False, 31, True)
    opcheck(torch.ops.zerocopy.sample_neighbors.default, args)
