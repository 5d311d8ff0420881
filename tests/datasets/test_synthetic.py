"""SyntheticGraph: deterministic, cached, power-law, learnable, shuffled ids."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lightning_zerocopy.datasets import SyntheticGraph


def _build(cache: Path, **kwargs) -> SyntheticGraph:
    kwargs.setdefault("num_nodes", 4000)
    kwargs.setdefault("avg_degree", 12)
    kwargs.setdefault("num_features", 16)
    kwargs.setdefault("num_classes", 5)
    return SyntheticGraph(cache_dir=str(cache), **kwargs)


def test_same_parameters_give_bitwise_the_same_graph(tmp_path: Path) -> None:
    a = _build(tmp_path / "a").load()
    b = _build(tmp_path / "b").load()
    for name in ("edge_index", "x", "y", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    c = _build(tmp_path / "c", seed=1).load()
    assert not torch.equal(a.edge_index, c.edge_index)


def test_shapes_splits_and_degree(tmp_path: Path) -> None:
    data = _build(tmp_path).load()
    assert data.x.shape == (4000, 16) and data.x.dtype == torch.float32
    assert data.y.dtype == torch.int64 and set(data.y.unique().tolist()) == set(range(5))
    assert torch.bincount(data.y).tolist() == [800] * 5
    splits = torch.cat([data.train_idx, data.val_idx, data.test_idx])
    assert torch.equal(splits.sort().values, torch.arange(4000))
    assert data.train_idx.numel() == 2400 and data.val_idx.numel() == 800
    # undirected: every edge also reversed; self-loops removed; average degree as asked (within loops dropped)
    assert data.num_edges % 2 == 0
    half = data.num_edges // 2
    assert torch.equal(data.edge_index[:, :half].flip(0), data.edge_index[:, half:])
    assert (data.edge_index[0] != data.edge_index[1]).all()
    assert 11.0 < data.num_edges / 4000 <= 12.0


def test_degrees_are_skewed(tmp_path: Path) -> None:
    deg = torch.bincount(_build(tmp_path, skew=0.7).load().edge_index[1], minlength=4000).float()
    assert deg.max() > 10 * deg.median()
    flat = torch.bincount(_build(tmp_path, skew=0.0).load().edge_index[1], minlength=4000).float()
    assert flat.max() < 4 * flat.median()


def test_classes_are_learnable_and_homophilous(tmp_path: Path) -> None:
    data = _build(tmp_path, homophily=0.8).load()
    src, dst = data.edge_index
    same = (data.y[src] == data.y[dst]).float().mean()
    assert 0.75 < same < 0.9  # 0.8 drawn inside + a share of the random ones
    # class means differ: nearest-class-mean on features alone is well above chance (0.2)
    means = torch.stack([data.x[data.y == c].mean(0) for c in range(5)])
    accuracy = (torch.cdist(data.x, means).argmin(1) == data.y).float().mean()
    assert accuracy > 0.35


def test_node_ids_are_shuffled(tmp_path: Path) -> None:
    y = _build(tmp_path).load().y
    runs = (y[1:] != y[:-1]).sum()
    assert runs > 1000, "classes must not be contiguous id ranges"


def test_cache_is_reused_and_keyed_by_parameters(tmp_path: Path) -> None:
    graph = _build(tmp_path)
    graph.prepare()
    x_file = graph.cache.path / "x.npy"
    stamp = os.stat(x_file).st_mtime_ns
    _build(tmp_path).load()
    assert os.stat(x_file).st_mtime_ns == stamp, "a second build must reuse the cache"
    other = _build(tmp_path, num_features=8)
    assert other.cache.path != graph.cache.path
    assert other.load().x.shape[1] == 8
    assert graph.load().x_file == str(x_file)


def test_float16_features(tmp_path: Path) -> None:
    data = _build(tmp_path, feature_dtype="float16").load()
    assert data.x.dtype == torch.float16


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"homophily": 1.5}, "homophily"),
        ({"avg_degree": 0}, "avg_degree"),
        ({"train_fraction": 0.9, "val_fraction": 0.2}, "train_fraction"),
        ({"feature_dtype": "int8"}, "feature_dtype"),
        ({"skew": -1.0}, "skew"),
    ],
)
def test_bad_parameters_name_the_key(tmp_path: Path, kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        _build(tmp_path, **kwargs)


@pytest.mark.cuda
def test_generates_on_the_gpu(tmp_path: Path) -> None:
    cpu = _build(tmp_path / "cpu").load()
    gpu_graph = _build(tmp_path / "gpu", device="cuda")
    assert gpu_graph.cache.path.name != _build(tmp_path / "cpu").cache.path.name
    gpu = gpu_graph.load()
    assert gpu.x.device.type == "cpu" and gpu.x.shape == cpu.x.shape
    assert torch.equal(gpu.y, cpu.y)  # labels and splits come from the CPU streams
    assert torch.equal(gpu.train_idx, cpu.train_idx)
    assert abs(gpu.num_edges - cpu.num_edges) < 0.01 * cpu.num_edges
    same = (gpu.y[gpu.edge_index[0]] == gpu.y[gpu.edge_index[1]]).float().mean()
    assert 0.75 < same < 0.9
    again = _build(tmp_path / "gpu2", device="cuda").load()
    assert torch.equal(again.edge_index, gpu.edge_index) and torch.equal(again.x, gpu.x)


def test_split_source_names_the_generator(tmp_path) -> None:
    ds = SyntheticGraph(num_nodes=100, train_fraction=0.5, val_fraction=0.25, seed=3, cache_dir=str(tmp_path))
    assert ds.split_source("val").startswith("SyntheticGraph(num_nodes=100, train_fraction=0.5, val_fraction=0.25, seed=3)")


def test_a_damaged_cache_names_the_file_and_says_to_delete_it(tmp_path) -> None:
    import re

    ds = SyntheticGraph(num_nodes=200, cache_dir=str(tmp_path))
    ds.prepare()
    x = ds.cache.file("x")
    x.write_bytes(x.read_bytes()[:-64])  # truncated
    with pytest.raises(ValueError, match=re.escape(f"{x}: has ") + r"[\d,]+ bytes, [\d,]+ when its cache was built.*delete that directory"):
        SyntheticGraph(num_nodes=200, cache_dir=str(tmp_path)).load()
    x.unlink()
    with pytest.raises(ValueError, match=re.escape(f"{x}: is missing: the cache {ds.cache.path} is damaged")):
        SyntheticGraph(num_nodes=200, cache_dir=str(tmp_path)).load()
    (ds.cache.path / "meta.json").write_text("{")
    with pytest.raises(ValueError, match=r"meta\.json: is not valid JSON"):
        ds.cache.meta()


def test_sorted_search_of_large_node_types_is_searchsorted() -> None:
    from lightning_zerocopy.datasets.synthetic import _SORTED_SEARCH_FROM, _search

    g = torch.Generator().manual_seed(0)
    cdf = torch.cumsum(torch.rand(_SORTED_SEARCH_FROM + 5, generator=g, dtype=torch.float64), 0)
    values = torch.rand(10_000, generator=g, dtype=torch.float64) * float(cdf[-1])
    values[:3] = torch.tensor([0.0, float(cdf[10]), float(cdf[-1])])  # ties and the ends
    assert torch.equal(_search(cdf, values), torch.searchsorted(cdf, values, right=True))
