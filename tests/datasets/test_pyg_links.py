"""PyGLinkDataset maps RandomLinkSplit's three Data objects (binary edge_label) to LinkSplits."""

from __future__ import annotations

import random

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.transforms import RandomLinkSplit
from torch_geometric.utils import to_undirected

from lightning_zerocopy.datasets import PyGLinkDataset, check_link_splits

N = 200


def _graph(seed: int = 0, **extra) -> Data:
    gen = torch.Generator().manual_seed(seed)
    edge_index = to_undirected(torch.randint(N, (2, 800), generator=gen))
    return Data(x=torch.randn(N, 7, generator=gen), edge_index=edge_index, **extra)


def _pairs(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edge_index.T.tolist()))


def test_a_presplit_graph_maps_positives_negatives_and_the_graph() -> None:
    torch.manual_seed(1)
    random.seed(1)  # PyG's negative sampling draws from Python's random too: earlier tests must not change the split
    train, val, test = RandomLinkSplit(num_val=0.1, num_test=0.2, is_undirected=True)(_graph())
    ds = PyGLinkDataset((train, val, test))
    assert ds.num_features == 7
    data = ds.load()
    assert torch.equal(data.edge_index, val.edge_index) and torch.equal(data.x, val.x)
    assert torch.equal(data.split("train").pos_edge_index, train.edge_label_index[:, train.edge_label == 1])
    assert data.split("train").neg_edge_index is None  # drawn per batch by the DataModule
    for name, d in (("val", val), ("test", test)):
        split = data.split(name)
        assert torch.equal(split.pos_edge_index, d.edge_label_index[:, d.edge_label == 1])
        assert torch.equal(split.neg_edge_index, d.edge_label_index[:, d.edge_label == 0])
        assert split.num_negatives == split.num_positives  # neg_sampling_ratio 1
        assert split.edge_label is None and split.neg_per_positive is None
    assert ds.split_source("test") == "test_data.edge_label_index"
    assert check_link_splits(data, {s: ds.split_source(s) for s in data.splits}, undirected=True) == []


def test_an_unsplit_graph_is_split_here_with_the_seed() -> None:
    args = dict(num_val=0.1, num_test=0.1, is_undirected=True, neg_sampling_ratio=2.0)
    first = PyGLinkDataset(_graph(), random_link_split=args, seed=3).load()
    again = PyGLinkDataset(_graph(), random_link_split=args, seed=3).load()
    other = PyGLinkDataset(_graph(), random_link_split=args, seed=4).load()
    val = first.split("val")
    assert torch.equal(val.pos_edge_index, again.split("val").pos_edge_index)
    assert not torch.equal(val.pos_edge_index, other.split("val").pos_edge_index)
    assert val.num_negatives == 2 * val.num_positives
    graph = _pairs(first.edge_index)
    assert not (_pairs(val.pos_edge_index) | _pairs(val.pos_edge_index.flip(0))) & graph  # held out both ways


def test_split_labels_layout_is_read_too() -> None:
    torch.manual_seed(2)
    train, val, test = RandomLinkSplit(split_labels=True)(_graph())
    data = PyGLinkDataset([train, val, test]).load()
    assert torch.equal(data.split("test").pos_edge_index, test.pos_edge_label_index)
    assert torch.equal(data.split("test").neg_edge_index, test.neg_edge_label_index)
    assert PyGLinkDataset([train, val, test]).split_source("val") == "val_data.pos_edge_label_index"


def test_the_graphs_own_edge_labels_come_back_without_pygs_increment() -> None:
    graph = _graph()
    graph.edge_label = torch.randint(3, (graph.edge_index.shape[1],), generator=torch.Generator().manual_seed(5))
    torch.manual_seed(6)
    train, val, test = RandomLinkSplit()(graph)  # labels 0..2 become 1..3, negatives 0
    split = PyGLinkDataset((train, val, test)).load().split("val")
    positive = val.edge_label != 0
    assert torch.equal(split.pos_edge_index, val.edge_label_index[:, positive])
    assert torch.equal(split.edge_label, val.edge_label[positive] - 1) and bool((split.edge_label == 0).any())


def test_bad_inputs_name_what_to_change() -> None:
    torch.manual_seed(0)
    parts = RandomLinkSplit()(_graph())
    with pytest.raises(ValueError, match="random_link_split splits an unsplit graph"):
        PyGLinkDataset(parts, random_link_split={"num_val": 0.2})
    with pytest.raises(ValueError, match="neither edge_label_index nor pos_edge_label_index: split the graph"):
        PyGLinkDataset((_graph(), _graph(), _graph())).load()
    with pytest.raises(ValueError, match=r"the \(train_data, val_data, test_data\) of RandomLinkSplit, got 2"):
        PyGLinkDataset(parts[:2])
    with pytest.raises(TypeError, match="must be a torch_geometric Data"):
        PyGLinkDataset(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_bad_label_in_a_randomlinksplit_split_is_refused_at_setup(split: str) -> None:
    """PyG's positives are 1 and a graph's own labels + 1: a 2 among them passed the split's check (as a 1 among own
    labels 0) and reached the batches as 2; the labels are now checked as the batches carry them."""
    from lightning_zerocopy import ZeroCopyLinkDataModule
    from lightning_zerocopy.datasets.base import InputDataError

    torch.manual_seed(1)
    data = dict(zip(("train", "val", "test"), RandomLinkSplit(num_val=0.1, num_test=0.1)(_graph())))
    data[split].edge_label[0] = 2.0
    dm = ZeroCopyLinkDataModule(PyGLinkDataset([data["train"], data["val"], data["test"]]), num_neighbors=[3],
                                batch_size=16)  # fmt: skip
    pair = tuple(int(v) for v in data[split].edge_label_index[:, 0])
    with pytest.raises(InputDataError) as info:
        dm.setup("fit")
    message = str(info.value)
    assert message.startswith(f"data.init_args.dataset (PyGLinkDataset): the {split} split ({split}_data.edge_label_"
                              f"index) holds edge_label 2 for its positive 0 {pair}"), message  # fmt: skip
    assert "as its batches carry the labels" in message and "\n" not in message
