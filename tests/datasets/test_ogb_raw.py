"""The shared reader of OGB's raw/ folder checks the edge and node counts against OGB's own count files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lightning_zerocopy.datasets import DatasetFileError
from lightning_zerocopy.datasets.ogb_raw import read_edges
from tests.datasets.test_ogb import _write_csv


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    raw = tmp_path / "ogbn_counts" / "raw"
    _write_csv(raw / "edge.csv.gz", rng.integers(0, 30, size=(78, 2)), "g")
    _write_csv(raw / "num-edge-list.csv.gz", np.array([78]), "g")
    return raw


def test_edges_matching_their_count_file_are_read(raw: Path) -> None:
    assert read_edges(raw, 30, "test").shape == (2, 78)


@pytest.mark.parametrize("rows", [40, 0])
def test_a_cut_or_emptied_edge_file_names_the_count_file_it_disagrees_with(raw: Path, rows: int) -> None:
    edges = np.random.default_rng(1).integers(0, 30, size=(rows, 2))
    _write_csv(raw / "edge.csv.gz", edges, "g")
    with pytest.raises(DatasetFileError, match=rf"edge.csv.gz: has {rows} edges \(lines\), but num-edge-list.csv.gz says 78"):
        read_edges(raw, 30, "test")


def test_a_bad_count_file_is_named(raw: Path) -> None:
    _write_csv(raw / "num-edge-list.csv.gz", np.array([-5]), "g")
    with pytest.raises(DatasetFileError, match=r"num-edge-list.csv.gz: holds -5: it must hold the count"):
        read_edges(raw, 30, "test")


