"""HeteroNeighborSampler.sample with seeds per node type (PyG's ``seed_dict``, a link batch's two endpoint types)."""

from __future__ import annotations

import pytest
import torch

from helpers.hetero import AUTHOR, EDGE_TYPES, PAPER, WRITTEN_BY, make_hetero_data
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.sampling.neighbor_sampler import HeteroNeighborSampler


def _sampler(data, **kwargs) -> HeteroNeighborSampler:
    graphs = {et: CSCGraph.from_edge_index(ei, max(data.num_nodes[et[0]], data.num_nodes[et[2]]))
              for et, ei in data.edge_index.items()}  # fmt: skip
    return HeteroNeighborSampler(graphs, list(data.num_nodes), {et: [3, 2] for et in EDGE_TYPES}, **kwargs)


def _same(a, b) -> None:
    assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
    for t in a.n_id:
        assert torch.equal(a.n_id[t], b.n_id[t])
    for et in a.edge_index:
        assert torch.equal(a.edge_index[et], b.edge_index[et]) and torch.equal(a.e_id[et], b.e_id[et])


@pytest.mark.parametrize("node_keyed", [False, True])
def test_a_dict_of_one_type_samples_as_the_tensor_call(node_keyed: bool) -> None:
    data = make_hetero_data()
    sampler, seeds = _sampler(data, node_keyed=node_keyed), data.train_idx[:6]
    single = sampler.sample(seeds, seed=4, input_type=PAPER)
    typed = sampler.sample({PAPER: seeds}, seed=4, input_type=PAPER)
    _same(single, typed)
    assert typed.batch_size == single.batch_size == 6 and typed.input_type == PAPER


def test_seeds_of_two_types_start_the_sample_together() -> None:
    data = make_hetero_data()
    sampler = _sampler(data)
    papers, authors = torch.tensor([1, 4, 9]), torch.tensor([0, 7, 33, 59])
    sample = sampler.sample({PAPER: papers, AUTHOR: authors}, seed=8)
    assert sample.input_type is None and sample.batch_size == 7
    assert torch.equal(sample.n_id[PAPER][:3], papers) and torch.equal(sample.n_id[AUTHOR][:4], authors)
    assert sample.num_sampled_nodes[PAPER][0] == 3 and sample.num_sampled_nodes[AUTHOR][0] == 4
    # the author seeds are targets at hop 0: paper -> author edges are drawn for them in the first hop
    alone = sampler.sample(papers, seed=8, input_type=PAPER)
    assert alone.num_sampled_edges[WRITTEN_BY][0] == 0 < sample.num_sampled_edges[WRITTEN_BY][0]
    for et in EDGE_TYPES:  # every sampled edge is an edge of its type
        local = sample.edge_index[et]
        pairs = torch.stack([sample.n_id[et[0]][local[0]], sample.n_id[et[2]][local[1]]])
        assert torch.equal(pairs, data.edge_index[et][:, sample.e_id[et]])
    again = sampler.sample({AUTHOR: authors, PAPER: papers}, seed=8)  # the dict's order does not matter
    _same(sample, again)


def test_bad_seed_arguments_are_named() -> None:
    sampler = _sampler(make_hetero_data())
    with pytest.raises(ValueError, match="`input_type` names the node type of `seeds`"):
        sampler.sample(torch.tensor([1]), seed=0)
    with pytest.raises(ValueError, match=r"`seeds` names 'venue', not one of the node types"):
        sampler.sample({"venue": torch.tensor([1])}, seed=0)
