"""check_splits: ids in range and unique per split (errors naming split and source), overlaps as warnings."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
import torch

from lightning_zerocopy.datasets import NodeData, OGBNodeDataset, SplitError, check_splits
from lightning_zerocopy.datasets.splits import SplitError as SplitErrorFromModule


def _data(train, val, test, num_nodes: int = 20, num_classes: int = 3) -> NodeData:
    gen = torch.Generator().manual_seed(0)
    return NodeData(
        edge_index=torch.randint(0, num_nodes, (2, 40), generator=gen),
        x=torch.randn(num_nodes, 4, generator=gen),
        y=torch.randint(0, num_classes, (num_nodes,), generator=gen),
        train_idx=torch.tensor(train, dtype=torch.int64),
        val_idx=torch.tensor(val, dtype=torch.int64),
        test_idx=torch.tensor(test, dtype=torch.int64),
    )


SOURCES = {"train": "tr.csv", "val": "va.csv", "test": "te.csv"}


def test_disjoint_splits_pass() -> None:
    assert check_splits(_data([0, 5, 3], [1, 2], [19, 4]), SOURCES, num_classes=3) == []
    assert check_splits(_data([0], [], []), SOURCES) == []  # empty val/test are fine


def test_out_of_range_ids_name_the_split_and_its_source() -> None:
    with pytest.raises(SplitError, match=re.escape("the val split (va.csv) holds node id 20 at entry 2 (counting from 1), "
                                                   "but the graph has 20 nodes (ids 0 to 19)")) as info:
        check_splits(_data([0], [1, 20, 21], [2]), SOURCES)
    assert (info.value.split, info.value.source) == ("val", "va.csv")
    assert "2 ids are out of range in all" in str(info.value)
    with pytest.raises(SplitError, match=r"the test split \(te.csv\) holds node id -1 at entry 1"):
        check_splits(_data([0], [1], [-1]), SOURCES)


def test_repeated_ids_are_errors() -> None:
    with pytest.raises(SplitError, match=re.escape("the train split (tr.csv) lists node 7 more than once (entries 2 and 5, "
                                                   "counting from 1); 2 entries repeat an earlier one")):
        check_splits(_data([3, 7, 1, 9, 7, 3], [2], [4]), SOURCES)


def test_training_nodes_in_val_or_test_are_an_error_naming_the_count_and_the_first() -> None:
    """Overlapping train and test masks trained with a warning: the training labels leak into the test scores."""
    with pytest.raises(SplitError, match=re.escape(
        "the test split (te.csv) shares 2 nodes with the train split (tr.csv), the first being node 0: their training "
        "labels leak into the test scores. Make the splits disjoint, or set data.init_args.allow_split_overlap: true "
        "to train anyway"
    )):  # fmt: skip
        check_splits(_data([0, 1, 2], [3], [0, 4, 2]), SOURCES, opt_out="data.init_args.allow_split_overlap: true")
    assert len(check_splits(_data([0, 1], [2, 3], [3, 4]), SOURCES)) == 1  # val and test: a warning


def test_overlaps_are_warnings_when_allowed() -> None:
    warnings = check_splits(_data([0, 1, 2], [2, 3], [3, 4, 0]), SOURCES, allow_train_overlap=True)
    assert warnings == [
        "the train split (tr.csv) and the val split (va.csv) share 1 node (e.g. 2): training nodes are scored again,"
        " so the scores overstate accuracy",
        "the train split (tr.csv) and the test split (te.csv) share 1 node (e.g. 0): training nodes are scored again,"
        " so the scores overstate accuracy",
        "the val split (va.csv) and the test split (te.csv) share 1 node (e.g. 3): these nodes are scored in both",
    ]


def test_labels_beyond_num_classes_are_errors() -> None:
    data = _data([0, 1], [2], [3])
    data.y[1] = 5
    with pytest.raises(SplitError, match=r"the train split \(tr.csv\) holds node 1 labeled 5, but the dataset has 3 classes"):
        check_splits(data, SOURCES, num_classes=3)
    data.y[1] = -1  # unlabeled: fine (the reference models ignore -1)
    assert check_splits(data, SOURCES, num_classes=3) == []


def test_ogb_splits_are_named_by_their_file(tmp_path: Path) -> None:
    root = tmp_path / "ogbn_x"
    files = {
        "raw/edge.csv.gz": "0,1\n1,2\n",
        "raw/node-feat.csv.gz": "0.5\n1.5\n2.5\n3.5\n",
        "raw/node-label.csv.gz": "0\n1\n0\n1\n",
        "split/s/train.csv.gz": "0\n1\n0\n",
        "split/s/valid.csv.gz": "2\n",
        "split/s/test.csv.gz": "3\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(gzip.compress(text.encode()))
    ds = OGBNodeDataset(str(root), cache_dir=str(tmp_path / "cache"))
    sources = {name: ds.split_source(name) for name in SOURCES}
    assert sources["val"] == str(root / "split" / "s" / "valid.csv.gz")
    with pytest.raises(SplitErrorFromModule, match=re.escape(f"the train split ({root / 'split' / 's' / 'train.csv.gz'}) lists node 0")):
        check_splits(ds.load(), sources)



def test_one_repeat_reads_in_the_singular() -> None:
    with pytest.raises(SplitError, match=r"; 1 entry repeats an earlier one\. A split must list each node once$"):
        check_splits(_data([3, 7, 3], [2], [4]), SOURCES)


def test_a_label_below_minus_one_names_the_node() -> None:
    data = _data([0, 5, 3], [1, 2], [19, 4])
    data.y[5] = -3  # -1 means unlabeled; -3 would fail inside the training step, naming no node
    data.y[1] = -1
    with pytest.raises(SplitError, match=re.escape("the train split (tr.csv) holds node 5 labeled -3, but labels are "
                                                   "classes 0 to 2, or -1 for an unlabeled node; 1 node")):
        check_splits(data, SOURCES, num_classes=3)


def test_a_train_split_without_a_batch_is_an_error() -> None:
    from lightning_zerocopy.datasets.splits import check_trainable

    check_trainable(1, 3, "tr.csv")
    with pytest.raises(SplitError, match=re.escape("the train split (tr.csv) holds no node: there is nothing to fit")):
        check_trainable(0, 0, "tr.csv")
    with pytest.raises(SplitError, match=r"the train split \(tr.csv\) holds 3 nodes, which fill no whole batch of "
                                         r"data\.batch_size over 2 ranks with data\.drop_last=true"):
        check_trainable(0, 3, "tr.csv", "data.", world_size=2)
