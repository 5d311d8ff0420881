"""The typed sampler's fused calls: one kernel call per hop (per distinct fanout) over the CSC of every edge type.

The exact reference below samples each edge type on its own per-type CSC, keyed as the fused call keys it: a target at
position ``p`` of the fused frontier (or with fused id ``target_offset + j``, node-keyed) draws from the stream of that
position (id) and of the call's seed. It pads the per-type call's seeds with ``p`` isolated nodes in front and shifts
the type's targets by their offset, so the per-type kernel sees the same keys; every other step (splitting, id maps,
deduplication, order) is plain Python over PyG's semantics.
"""

from __future__ import annotations

import pytest
import torch

from helpers.hetero import AUTHOR, CITES, EDGE_TYPES, EMPLOYS, PAPER, WRITES, WRITTEN_BY, make_hetero_data
from lightning_zerocopy import ops
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.sampling.hetero import fanout_groups, hop_seed
from lightning_zerocopy.sampling.neighbor_sampler import CSCKernel, HeteroNeighborSampler

MIXED = {CITES: [3, 2], WRITES: [2, 2], WRITTEN_BY: [4, 1], EMPLOYS: [1, 1]}
ONE = {et: [3, 2] for et in EDGE_TYPES}


def _graphs(data):
    return {et: CSCGraph.from_edge_index(ei, max(data.num_nodes[et[0]], data.num_nodes[et[2]]))
            for et, ei in data.edge_index.items()}  # fmt: skip


def _sampler(data, fanouts, **kwargs) -> HeteroNeighborSampler:
    return HeteroNeighborSampler(_graphs(data), list(data.num_nodes), fanouts, num_nodes=data.num_nodes, **kwargs)


def _keyed_picks(graph, target_base, position, targets, fanout, call_seed, replace, node_keyed):
    """Per target, ``[(src id, e_id)]`` as a fused call draws them, from the per-type CSC ``graph`` alone."""
    ids = int(graph.indptr.numel()) - 1
    span = target_base + ids + position + 1
    indptr = torch.cat([torch.zeros(target_base, dtype=torch.int64), graph.indptr,
                        torch.full((span - target_base - ids - 1,), graph.num_edges, dtype=torch.int64)])  # fmt: skip
    pads = torch.arange(target_base + ids, target_base + ids + position)  # isolated: they only take the positions
    seeds = torch.cat([pads, targets + target_base])
    out = ops.sample_neighbors(indptr, graph.indices, seeds, [fanout], replace, call_seed, node_keyed)
    picks: list[list[tuple[int, int]]] = [[] for _ in range(targets.numel())]
    for row, col, pos in zip(out.row.tolist(), out.col.tolist(), out.edge_pos.tolist()):
        picks[col - position].append((int(out.n_id[row]), int(graph.edge_perm[pos])))
    return picks


def reference(data, seeds, fanouts, seed, replace=False, node_keyed=False):
    """``(n_id, edges, num_sampled_edges)``: per type the ids in order, per edge type ``[(row, col, e_id)]``."""
    graphs, num_nodes = _graphs(data), data.num_nodes
    target_base, start = {}, 0
    for et in EDGE_TYPES:
        target_base[et], start = start, start + num_nodes[et[2]]
    n_id = {t: [] for t in num_nodes}
    n_id[PAPER] = list(seeds)
    frontier = {t: (0, len(n_id[t])) for t in num_nodes}
    edges = {et: [] for et in EDGE_TYPES}
    counts = {et: [] for et in EDGE_TYPES}
    for hop in range(len(fanouts[CITES])):
        drawn = {}
        for group, (fanout, members) in enumerate(fanout_groups(fanouts, EDGE_TYPES, hop)):
            position = 0
            for k in members:
                et = EDGE_TYPES[k]
                begin, end = frontier[et[2]]
                targets = torch.tensor(n_id[et[2]][begin:end], dtype=torch.int64)
                if targets.numel() == 0:
                    continue
                drawn[et] = _keyed_picks(graphs[et], target_base[et], position, targets, fanout,
                                         hop_seed(seed, hop, group), replace, node_keyed)  # fmt: skip
                position += targets.numel()
        level = {t: {} for t in num_nodes}  # node-keyed: this hop's new level per type
        local = {t: {v: i for i, v in enumerate(n_id[t])} for t in num_nodes}
        added = {t: [] for t in num_nodes}
        for et in EDGE_TYPES:
            src, _, dst = et
            begin, _ = frontier[dst]
            hop_edges = []
            for i, picks in enumerate(drawn.get(et, [])):
                for node, e in picks:
                    table = level[src] if node_keyed else local[src]
                    if node not in table:
                        table[node] = len(n_id[src]) + len(added[src])
                        added[src].append(node)
                    hop_edges.append((table[node], begin + i, e))
            edges[et] += hop_edges
            counts[et].append(len(hop_edges))
        for t in num_nodes:
            frontier[t] = (len(n_id[t]), len(n_id[t]) + len(added[t]))
            n_id[t] += added[t]
    return n_id, edges, counts


