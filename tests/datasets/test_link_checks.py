"""check_link_splits: errors for broken link splits and labels, warnings for leaked val/test edges and repeated or
self-loop supervision edges; chunked pair lookups."""

from __future__ import annotations

import re

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
    first: dict[tuple[int, int], int] = {}
    for i, (a, b) in enumerate(edge_index[:, :500].T.tolist()):
        if a != b:
            first.setdefault((a, b), i)
    train = edge_index[:, sorted(first.values())]  # distinct pairs, no self-loops: a clean split
    default = dict(
        train=LinkSplit(pos_edge_index=train),
        val=LinkSplit(pos_edge_index=free[:, :40], neg_edge_index=_negatives(free[:, :40], gen), neg_per_positive=2),
        test=LinkSplit(pos_edge_index=free[:, 40:90], neg_edge_index=_negatives(free[:, 40:90], gen)),
    )
    default.update(splits)
    return LinkData(edge_index=edge_index, x=torch.randn(N, 4, generator=gen), splits=default)


def _negatives(pos: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    src = pos[0].repeat_interleave(2)
    dst = (src + 100 + torch.arange(src.numel()) % 100) % N  # far from the positives' src + 1 or 2, all distinct
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



@pytest.mark.parametrize("value", [2.0, -1.0, 0.5, float("nan")])
def test_a_label_other_than_0_or_1_names_the_split_and_the_value(value: float) -> None:
    """-1 trained as a negative, 2 and 0.5 as targets of the BCE, without a word."""
    data = _data()
    train = data.split("train")
    label = torch.ones(train.num_positives)
    label[[4, 9]] = 0.0
    data.splits["train"] = LinkSplit(train.pos_edge_index, edge_label=label)
    assert check_link_splits(data) == []  # 0 and 1
    label[[7, 12]] = value
    pair = f"({int(train.pos_edge_index[0, 7])}, {int(train.pos_edge_index[1, 7])})"
    with pytest.raises(SplitError, match=re.escape(f"the train split (train.pt) holds edge_label {value:g} for its "
                                                   f"positive 7 {pair}, but a link label is 1 (an edge) or 0 (none); "
                                                   "2 labels of this split are neither")):  # fmt: skip
        check_link_splits(data, {"train": "train.pt"})


def test_repeated_and_self_loop_supervision_edges_are_a_warning_with_counts() -> None:
    data = _data()
    train, val, test = data.split("train"), data.split("val"), data.split("test")
    pos = torch.cat([train.pos_edge_index, train.pos_edge_index[:, [3, 3, 8]], torch.tensor([[5, 6], [5, 6]])], 1)
    neg = val.neg_edge_index.clone()
    neg[:, 1] = neg[:, 0]  # positive 0's two negatives are one
    neg[:, 3] = neg[:, 0]  # the same negative for another positive: no repeat
    pool = test.neg_edge_index.clone()
    pool[:, 50] = pool[:, 2]  # a shared pool: any repeat counts
    data.splits.update(train=LinkSplit(pos), val=LinkSplit(val.pos_edge_index, neg_edge_index=neg, neg_per_positive=2),
                       test=LinkSplit(test.pos_edge_index, neg_edge_index=pool))  # fmt: skip
    warnings = check_link_splits(data, {"train": "train.pt"})
    t = train.pos_edge_index
    assert warnings[0] == (
        f"the train split (train.pt) holds 3 repeated positive edges (e.g. ({int(t[0, 3])}, {int(t[1, 3])}), "
        f"({int(t[0, 3])}, {int(t[1, 3])}), ({int(t[0, 8])}, {int(t[1, 8])})); 2 positive self-loops (e.g. (5, 5), "
        "(6, 6)): a repeated edge is trained or scored once per copy, and a self-loop asks whether a node links to "
        "itself; remove them unless that is meant"
    )
    assert warnings[1].startswith("the val split (the val link split) holds 1 repeated negative edge (for the same "
                                  f"positive) (e.g. ({int(neg[0, 1])}, {int(neg[1, 1])})):")  # fmt: skip
    assert warnings[2].startswith(f"the test split (the test link split) holds 1 repeated negative edge (e.g. "
                                  f"({int(pool[0, 50])}, {int(pool[1, 50])})):")  # fmt: skip
    assert len(warnings) == 3
