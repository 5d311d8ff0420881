"""Node reordering: valid permutations, consistent relabeling, and better locality than shuffled ids."""

from __future__ import annotations

import pytest
import torch

from lightning_zerocopy.graph import CSCGraph
from lightning_zerocopy.graph.reorder import NodeOrder, bfs_order, degree_order


def shuffled_lattice(num_nodes=3_000, reach=3, seed=0):
    """A ring lattice (each node linked to its `reach` nearest on both sides) with ids shuffled."""
    g = torch.Generator().manual_seed(seed)
    base = torch.arange(num_nodes)
    src = torch.cat([base for _ in range(2 * reach)])
    dst = torch.cat([(base + k) % num_nodes for k in [*range(1, reach + 1), *range(-reach, 0)]])
    perm = torch.randperm(num_nodes, generator=g)
    return torch.stack([perm[src], perm[dst]])


def mean_edge_span(graph: CSCGraph) -> float:
    dst = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.degree())
    return float((graph.indices.long() - dst).abs().float().mean())


def edge_set(edge_index):
    return set(map(tuple, edge_index.t().tolist()))


@pytest.mark.parametrize("make_order", [bfs_order, degree_order])
def test_relabel_is_consistent(make_order):
    edge_index = torch.randint(0, 400, (2, 3_000), generator=torch.Generator().manual_seed(1))
    edge_index = torch.cat([edge_index, torch.tensor([[450, 451], [451, 450]])], 1)  # a separate component
    graph = CSCGraph.from_edge_index(edge_index, num_nodes=500)  # nodes 400..499 mostly isolated
    order = make_order(graph)
    assert torch.equal(torch.sort(order.order).values, torch.arange(500))
    assert torch.equal(order.order[order.rank], torch.arange(500))
    new = order.relabel_graph(graph).validate()
    new_dst = torch.repeat_interleave(torch.arange(500), new.degree())
    # edge_perm still points into the original edge list, under the new ids.
    assert torch.equal(order.rank[edge_index[0, new.edge_perm]], new.indices.long())
    assert torch.equal(order.rank[edge_index[1, new.edge_perm]], new_dst)
    assert edge_set(torch.stack([new.indices.long(), new_dst])) == edge_set(order.rank[edge_index])
    x = torch.randn(500, 7)
    assert torch.equal(order.relabel_rows(x)[order.rank], x)
    y = torch.randint(0, 5, (500,))
    seeds = torch.tensor([3, 499, 42])
    assert torch.equal(order.relabel_rows(y)[order.relabel_ids(seeds)], y[seeds])


def test_bfs_restores_locality_of_a_shuffled_lattice():
    graph = CSCGraph.from_edge_index(shuffled_lattice())
    shuffled_span = mean_edge_span(graph)
    reordered_span = mean_edge_span(bfs_order(graph).relabel_graph(graph))
    assert shuffled_span > 500
    assert reordered_span < 20


def test_bfs_start_and_bad_input():
    graph = CSCGraph.from_edge_index(shuffled_lattice(100), num_nodes=100)
    assert int(bfs_order(graph, start=17).order[0]) == 17
    with pytest.raises(ValueError, match="`start`"):
        bfs_order(graph, start=100)
    with pytest.raises(ValueError, match="`order`"):
        NodeOrder.from_order(torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="`x`"):
        bfs_order(graph).relabel_rows(torch.randn(99, 2))


def test_graph_without_edges():
    graph = CSCGraph.from_edge_index(torch.empty(2, 0, dtype=torch.long), num_nodes=9)
    assert torch.equal(torch.sort(bfs_order(graph).order).values, torch.arange(9))