def _assert_matches(sample, expected) -> None:
    n_id, edges, counts = expected
    for t, ids in n_id.items():
        assert sample.n_id[t].tolist() == ids, t
    for et in EDGE_TYPES:
        got = list(zip(*sample.edge_index[et].tolist(), sample.e_id[et].tolist()))
        assert got == edges[et], et
        assert sample.num_sampled_edges[et] == counts[et], et


@pytest.mark.parametrize("fanouts", [ONE, MIXED], ids=["one_fanout", "mixed_fanouts"])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("node_keyed", [False, True], ids=["set", "node_keyed"])
def test_draws_bitwise_the_per_type_reference_keyed_by_the_fused_frontier(fanouts, replace, node_keyed) -> None:
    data = make_hetero_data(seed=3)
    sampler = _sampler(data, fanouts, replace=replace, node_keyed=node_keyed)
    for seed in (1, 29):
        seeds = data.train_idx[: 5 + seed % 7]
        sample = sampler.sample(seeds, seed=seed, input_type=PAPER)
        _assert_matches(sample, reference(data, seeds.tolist(), fanouts, seed, replace, node_keyed))


def test_all_neighbors_in_csc_order_exactly() -> None:
    data = make_hetero_data(seed=1)
    fanouts = {et: [-1, -1] for et in EDGE_TYPES}
    seeds = data.train_idx[:4]
    sample = _sampler(data, fanouts).sample(seeds, seed=0, input_type=PAPER)
    _assert_matches(sample, reference(data, seeds.tolist(), fanouts, 0))
    for et in (CITES, WRITES):  # hop 0: every edge into the seeds
        assert sample.num_sampled_edges[et][0] == int(torch.isin(data.edge_index[et][1], seeds).sum())


