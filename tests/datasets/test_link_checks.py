"""check_link_splits: errors for broken link splits, warnings for leaked val/test edges; chunked pair lookups."""

from __future__ import annotations

import pytest
import torch

from lightning_zerocopy.datasets import LinkData, LinkSplit, SplitError, check_link_splits
from lightning_zerocopy.datasets import link_checks
from lightning_zerocopy.datasets.link_checks import PairSet, pair_keys, pairs_in

N = 300


def _data(seed: int = 0, **splits: LinkSplit) -> LinkData:
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(N, (2, 2000), generator=gen)
    # val/test positives: pairs (a, a + 1) and (a, a + 2) that the graph joins in neither direction
    graph = set(map(tuple, edge_index.T.tolist()))
    free = torch.tensor([(a, b) for a in range(N) for b in range(a + 1, a + 3) if b < N and (a, b) not in graph and (b, a) not in graph]).T
    default = dict(
        train=LinkSplit(pos_edge_index=edge_index[:, :500]),
        val=LinkSplit(pos_edge_index=free[:, :40], neg_edge_index=_negatives(free[:, :40], gen), neg_per_positive=2),
        test=LinkSplit(pos_edge_index=free[:, 40:90], neg_edge_index=_negatives(free[:, 40:90], gen)),
    )
    default.update(splits)
    return LinkData(edge_index=edge_index, x=torch.randn(N, 4, generator=gen), splits=default)


def _negatives(pos: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    src = pos[0].repeat_interleave(2)
    dst = (src + 100 + torch.randint(50, (src.numel(),), generator=gen)) % N  # far from the positives' src + 1 or 2
    return torch.stack([src, dst])


def test_clean_splits_pass_without_warnings() -> None:
    assert check_link_splits(_data()) == []


def test_an_out_of_range_id_names_the_split_the_array_and_the_column() -> None:
    data = _data()
    bad = data.split("val").neg_edge_index.clone()
    bad[1, 7] = N + 4
    data.splits["val"] = LinkSplit(data.split("val").pos_edge_index, neg_edge_index=bad, neg_per_positive=2)
    with pytest.raises(SplitError, match=rf"the val split \(val.pt\) holds node id {N + 4} as the destination of "
                                         rf"neg_edge_index column 7, but the graph has {N} nodes"):
        check_link_splits(data, {"val": "val.pt"})
    pos = data.split("train").pos_edge_index.clone()
    pos[0, 3] = -1
    data = _data(train=LinkSplit(pos))
    with pytest.raises(SplitError, match="the train split .* node id -1 as the source of pos_edge_index column 3"):
        check_link_splits(data)


def test_an_empty_split_is_an_error() -> None:
    data = _data(test=LinkSplit(pos_edge_index=torch.empty(2, 0, dtype=torch.int64)))
    with pytest.raises(SplitError, match=r"the test split \(test edges\) holds no positive edge"):
        check_link_splits(data, {"test": "test edges"})


def test_a_positive_among_its_splits_negatives_is_an_error() -> None:
    data = _data()
    val = data.split("val")
    neg = val.neg_edge_index.clone()
    neg[:, 11] = val.pos_edge_index[:, 30]
    data.splits["val"] = LinkSplit(val.pos_edge_index, neg_edge_index=neg, neg_per_positive=2)
    with pytest.raises(SplitError, match=r"lists 1 positive edge among its negatives \(negative columns 11: "
                                         rf"\({int(neg[0, 11])}, {int(neg[1, 11])}\)\)"):
        check_link_splits(data)


def test_undirected_also_catches_a_reversed_positive_among_the_negatives() -> None:
    data = _data()
    val = data.split("val")
    neg = val.neg_edge_index.clone()
    neg[:, 0] = val.pos_edge_index[:, 5].flip(0)
    data.splits["val"] = LinkSplit(val.pos_edge_index, neg_edge_index=neg, neg_per_positive=2)
    assert check_link_splits(data) == []
    with pytest.raises(SplitError, match="among its negatives"):
        check_link_splits(data, undirected=True)


def test_a_val_positive_left_in_the_graph_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link_checks, "CHUNK", 64)  # the graph is looked up in many chunks
    data = _data()
    val = data.split("val").pos_edge_index
    leaked = torch.cat([data.edge_index, val[:, [3, 3, 8]]], 1)  # one leaked twice: counted once
    data = LinkData(edge_index=leaked, x=data.x, splits=data.splits)
    (warning,) = check_link_splits(data, {"val": "split/valid.pt"})
    assert warning.startswith("the val split (split/valid.pt) has 2 positive edges of 40 still in the message-passing")
    assert f"({int(val[0, 3])}, {int(val[1, 3])})" in warning and "remove them from edge_index" in warning
    # the reverse direction leaks only where the graph is undirected
    data = LinkData(edge_index=torch.cat([data.edge_index[:, :2000], val[:, [4]].flip(0)], 1), x=data.x, splits=data.splits)
    assert check_link_splits(data) == []
    assert "has 1 positive edge of 40" in check_link_splits(data, undirected=True)[0]


@pytest.mark.parametrize("num_nodes, undirected", [(50, False), (50, True), (10**6, False)])
def test_pairs_in_matches_a_set_lookup_across_chunks(monkeypatch: pytest.MonkeyPatch, num_nodes: int, undirected: bool) -> None:
    monkeypatch.setattr(link_checks, "CHUNK", 100)
    gen = torch.Generator().manual_seed(4)
    query = torch.randint(num_nodes, (2, 300), generator=gen)
    edges = torch.cat([torch.randint(num_nodes, (2, 1234), generator=gen), query[:, :40].flip(0), query[:, 40:90]], 1)
    edges = edges[:, torch.randperm(edges.shape[1], generator=gen)]
    known = set(map(tuple, query.T.tolist()))
    if undirected:
        known |= set(map(tuple, query.flip(0).T.tolist()))
    expected = torch.tensor([tuple(e) in known for e in edges.T.tolist()])
    assert expected.any() and not expected.all()
    pairs = PairSet(pair_keys(query[0], query[1], num_nodes, undirected).sort().values)
    assert torch.equal(pairs_in(edges, pairs, num_nodes, undirected), expected)
    with pytest.raises(ValueError, match="num_nodes"):
        pair_keys(query[0], query[1], 2**32)
