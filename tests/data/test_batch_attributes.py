"""Every node- and edge-level attribute of the user's graph reaches the batch, as PyG's loaders carry it: each one the
source rows at ``n_id`` / ``e_id`` that PyG's own ``filter_data`` / ``filter_hetero_data`` give, for the node and link
DataModules, untyped and typed (CPU placements); ``input_id`` as PyG's ``get_input_nodes`` makes it; the
``attributes`` key; bad input in one line."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from helpers.attributes import (
    WRITES,
    attributed_data,
    attributed_datamodule,
    attributed_hetero,
    attributes_of_batch,
    pyg_reference,
)
from torch_geometric.data import Data
from torch_geometric.loader.utils import get_input_nodes

from lightning_zerocopy import ZeroCopyDataModule, ZeroCopyHeteroDataModule
from lightning_zerocopy.datasets import InputDataError, NodeData, NodeDataset, PyGNodeDataset
from lightning_zerocopy.datasets.attributes import Attribute, AttributeKey
from lightning_zerocopy.datasets.pyg_hetero import PyGHeteroDataset
from lightning_zerocopy.graph.schema import EDGE, NODE

_LOADER = dict(batch_size=8, num_threads=1)


def _batches(dm: Any, split: str = "train", count: int = 3) -> list[Any]:
    loader = getattr(dm, f"{split}_dataloader")()
    return [batch for _, batch in zip(range(count), loader)]


def _assert_as_pyg(batch: Any, source: Any) -> None:
    ours, theirs = attributes_of_batch(batch), pyg_reference(source, batch)
    assert sorted(ours, key=str) == sorted(theirs, key=str)
    for key, want in theirs.items():
        got = ours[key]
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), key


@pytest.mark.parametrize("kind", ["node", "link", "hetero", "hetero_link"])
def test_every_attribute_is_the_source_rows_that_pyg_filters_into_the_batch(kind: str) -> None:
    """Train batches and node-keyed val batches: the same attribute names on the same stores as PyG's batch, each the
    source's rows at the batch's ``n_id`` / ``e_id`` (dtypes and trailing shapes kept; ``pair_index`` [2, E] along
    its last dim, as PyG's ``__cat_dim__`` says)."""
    dm, source = attributed_datamodule(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the graph-level `name` (tested below)
        dm.setup("fit")
    try:
        for batch in _batches(dm, "train") + _batches(dm, "val", 2):
            _assert_as_pyg(batch, source)
    finally:
        dm.teardown("fit")


def test_edge_weight_reaches_the_batch() -> None:
    """A weighted GCN reads ``batch.edge_weight`` (PyG's karate test trains on it); it arrived missing."""
    dm, data = attributed_datamodule("node")
    dm.setup("fit")
    try:
        batch = _batches(dm, count=1)[0]
        assert torch.equal(batch.edge_weight, data.edge_weight[batch.e_id])
    finally:
        dm.teardown("fit")


def test_node_masks_reach_the_batch() -> None:
    dm, data = attributed_datamodule("node")
    dm.setup("fit")
    try:
        batch = _batches(dm, count=1)[0]
        for name in ("train_mask", "val_mask", "test_mask"):
            assert batch[name].dtype == torch.bool and torch.equal(batch[name], data[name][batch.n_id]), name
        assert bool(batch.train_mask[: batch.batch_size].all())  # the seeds are training nodes
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("kind", ["node", "hetero"])
def test_input_id_holds_node_ids_for_a_mask_split_and_positions_for_an_index_split(kind: str) -> None:
    """PyG's ``get_input_nodes`` turns a boolean mask into ``nonzero()`` ids and uses them as ``input_id``; an index
    tensor keeps ``input_id`` as positions (``None`` there: the loader's indices). Ours arrived as positions for both."""
    data = attributed_data() if kind == "node" else attributed_hetero()
    store = data if kind == "node" else data["paper"]
    assert torch.equal(get_input_nodes(data, store.train_mask if kind == "node" else ("paper", store.train_mask))[2],
                       store.train_mask.nonzero().view(-1))  # fmt: skip
    for by_index in (False, True):
        if by_index:
            for split in ("train", "val", "test"):
                store[f"{split}_idx"] = store[f"{split}_mask"].nonzero().view(-1).flip(0)
                del store[f"{split}_mask"]
        if kind == "node":
            dm = ZeroCopyDataModule(PyGNodeDataset(data), fanouts=[3, 2], shuffle=True, **_LOADER)
        else:
            dm = ZeroCopyHeteroDataModule(PyGHeteroDataset(data), num_neighbors=[3, 2], shuffle=True, **_LOADER)
        dm.setup("fit")
        try:
            for split in ("train", "val"):
                for batch in _batches(dm, split, 2):
                    seeds = batch if kind == "node" else batch["paper"]
                    ids = seeds.n_id[: seeds.batch_size]
                    if by_index:  # positions: the split's ids at input_id are the seeds
                        assert not torch.equal(seeds.input_id, ids)
                        assert torch.equal(dm.split_tensors[split][seeds.input_id], ids)
                    else:
                        assert torch.equal(seeds.input_id, ids)
        finally:
            dm.teardown("fit")


def test_the_attributes_key_leaves_attributes_out() -> None:
    dm, _ = attributed_datamodule("node", attributes="none")
    dm.setup("fit")
    try:
        batch = _batches(dm, count=1)[0]
        assert not [key for key in attributes_of_batch(batch) if key[1] not in ("x", "y")]
    finally:
        dm.teardown("fit")
    dm, data = attributed_datamodule("hetero", attributes=["weight", "year"])
    dm.setup("fit")
    try:
        batch = _batches(dm, count=1)[0]
        assert {key for key in attributes_of_batch(batch) if key[1] not in ("x", "y")} == {
            (WRITES, "weight"), (("paper", "rev_writes", "author"), "weight"), ("paper", "year")}
        assert torch.equal(batch[WRITES].weight, data[WRITES].weight[batch[WRITES].e_id])
    finally:
        dm.teardown("fit")


def test_an_unknown_name_in_the_attributes_key_is_one_line() -> None:
    dm, _ = attributed_datamodule("node", attributes=["edge_weight", "weights"])
    with pytest.raises(InputDataError, match=r"data.init_args.attributes names \['weights'\].*it has: .*edge_weight"):
        dm.setup("fit")
    with pytest.raises(ValueError, match="data.init_args.attributes must be 'all', 'none' or a list"):
        attributed_datamodule("node", attributes="some")


def test_an_attribute_named_like_a_batch_field_is_one_line_unless_left_out() -> None:
    data = attributed_data()
    data.n_id = torch.arange(data.num_nodes)  # PyG's loader would keep these values as the batch's n_id
    dm = ZeroCopyDataModule(PyGNodeDataset(data), fanouts=[3, 2], **_LOADER)
    with pytest.raises(InputDataError, match=r"data\.n_id is named like the batch field 'n_id'.*attributes"):
        dm.setup("fit")
    dm = ZeroCopyDataModule(PyGNodeDataset(data), fanouts=[3, 2], attributes=["edge_weight"], **_LOADER)
    dm.setup("fit")
    try:
        batch = _batches(dm, count=1)[0]
        assert torch.equal(batch.edge_weight, data.edge_weight[batch.e_id]) and "train_mask" not in batch
    finally:
        dm.teardown("fit")


def test_what_pyg_would_copy_unchanged_is_left_out_with_one_warning() -> None:
    data = attributed_data()
    data.names = [f"node {i}" for i in range(data.num_nodes)]  # node-level, but no tensor
    data.scale = torch.tensor([2.0, 3.0])  # graph-level
    with pytest.warns(UserWarning, match=r"left out of the batches: data\.name .*data\.names .*data\.scale") as caught:
        PyGNodeDataset(data).load()
    assert len([w for w in caught if "left out" in str(w.message)]) == 1


def test_pyg_decides_node_or_edge_level_when_the_counts_are_equal() -> None:
    """PyG's ``Data.is_node_attr`` / ``is_edge_attr``: with as many nodes as edges, a name with ``edge`` is an edge
    attribute, any other a node attribute."""
    g = torch.Generator().manual_seed(1)
    n = 30
    data = Data(x=torch.randn(n, 3, generator=g), y=torch.randint(0, 2, (n,), generator=g),
                edge_index=torch.randint(0, n, (2, n), generator=g), train_idx=torch.arange(10),
                val_idx=torch.arange(10, 20), test_idx=torch.arange(20, 30), edge_score=torch.randn(n, generator=g),
                node_score=torch.randn(n, generator=g))  # fmt: skip
    found = PyGNodeDataset(data).load().attributes
    assert set(found) == {AttributeKey("edge", EDGE, "edge_score"), AttributeKey("node", NODE, "node_score")}
    dm = ZeroCopyDataModule(PyGNodeDataset(data), fanouts=[-1], **_LOADER)
    dm.setup("fit")
    try:
        batch = _batches(dm, count=1)[0]
        _assert_as_pyg(batch, data)
    finally:
        dm.teardown("fit")


class _Rows(NodeDataset):
    """A dataset of the node contract whose attribute has the wrong row count."""

    num_features = 4
    num_classes = 2

    def load(self) -> NodeData:
        g = torch.Generator().manual_seed(0)
        return NodeData(edge_index=torch.randint(0, 20, (2, 50), generator=g), x=torch.randn(20, 4, generator=g),
                        y=torch.randint(0, 2, (20,), generator=g), train_idx=torch.arange(10),
                        val_idx=torch.arange(10, 15), test_idx=torch.arange(15, 20),
                        attributes={AttributeKey("edge", EDGE, "weight"): Attribute(torch.rand(49))})  # fmt: skip


def test_a_dataset_attribute_with_another_row_count_is_one_line() -> None:
    dm = ZeroCopyDataModule(_Rows(), fanouts=[2], **_LOADER)
    with pytest.raises(InputDataError, match=r"data\.weight has 49 rows along dim 0, but there are 50 edges"):
        dm.setup("fit")
    dm = ZeroCopyDataModule(_Rows(), fanouts=[2], attributes="none", **_LOADER)  # left out: never read
    dm.setup("fit")
    try:
        assert "weight" not in _batches(dm, count=1)[0]
    finally:
        dm.teardown("fit")


def test_node_attributes_are_read_at_the_original_ids_under_a_node_order() -> None:
    """A node order renumbers the graph and features, never the attributes: they are read at the batch's ``n_id``."""
    dm, data = attributed_datamodule("node", node_order="bfs")
    dm.setup("fit")
    try:
        for batch in _batches(dm, "train", 2):
            _assert_as_pyg(batch, data)
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("kind", ["node", "link", "hetero", "hetero_link"])
def test_predict_batches_carry_the_attributes(kind: str) -> None:
    options = {"predict_split": "all"} if kind in ("node", "hetero") else {"predict_split": "val"}
    dm, data = attributed_datamodule(kind, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm.setup("predict")
    try:
        for batch in _batches(dm, "predict", 2):
            _assert_as_pyg(batch, data)
            if kind in ("node", "hetero"):  # every node: positions are the ids
                seeds = batch if kind == "node" else batch["paper"]
                assert torch.equal(seeds.input_id, seeds.n_id[: seeds.batch_size])
    finally:
        dm.teardown("predict")


def test_node_attributes_are_written_into_the_slot_buffers_a_pipeline_hands_over() -> None:
    """A node attribute is a slot field like ``x`` (a slot has a row per node): the builder writes its rows in place."""
    dm, data = attributed_datamodule("node")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm.setup("fit")
    try:
        builder = dm.builder("train").open(dm.resources)
        assert set(builder.slot_fields) == {"x", "y", "train_mask", "val_mask", "test_mask", "year", "patch"}
        rows = builder.max_nodes(8)
        out = {"year": torch.empty(rows, dtype=torch.int64), "patch": torch.empty(rows, 2, 3, dtype=torch.float16)}
        batch = builder.build_batch(dm.plan("train").item(0, 0), out=out)
        for name, buffer in out.items():
            assert batch[name].data_ptr() == buffer.data_ptr() and torch.equal(batch[name], data[name][batch.n_id])
        builder.close()
    finally:
        dm.teardown("fit")