class _CountingRun:
    """Counts the kernel calls of every CSCKernel (``_call``: ``run`` and ``pick``) and the frontier each was given."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[int] = []
        plain = CSCKernel._call

        def call(kernel, op, seeds, *args):
            self.calls.append(int(seeds.numel()))
            return plain(kernel, op, seeds, *args)

        monkeypatch.setattr(CSCKernel, "_call", call)


def test_one_kernel_call_per_hop_with_one_fanout(monkeypatch) -> None:
    """Fails with one call per (hop, edge type) (8 here)."""
    data = make_hetero_data()
    counter = _CountingRun(monkeypatch)
    for hops in ([3, 2], [2, 2, 2]):
        counter.calls.clear()
        sample = _sampler(data, {et: hops for et in EDGE_TYPES}).sample(data.train_idx[:8], seed=5, input_type=PAPER)
        assert len(counter.calls) == len(hops)
        sizes = [sum(sample.num_sampled_nodes[et[2]][hop] for et in EDGE_TYPES) for hop in range(len(hops))]
        assert counter.calls == sizes  # each call's frontier: every edge type's destination frontier


def test_mixed_fanouts_group_into_one_call_per_distinct_fanout(monkeypatch) -> None:
    assert fanout_groups(MIXED, EDGE_TYPES, 0) == [(3, [0]), (2, [1]), (4, [2]), (1, [3])]
    assert fanout_groups(MIXED, EDGE_TYPES, 1) == [(2, [0, 1]), (1, [2, 3])]
    data = make_hetero_data()
    counter = _CountingRun(monkeypatch)
    sample = _sampler(data, MIXED).sample(data.train_idx[:8], seed=2, input_type=PAPER)
    # hop 0: only papers are targets (cites: 3, writes: 2; the author groups have empty frontiers and make no call);
    # hop 1: fanout 2 over cites + writes (new papers), fanout 1 over rev_writes + employs (new authors)
    papers, authors = sample.num_sampled_nodes[PAPER], sample.num_sampled_nodes[AUTHOR]
    assert counter.calls == [8, 8, 2 * papers[1], 2 * authors[1]]
    for et in EDGE_TYPES:
        degree = torch.bincount(data.edge_index[et][1], minlength=data.num_nodes[et[2]])
        col, start = sample.edge_index[et][1], 0
        for hop, count in enumerate(sample.num_sampled_edges[et]):
            per_target = torch.bincount(col[start : start + count], minlength=sample.n_id[et[2]].numel())
            targets = sample.n_id[et[2]]
            bound = torch.minimum(degree[targets], torch.tensor(MIXED[et][hop]))
            begin = sum(sample.num_sampled_nodes[et[2]][:hop])
            end = begin + sample.num_sampled_nodes[et[2]][hop]
            assert torch.equal(per_target[begin:end], bound[begin:end]), (et, hop)  # its own fanout, every target
            start += count


def test_an_edge_type_with_an_empty_destination_frontier_draws_nothing_that_hop() -> None:
    data = make_hetero_data()
    sample = _sampler(data, ONE).sample(data.train_idx[:6], seed=8, input_type=PAPER)
    assert sample.num_sampled_nodes[AUTHOR][0] == 0
    for et in (WRITTEN_BY, EMPLOYS):  # into authors: nothing at hop 0
        assert sample.num_sampled_edges[et][0] == 0 and sample.num_sampled_edges[et][1] > 0
    # seeds of authors only: the edge types into papers have nothing to draw for at hop 0
    only = _sampler(data, ONE).sample({AUTHOR: torch.tensor([2, 5, 11])}, seed=8, input_type=AUTHOR)
    assert only.num_sampled_edges[CITES][0] == only.num_sampled_edges[WRITES][0] == 0
    assert only.num_sampled_edges[WRITTEN_BY][0] > 0 and only.n_id[AUTHOR][:3].tolist() == [2, 5, 11]


def _picks_by_target(sample) -> dict[tuple, list[int]]:
    """``(edge type, hop, target id) -> e_ids`` of a sample."""
    picks: dict[tuple, list[int]] = {}
    for et in EDGE_TYPES:
        col, e_id, start = sample.edge_index[et][1], sample.e_id[et], 0
        for hop, count in enumerate(sample.num_sampled_edges[et]):
            for c, e in zip(col[start : start + count].tolist(), e_id[start : start + count].tolist()):
                picks.setdefault((et, hop, int(sample.n_id[et[2]][c])), []).append(e)
            start += count
    return picks


@pytest.mark.parametrize("fanouts", [ONE, MIXED], ids=["one_fanout", "mixed_fanouts"])
def test_node_keyed_a_seeds_computation_graph_does_not_depend_on_its_batch(fanouts) -> None:
    """At every hop, every node the small batch reaches draws what it draws in the large one (fused calls whose
    frontiers differ in size and make-up, groups that are empty in one batch and not in the other)."""
    data = make_hetero_data(seed=2)
    sampler = _sampler(data, fanouts, node_keyed=True)
    big = _picks_by_target(sampler.sample(data.train_idx[:12], seed=9, input_type=PAPER))
    for seed_node in data.train_idx[:12:5]:
        small = _picks_by_target(sampler.sample(seed_node.view(1), seed=9, input_type=PAPER))
        assert small and all(big[key] == picks for key, picks in small.items())
        assert any(key[1] == 1 for key in small)  # the second hop is compared too


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["gpu", "uva"])
@pytest.mark.parametrize("fanouts", [ONE, MIXED], ids=["one_fanout", "mixed_fanouts"])
@pytest.mark.parametrize("node_keyed", [False, True], ids=["set", "node_keyed"])
def test_cuda_placements_sample_bitwise_the_cpu_sample(placement, fanouts, node_keyed) -> None:
    data = make_hetero_data(seed=5)
    cpu = _sampler(data, fanouts, node_keyed=node_keyed)
    cuda = HeteroNeighborSampler(_graphs(data), list(data.num_nodes), fanouts, num_nodes=data.num_nodes,
                                 node_keyed=node_keyed, placement=placement, fused=cpu.fused)  # fmt: skip
    try:
        for seed in (0, 17):
            seeds = data.train_idx[: 4 + seed % 9]
            a = cpu.sample(seeds, seed=seed, input_type=PAPER)
            b = cuda.sample(seeds.cuda(), seed=seed, input_type=PAPER)
            for t in a.n_id:
                assert b.n_id[t].is_cuda and torch.equal(b.n_id[t].cpu(), a.n_id[t]), t
            for et in EDGE_TYPES:
                assert torch.equal(b.edge_index[et].cpu(), a.edge_index[et])
                assert torch.equal(b.e_id[et].cpu(), a.e_id[et])
            assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
    finally:
        cuda.close()
