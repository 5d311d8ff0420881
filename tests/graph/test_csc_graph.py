"""CSCGraph: construction, validation, shared memory across processes and the on-disk cache."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import pytest
import torch

from lightning_zerocopy.graph import CSCGraph, CSCGraphHandle, NpyTensorHandle, SharedTensorHandle

SPAWN = mp.get_context("spawn")


def random_edge_index(num_nodes=200, num_edges=3_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_nodes, (2, num_edges), generator=g)


def _child_sum_graph(handle: CSCGraphHandle, to_parent) -> None:
    graph = handle.open()
    to_parent.put((int(graph.indptr.sum()), int(graph.indices.long().sum()), int(graph.edge_perm.sum())))


def test_from_edge_index_groups_incoming_edges():
    edge_index = random_edge_index()
    graph = CSCGraph.from_edge_index(edge_index).validate()
    assert graph.num_nodes == int(edge_index.max()) + 1
    assert graph.num_edges == edge_index.shape[1]
    assert torch.equal(graph.degree(), torch.bincount(edge_index[1], minlength=graph.num_nodes))
    # Every compressed edge is the input edge edge_perm points at, with messages flowing src -> dst.
    dst = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.degree())
    assert torch.equal(edge_index[0, graph.edge_perm], graph.indices.long())
    assert torch.equal(edge_index[1, graph.edge_perm], dst)
    assert torch.equal(torch.sort(graph.edge_perm).values, torch.arange(graph.num_edges))


def test_from_edge_index_options_and_int32_input():
    edge_index = torch.tensor([[0, 1, 1, 2, 1], [0, 2, 2, 0, 2]], dtype=torch.int32)
    graph = CSCGraph.from_edge_index(edge_index, num_nodes=4, remove_self_loops=True, remove_duplicates=True)
    assert graph.indptr.tolist() == [0, 1, 1, 2, 2]
    assert graph.indices.tolist() == [2, 1] and graph.edge_perm.tolist() == [3, 1]
    assert CSCGraph.from_edge_index(torch.empty(2, 0, dtype=torch.long)).num_nodes == 0


def test_from_edge_index_bad_input():
    with pytest.raises(ValueError, match="`edge_index`"):
        CSCGraph.from_edge_index(torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="`edge_index`"):
        CSCGraph.from_edge_index(torch.rand(2, 4))
    with pytest.raises(IndexError, match="`dst`.*9"):
        CSCGraph.from_edge_index(torch.tensor([[0, 1], [2, 9]]), num_nodes=5)


@pytest.mark.parametrize(
    "corrupt,field",
    [
        (lambda g: g.indptr.__setitem__(3, g.indptr[2] - 1), "indptr"),
        (lambda g: g.indptr.__setitem__(0, 1), r"indptr\[0\]"),
        (lambda g: g.indices.__setitem__(5, g.num_nodes), "indices"),
        (lambda g: g.indices.__setitem__(5, -2), "indices"),
        (lambda g: setattr(g, "indptr", g.indptr[:-1]), "indptr"),
        (lambda g: setattr(g, "indices", g.indices[:-1]), r"indptr\[-1\]"),
        (lambda g: setattr(g, "edge_perm", g.edge_perm[:-1]), "edge_perm"),
        (lambda g: setattr(g, "indptr", g.indptr.int()), "indptr"),
        (lambda g: setattr(g, "indices", g.indices.float()), "indices"),
    ],
)
def test_validate_names_the_field(corrupt, field):
    graph = CSCGraph.from_edge_index(random_edge_index(seed=1))
    corrupt(graph)
    with pytest.raises((ValueError, TypeError), match=rf"`{field}"):
        graph.validate()


def test_share_handle_opens_same_memory_in_another_process():
    graph = CSCGraph.from_edge_index(random_edge_index(seed=2))
    with pytest.raises(ValueError, match="share"):
        graph.handle()
    shared = graph.share()
    handle = pickle.loads(pickle.dumps(shared.handle()))
    assert isinstance(handle.indices, SharedTensorHandle)
    try:
        opened = handle.open().validate()
        assert torch.equal(opened.indices, graph.indices) and torch.equal(opened.edge_perm, graph.edge_perm)
        opened.indices[0] = opened.indices[0] + 1  # same pages as `shared`
        assert int(shared.indices[0]) == int(graph.indices[0]) + 1
        shared.indices[0] = graph.indices[0]
        to_parent = SPAWN.Queue()
        child = SPAWN.Process(target=_child_sum_graph, args=(handle, to_parent))
        child.start()
        expected = (int(graph.indptr.sum()), int(graph.indices.long().sum()), int(graph.edge_perm.sum()))
        assert to_parent.get(timeout=60) == expected
        child.join(60)
    finally:
        shared.unlink()
    assert not any(os.path.exists(h.path) for h in (handle.indptr, handle.indices, handle.edge_perm))
    assert torch.equal(shared.indices, graph.indices)  # mappings outlive the names


@pytest.mark.parametrize("mmap", [True, False])
def test_save_load_roundtrip(tmp_path, mmap):
    graph = CSCGraph.from_edge_index(random_edge_index(seed=3))
    graph.save(tmp_path / "g")
    loaded = CSCGraph.load(tmp_path / "g", mmap=mmap).validate()
    assert loaded.num_nodes == graph.num_nodes
    for name in ("indptr", "indices", "edge_perm"):
        assert torch.equal(getattr(loaded, name), getattr(graph, name))
        assert getattr(loaded, name).dtype == getattr(graph, name).dtype
    assert loaded.is_shareable == mmap
    if mmap:
        handle = pickle.loads(pickle.dumps(loaded.handle()))
        assert isinstance(handle.indptr, NpyTensorHandle)
        assert torch.equal(handle.open().indices, graph.indices)


def test_save_load_without_edge_perm(tmp_path):
    graph = CSCGraph.from_edge_index(random_edge_index(seed=4))
    graph.edge_perm = None
    graph.save(tmp_path / "g")
    loaded = CSCGraph.load(tmp_path / "g").validate()
    assert loaded.edge_perm is None and torch.equal(loaded.indices, graph.indices)
    shared = loaded.share()
    assert shared.handle().edge_perm is None
    shared.unlink()


def test_load_missing_cache(tmp_path):
    with pytest.raises(FileNotFoundError, match="meta.json"):
        CSCGraph.load(tmp_path / "nothing")
