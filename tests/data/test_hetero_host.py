"""The heterogeneous host copy: one CSC per edge type over both id spaces, features per type, checks at setup."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.hetero import CITES, EDGE_TYPES, WRITES, TinyHeteroDataset, make_hetero_data
from lightning_zerocopy import ZeroCopyHeteroDataModule
from lightning_zerocopy.data.host.share import share_hetero_data
from lightning_zerocopy.data.resources import HostData
from lightning_zerocopy.datasets.base import InputDataError


def _open(data, storage="shared_memory"):
    handles = share_hetero_data(data, storage)
    try:
        return handles, HostData.open(handles)
    finally:
        handles.unlink()  # mappings stay valid


def test_one_csc_per_edge_type_over_the_larger_id_space() -> None:
    data = make_hetero_data()
    handles, host = _open(data)
    assert handles.edge_types == EDGE_TYPES and handles.node_types == ["paper", "author", "institution"]
    writes = host.graphs[WRITES]  # 60 authors -> 40 papers: indptr covers 60 ids, its tail past paper 39 is flat
    assert writes.num_nodes == 60 and writes.indptr.numel() == 61
    assert bool((writes.indptr[41:] == writes.indptr[40]).all()) and int(writes.indptr[40]) == data.edge_index[WRITES].shape[1]
    for et in EDGE_TYPES:
        graph = host.graphs[et]
        dst = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.indptr.diff())
        assert torch.equal(data.edge_index[et][:, graph.edge_perm], torch.stack([graph.indices.to(torch.int64), dst]))
    assert set(host.features) == {"paper", "institution"}
    assert torch.equal(host.features["paper"].data, data.x["paper"]) and torch.equal(host.labels, data.y)
    assert host.graphs[CITES].num_nodes == 40


def test_mmap_maps_each_types_npy_file(tmp_path) -> None:
    data = make_hetero_data()
    for node_type, x in data.x.items():
        np.save(tmp_path / f"{node_type}.npy", x.numpy())
        data.x_files[node_type] = str(tmp_path / f"{node_type}.npy")
    _, host = _open(data, "mmap")
    assert torch.equal(host.features["institution"].data, data.x["institution"])
    del data.x_files["paper"]
    with pytest.raises(ValueError, match=r"\['paper'\] have none"):
        share_hetero_data(data, "mmap")


class _BadIds(TinyHeteroDataset):
    def load(self):
        data = super().load()
        data.edge_index[WRITES][0, 5] = 60  # one author too far
        return data


def test_an_out_of_range_id_fails_setup_naming_the_edge_type() -> None:
    module = ZeroCopyHeteroDataModule(_BadIds(), num_neighbors=[2])
    with pytest.raises(InputDataError, match=r"author__writes__paper.*'author' id 60"):
        module.setup("fit")
    assert module.resources is None


def test_a_feature_cache_of_one_table_is_refused() -> None:
    from lightning_zerocopy.cache.provider import HotRowsCache

    module = ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[2])
    with pytest.raises(ValueError, match="a GPU feature cache per node type"):
        module.set_feature_cache(HotRowsCache(4))
    module.set_feature_cache(None)  # no cache: fine
