"""Gzipped CSV reading: values exact, errors naming the file and the right line across block boundaries."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import pytest

from lightning_zerocopy.datasets import csv_gz
from lightning_zerocopy.datasets.base import DatasetFileError


def _gz(path: Path, text: str) -> Path:
    path.write_bytes(gzip.compress(text.encode("ascii"), mtime=0))
    return path


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(csv_gz, "_BLOCK_BYTES", 37)  # many blocks, cut mid-line


def test_values_are_exact_over_many_blocks(tmp_path: Path, small_blocks: None) -> None:
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 2**62, size=(300, 2))  # beyond float64's exact integers
    path = _gz(tmp_path / "e.csv.gz", "".join(f"{a},{b}\n" for a, b in ids))
    assert np.array_equal(csv_gz.read_csv_matrix(path, np.int64, "t", width=2), ids)
    feats = rng.standard_normal((120, 3)).astype(np.float32)
    path = _gz(tmp_path / "f.csv.gz", "".join(",".join(format(v, ".9g") for v in row) + "\n" for row in feats))
    out = tmp_path / "f.npy"
    csv_gz.convert_csv_to_npy(path, out, 120, np.float32, "t")
    assert np.array_equal(np.load(out), feats)


@pytest.mark.parametrize("bad_line", [1, 2, 57, 300])
def test_the_bad_line_is_found_in_any_block(tmp_path: Path, small_blocks: None, bad_line: int) -> None:
    lines = [f"{i},{i + 1}\n" for i in range(300)]
    lines[bad_line - 1] = "12,13.5\n"
    path = _gz(tmp_path / "e.csv.gz", "".join(lines))
    with pytest.raises(DatasetFileError, match=re.escape(f"{path}, line {bad_line}: value 2 ('13.5') is not an integer")) as info:
        csv_gz.read_csv_matrix(path, np.int64, "t", width=2)
    assert info.value.line == bad_line and info.value.path == path


def test_a_file_without_a_final_newline_and_with_crlf_reads(tmp_path: Path) -> None:
    path = _gz(tmp_path / "e.csv.gz", "1,2\r\n3,4")
    assert csv_gz.read_csv_matrix(path, np.int64, "t").tolist() == [[1, 2], [3, 4]]


def test_empty_lines_and_rows_past_the_end_are_named(tmp_path: Path) -> None:
    path = _gz(tmp_path / "e.csv.gz", "1,2\n\n3,4\n")
    with pytest.raises(DatasetFileError, match=r", line 2: expected 2 comma-separated values, found 1: ''"):
        csv_gz.read_csv_matrix(path, np.int64, "t")
    path = _gz(tmp_path / "f.csv.gz", "1,2\n3,4\n5,6\n")
    with pytest.raises(DatasetFileError, match=r", line 3: has more than the expected 2 nodes"):
        csv_gz.convert_csv_to_npy(path, tmp_path / "f.npy", 2, np.float32, "t", what="nodes")
    with pytest.raises(DatasetFileError, match=re.escape(f"{tmp_path / 'g.csv.gz'}: is empty")):
        csv_gz.first_row_width(_gz(tmp_path / "g.csv.gz", ""))


def test_a_non_ascii_byte_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "e.csv.gz"
    path.write_bytes(gzip.compress("1,2\n3,4\n\xe9,5\n".encode("latin-1")))
    with pytest.raises(DatasetFileError, match=re.escape(f"{path}, line 3: holds a byte that is not ASCII text")):
        csv_gz.read_csv_matrix(path, np.int64, "t")
