"""SyntheticLinkGraph holds out edges of the generated graph as val/test positives, with fixed negatives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchmetrics.functional import auroc

from lightning_zerocopy.datasets import SyntheticGraph, SyntheticLinkGraph, check_link_splits


def _keys(edge_index: torch.Tensor, n: int) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in edge_index.T.tolist()}


@pytest.fixture
def link_graph(tmp_path: Path) -> SyntheticLinkGraph:
    graph = SyntheticGraph(num_nodes=2000, avg_degree=8, num_features=16, seed=3, cache_dir=str(tmp_path))
    return SyntheticLinkGraph(graph, val_fraction=0.05, test_fraction=0.1, neg_per_positive=5, seed=1)


def test_held_out_edges_leave_the_message_passing_graph(link_graph: SyntheticLinkGraph) -> None:
    data = link_graph.load()
    full = link_graph.graph.load().edge_index
    n = data.num_nodes
    undirected = {tuple(sorted(p)) for p in _keys(full, n)}
    graph = {tuple(sorted(p)) for p in _keys(data.edge_index, n)}
    val, test = data.split("val"), data.split("test")
    held = {tuple(sorted(p)) for p in _keys(val.pos_edge_index, n) | _keys(test.pos_edge_index, n)}
    assert held <= undirected  # held-out positives are real edges
    assert not held & graph  # ... and neither direction of any is left to pass messages
    assert graph | held == undirected  # nothing else was removed
    assert val.num_positives == round(0.05 * len(undirected)) and test.num_positives == round(0.1 * len(undirected))
    assert not _keys(val.pos_edge_index, n) & _keys(test.pos_edge_index, n)
    # train positives: the remaining generated edges, one direction each, a pair drawn twice once
    train = data.split("train")
    assert train.neg_edge_index is None and train.num_positives == len(graph) < data.num_edges // 2
    assert {tuple(sorted(p)) for p in _keys(train.pos_edge_index, n)} == graph
    assert check_link_splits(data, {s: link_graph.split_source(s) for s in data.splits}, undirected=True) == []
    assert list(data.splits) == ["train", "val", "test"]


def test_fixed_negatives_share_the_source_and_are_never_edges(link_graph: SyntheticLinkGraph) -> None:
    data = link_graph.load()
    full = {tuple(sorted(p)) for p in _keys(link_graph.graph.load().edge_index, data.num_nodes)}
    for name in ("val", "test"):
        split = data.split(name)
        assert split.neg_per_positive == 5 and split.num_negatives == 5 * split.num_positives
        assert torch.equal(split.neg_edge_index[0], split.pos_edge_index[0].repeat_interleave(5))
        neg = split.neg_edge_index
        assert bool((neg[0] != neg[1]).all())
        assert not {tuple(sorted(p)) for p in neg.T.tolist()} & full
        assert neg[1].unique().numel() > data.num_nodes // 2  # uniform destinations, not a few hubs


def test_same_arguments_same_splits_and_the_seed_changes_them(link_graph: SyntheticLinkGraph, tmp_path: Path) -> None:
    data = link_graph.load()
    again = SyntheticLinkGraph(link_graph.graph, val_fraction=0.05, test_fraction=0.1, neg_per_positive=5, seed=1,
                               cache_dir=str(tmp_path / "elsewhere")).load()
    for name in ("train", "val", "test"):
        assert torch.equal(data.split(name).pos_edge_index, again.split(name).pos_edge_index)
    assert torch.equal(data.split("val").neg_edge_index, again.split("val").neg_edge_index)
    other = SyntheticLinkGraph(link_graph.graph, val_fraction=0.05, test_fraction=0.1, neg_per_positive=5, seed=2).load()
    assert not torch.equal(data.split("val").pos_edge_index, other.split("val").pos_edge_index)


def test_train_fraction_keeps_a_share_of_the_train_edges(link_graph: SyntheticLinkGraph) -> None:
    full = link_graph.load()
    half = SyntheticLinkGraph(link_graph.graph, val_fraction=0.05, test_fraction=0.1, neg_per_positive=5, seed=1,
                              train_fraction=0.5).load()
    assert half.split("train").num_positives == round(full.split("train").num_positives * 0.5)
    assert _keys(half.split("train").pos_edge_index, 0) < _keys(full.split("train").pos_edge_index, 0)
    assert torch.equal(half.edge_index, full.edge_index)  # every remaining edge still passes messages


def test_a_directed_graph_removes_only_the_held_out_direction(tmp_path: Path) -> None:
    graph = SyntheticGraph(num_nodes=500, avg_degree=6, undirected=False, seed=5, cache_dir=str(tmp_path))
    data = SyntheticLinkGraph(graph, neg_per_positive=3).load()
    full = _keys(graph.load().edge_index, 500)
    held = _keys(data.split("val").pos_edge_index, 500) | _keys(data.split("test").pos_edge_index, 500)
    assert held <= full and not held & _keys(data.edge_index, 500)
    assert _keys(data.edge_index, 500) | held == full


def test_link_prediction_is_learnable_from_neighbourhood_features(link_graph: SyntheticLinkGraph) -> None:
    """A parameter-free one-layer mean aggregation, scored by dot product, beats chance clearly."""
    data = link_graph.load()
    x, ei = data.x.float(), data.edge_index
    degree = torch.zeros(data.num_nodes).index_add_(0, ei[1], torch.ones(ei.shape[1])).clamp_(min=1)
    h = torch.zeros_like(x).index_add_(0, ei[1], x[ei[0]]) / degree[:, None]
    split = data.split("test")
    pairs = torch.cat([split.pos_edge_index, split.neg_edge_index], 1)
    labels = torch.cat([torch.ones(split.num_positives), torch.zeros(split.num_negatives)]).long()
    assert float(auroc((h[pairs[0]] * h[pairs[1]]).sum(1), labels, task="binary")) > 0.65


def test_bad_arguments_name_themselves() -> None:
    with pytest.raises(ValueError, match="val_fraction"):
        SyntheticLinkGraph(val_fraction=0.6, test_fraction=0.5)
    with pytest.raises(ValueError, match="train_fraction"):
        SyntheticLinkGraph(train_fraction=0)
    with pytest.raises(ValueError, match="neg_per_positive"):
        SyntheticLinkGraph(neg_per_positive=0)


def test_a_positives_negatives_are_distinct(tmp_path: Path) -> None:
    """Destinations were drawn with repeats: 9 of 1,184 test positives of the link recipe had a negative twice."""
    graph = SyntheticGraph(num_nodes=300, avg_degree=6, num_features=4, seed=5, cache_dir=str(tmp_path))
    data = SyntheticLinkGraph(graph, val_fraction=0.1, test_fraction=0.1, neg_per_positive=20, seed=2).load()
    for name in ("val", "test"):
        split = data.split(name)
        groups = split.neg_edge_index[1].view(split.num_positives, 20)
        assert all(row.unique().numel() == 20 for row in groups), name
