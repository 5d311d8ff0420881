"""SyntheticHeteroGraph: ogbn-mag's shape, deterministic, cached, power-law, learnable from features and structure."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_zerocopy.datasets import SyntheticHeteroGraph

WRITES = ("author", "writes", "paper")
CITES = ("paper", "cites", "paper")
TOPIC = ("paper", "has_topic", "field_of_study")
AFFILIATED = ("author", "affiliated_with", "institution")


def _build(cache: Path, **kwargs) -> SyntheticHeteroGraph:
    kwargs.setdefault("num_papers", 3000)
    kwargs.setdefault("num_features", 16)
    kwargs.setdefault("num_classes", 5)
    return SyntheticHeteroGraph(cache_dir=str(cache), **kwargs)


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory):
    ds = _build(tmp_path_factory.mktemp("hetero"))
    return ds, ds.load()


def test_types_counts_and_shapes(graph) -> None:
    ds, data = graph
    assert data.node_types == ["paper", "author", "institution", "field_of_study"] == ds.node_types
    assert data.num_nodes == {"paper": 3000, "author": 4500, "institution": 36, "field_of_study": 240} == ds.num_nodes
    assert data.edge_types == ds.edge_types == [
        WRITES, CITES, TOPIC, AFFILIATED,
        ("paper", "rev_writes", "author"), ("field_of_study", "rev_has_topic", "paper"),
        ("institution", "rev_affiliated_with", "author"),
    ]  # fmt: skip
    assert ds.metadata() == (data.node_types, data.edge_types)
    assert set(data.x) == {"paper"} and data.x["paper"].shape == (3000, 16) and ds.num_features == {"paper": 16}
    assert data.x_files["paper"].endswith("x.paper.npy")
    assert data.edge_index[WRITES].shape[1] == 3 * 3000 and data.edge_index[TOPIC].shape[1] == 4 * 3000
    assert data.edge_index[AFFILIATED].shape[1] == 4500
    assert torch.bincount(data.y).tolist() == [600] * 5
    splits = torch.cat([data.train_idx, data.val_idx, data.test_idx])
    assert torch.equal(splits.sort().values, torch.arange(3000))
    assert (data.train_idx.numel(), data.val_idx.numel()) == (1800, 600)
    data.check_ids()


def test_reverse_types_are_exact_transposes_and_cites_is_undirected(graph) -> None:
    _, data = graph
    for forward in (WRITES, TOPIC, AFFILIATED):
        src, rel, dst = forward
        assert torch.equal(data.edge_index[(dst, f"rev_{rel}", src)], data.edge_index[forward].flip(0))
    cites = data.edge_index[CITES]
    n = data.num_nodes["paper"]
    key = cites[0] * n + cites[1]
    assert torch.equal(key, torch.unique(key))  # sorted, each pair once
    assert torch.equal(torch.unique(cites[1] * n + cites[0]), key)  # symmetric
    assert bool((cites[0] != cites[1]).all())  # no self-citation
    assert 4.0 < cites.shape[1] / n < 10.0  # 5 drawn per paper, both directions, minus repeats


def test_same_parameters_give_the_same_graph_and_seed_changes_it(graph, tmp_path: Path) -> None:
    _, a = graph
    b = _build(tmp_path / "b").load()
    for edge_type in a.edge_types:
        assert torch.equal(a.edge_index[edge_type], b.edge_index[edge_type]), edge_type
    assert torch.equal(a.x["paper"], b.x["paper"]) and torch.equal(a.y, b.y)
    assert torch.equal(a.train_idx, b.train_idx)
    c = _build(tmp_path / "c", seed=1).load()
    assert not torch.equal(a.edge_index[WRITES], c.edge_index[WRITES])
    assert not torch.equal(a.y, c.y)


def test_caching_reuses_the_directory(tmp_path: Path) -> None:
    first = _build(tmp_path, num_papers=200)
    first.prepare()
    stamp = (first.cache.path / "meta.json").stat().st_mtime_ns
    again = _build(tmp_path, num_papers=200)
    assert again.cache.path == first.cache.path
    again.load()
    assert (first.cache.path / "meta.json").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.cache.path.name]  # no second build, no leftovers
    other = _build(tmp_path, num_papers=200, avg_cites=2.0)
    assert other.cache.path != first.cache.path


def test_degrees_are_heavy_tailed(graph, tmp_path: Path) -> None:
    _, data = graph
    written = torch.bincount(data.edge_index[WRITES][1], minlength=3000).float()  # authors per paper
    authored = torch.bincount(data.edge_index[WRITES][0], minlength=4500).float()  # papers per author
    cited = torch.bincount(data.edge_index[CITES][1], minlength=3000).float()
    for deg in (authored, cited):
        assert deg.max() > 10 * deg.median().clamp(min=1)
    flat = _build(tmp_path, skew=0.0).load()
    flat_cited = torch.bincount(flat.edge_index[CITES][1], minlength=3000).float()
    assert flat_cited.max() < 4 * flat_cited.median()
    assert written.sum() == 9000


def test_classes_are_learnable_from_features(graph) -> None:
    _, data = graph
    x, y = data.x["paper"], data.y
    train, test = data.train_idx, data.test_idx
    means = torch.stack([x[train][y[train] == c].mean(0) for c in range(5)])
    accuracy = (torch.cdist(x[test], means).argmin(1) == y[test]).float().mean()
    assert accuracy > 0.4  # chance is 0.2


def test_classes_are_learnable_from_structure(graph) -> None:
    """Papers cite within their class; a paper's class is also the majority among papers sharing its authors and
    among papers sharing its fields (labels of the train split only)."""
    _, data = graph
    y = data.y
    src, dst = data.edge_index[CITES]
    assert (y[src] == y[dst]).float().mean() > 0.7  # homophily 0.75 plus chance hits
    known = torch.full_like(y, -1)
    known[data.train_idx] = y[data.train_idx]
    for via, n_via in ((WRITES, 4500), (("field_of_study", "rev_has_topic", "paper"), 240)):
        other, paper = data.edge_index[via]  # author or field -> paper
        # class votes of each author / field from its training papers, then back to the test papers
        votes = torch.zeros(n_via, 5)
        labeled = known[paper] >= 0
        votes.index_put_((other[labeled], known[paper][labeled]), torch.ones(int(labeled.sum())), accumulate=True)
        paper_votes = torch.zeros(3000, 5).index_add_(0, paper, votes[other])
        test = data.test_idx[paper_votes[data.test_idx].sum(1) > 0]
        accuracy = (paper_votes[test].argmax(1) == y[test]).float().mean()
        assert accuracy > 0.6, via


def test_featured_types_and_no_reverse(tmp_path: Path) -> None:
    ds = _build(tmp_path, num_papers=300, featured_types=["author", "paper"], add_reverse_edges=False)
    assert ds.num_features == {"paper": 16, "author": 16}
    assert ds.edge_types == [WRITES, CITES, TOPIC, AFFILIATED]
    data = ds.load()
    assert data.x["author"].shape == (450, 16) and set(data.x_files) == {"paper", "author"}
    assert data.edge_types == ds.edge_types
    assert data.edge_index[CITES].shape[1] <= 5 * 300  # as drawn: one direction, self-citations dropped


def test_float16_and_bad_arguments(tmp_path: Path) -> None:
    data = _build(tmp_path, num_papers=100, feature_dtype="float16").load()
    assert data.x["paper"].dtype == torch.float16
    with pytest.raises(ValueError, match="featured_types"):
        _build(tmp_path, featured_types=["venue"])
    with pytest.raises(ValueError, match="num_papers"):
        _build(tmp_path, num_papers=3)
    with pytest.raises(ValueError, match="author_ratio"):
        _build(tmp_path, author_ratio=0)
    with pytest.raises(ValueError, match="train_fraction"):
        _build(tmp_path, train_fraction=0.9, val_fraction=0.2)

