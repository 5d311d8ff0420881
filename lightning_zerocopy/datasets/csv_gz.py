"""Gzipped numeric CSV files (OGB's raw format), read fast, with errors that name the file and the line.

The fast path hands whole blocks of lines to ``np.fromstring``. When a block does not parse, or holds a
row with the wrong number of values, the block is scanned line by line to find the first bad line, so the
error (:class:`~lightning_zerocopy.datasets.base.DatasetFileError`) says which file, which line and what
is wrong with it. Damaged gzip data (a truncated download, a flipped bit, a plain-text file under a
``.gz`` name) is reported the same way, with how many lines were read before the damage.

Integer files (node ids, edges) must hold integers: ``3.7`` is an error, not node 3. Values written as
integral floats (``3.0``, ``1e3``) are accepted.
"""

from __future__ import annotations

import gzip
import os
import re
import warnings
import zlib
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
from tqdm.auto import tqdm

from lightning_zerocopy.datasets.base import DatasetFileError

__all__ = ["convert_csv_to_npy", "first_row_width", "read_csv_matrix"]

_BLOCK_BYTES = 1 << 24
_EXACT_FLOAT_INT = 2**53  # integers beyond this are not exact as float64
_NON_ASCII = re.compile(rb"[\x80-\xff]")


def _lines_before_damage(path: Path, non_ascii: bool = False) -> int:
    """How many whole lines of ``path`` decompress before its damage (or, with ``non_ascii``, before the first
    line holding a non-ASCII byte). An error path only: reads up to the damage."""
    lines = 0
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing; counts the first member only
    with open(path, "rb") as f:
        while not inflate.eof and (chunk := f.read(1 << 12)):  # small steps: lines of the failing step are lost
            try:
                text = inflate.decompress(chunk)
            except zlib.error:
                break
            found = _NON_ASCII.search(text) if non_ascii else None
            if found:
                return lines + text.count(b"\n", 0, found.start())
            lines += text.count(b"\n")
    return lines


def _damaged(path: Path, exc: BaseException) -> DatasetFileError:
    """The error for a file whose gzip data cannot be decompressed (or decoded as ASCII)."""
    if isinstance(exc, UnicodeDecodeError):
        line = _lines_before_damage(path, non_ascii=True) + 1
        return DatasetFileError(path, "holds a byte that is not ASCII text (a damaged file, or not a CSV)", line=line)
    lines = _lines_before_damage(path)
    after = f"after line {lines:,}" if lines else "within its first lines"
    if isinstance(exc, gzip.BadGzipFile) and "Not a gzipped file" in str(exc):
        problem = "is not a gzip file (OGB's raw files are gzipped CSV: compress it with `gzip`, or fetch it again)"
    elif isinstance(exc, gzip.BadGzipFile) and ("CRC check failed" in str(exc) or "Incorrect length" in str(exc)):
        problem = f"is damaged: it fails its gzip checksum ({exc}), so some of its content is wrong; copy or download it again"
    elif isinstance(exc, EOFError):
        problem = f"is truncated: its compressed data ends {after} (copy or download it again)"
    else:
        problem = f"is damaged: its gzip data cannot be decompressed {after} ({exc}); copy or download it again"
    return DatasetFileError(path, problem)


def _blocks(path: Path, desc: str) -> Iterator[tuple[str, int]]:
    """Yield ``(text, first_line)``: blocks of whole lines (each ending in ``\\n``) and the 1-based number of
    the block's first line, with a progress bar in compressed bytes."""
    total = os.path.getsize(path)
    line = 1  # number of the next block's first line
    try:
        with open(path, "rb") as raw, gzip.open(raw, "rt", encoding="ascii") as f, tqdm(
            total=total, desc=desc, unit="B", unit_scale=True, delay=1.0, leave=False
        ) as bar:
            tail = ""
            while True:
                block = f.read(_BLOCK_BYTES)
                if not block:
                    break
                block = tail + block
                cut = block.rfind("\n") + 1
                block, tail = block[:cut], block[cut:]
                bar.update(raw.tell() - bar.n)
                if block:
                    yield block, line
                    line += block.count("\n")
            if tail.strip():
                yield tail + "\n", line
    except (EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise _damaged(path, exc) from exc


def first_row_width(path: Path) -> int:
    """Number of comma-separated values on the first line of a gzipped CSV.

    Raises:
        DatasetFileError: the file is empty or its gzip data is damaged.
    """
    try:
        with gzip.open(path, "rt", encoding="ascii") as f:
            first = f.readline()
    except (EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise _damaged(Path(path), exc) from exc
    if not first:
        raise DatasetFileError(path, "is empty")
    if not first.strip():
        raise DatasetFileError(path, "starts with an empty line", line=1)
    return len(first.split(","))


def _is_integer(token: str) -> bool:
    try:
        int(token)
        return True
    except ValueError:
        pass
    try:
        value = float(token)
    except ValueError:
        return False
    return value.is_integer() and abs(value) < _EXACT_FLOAT_INT


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def _first_bad_line(text: str, first_line: int, width: int, integer: bool) -> tuple[int, str]:
    """Find the first line of ``text`` that is not ``width`` numbers (integers if ``integer``)."""
    valid = _is_integer if integer else _is_number
    kind = "an integer" if integer else "a number"
    for offset, row in enumerate(text.split("\n")[:-1]):
        fields = row.split(",")
        if len(fields) != width:
            shown = repr(row[:80] + ("..." if len(row) > 80 else ""))
            return first_line + offset, f"expected {width} comma-separated values, found {len(fields)}: {shown}"
        for column, token in enumerate(fields):
            if not valid(token):
                return first_line + offset, f"value {column + 1} ({token.strip()[:40]!r}) is not {kind}"
    return first_line, f"lines {first_line}-{first_line + text.count(chr(10)) - 1} cannot be parsed as {kind}s"


def _parse_block(text: str, first_line: int, width: int, dtype: np.dtype, path: Path) -> np.ndarray:
    """Parse a block of whole lines into ``[lines, width]`` values of ``dtype``; raise naming the bad line."""
    lines = text.count("\n")
    integer = np.issubdtype(dtype, np.integer)

    def bad() -> DatasetFileError:
        line, problem = _first_bad_line(text, first_line, width, integer)
        return DatasetFileError(path, problem, line=line)

    if text.count(",") != lines * (width - 1):
        raise bad()
    flat = text.replace("\n", ",")
    parse_as = np.dtype(np.int64) if integer else np.dtype(np.float64)
    try:
        with warnings.catch_warnings():  # older numpy warns (and returns a prefix) where newer raises
            warnings.simplefilter("error", DeprecationWarning)
            values = np.fromstring(flat, sep=",", dtype=parse_as)
    except (ValueError, DeprecationWarning):
        if not integer:
            raise bad() from None
        values = _integral_floats(flat)  # ids written as 3.0 or 1e3 are still ids
        if values is None:
            raise bad() from None
    if values.size != lines * width:
        raise bad()
    values = values.reshape(lines, width)
    return values if values.dtype == dtype else values.astype(dtype)


def _integral_floats(flat: str) -> Optional[np.ndarray]:
    """``flat`` parsed as float64 and converted to int64 if every value is an exact integer, else ``None``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            values = np.fromstring(flat, sep=",", dtype=np.float64)
    except (ValueError, DeprecationWarning):
        return None
    if not (np.all(np.isfinite(values)) and np.all(values == np.round(values)) and np.all(np.abs(values) < _EXACT_FLOAT_INT)):
        return None
    return values.astype(np.int64)


def read_csv_matrix(path: Path, dtype: Any, desc: str, width: Optional[int] = None) -> np.ndarray:
    """Read a gzipped numeric CSV into an in-memory ``[rows, width]`` array of ``dtype``.

    Args:
        path: the ``.csv.gz`` file.
        dtype: the result's dtype; an integer dtype accepts only integers (``3.7`` is an error).
        desc: label of the progress bar.
        width: values per line; default: as many as the first line has (then the file must not be empty).

    Raises:
        DatasetFileError: damaged gzip data, a line with another number of values, or a value that is not a
            number (an integer, for integer dtypes); the message names the file and the line.
    """
    path = Path(path)
    dtype = np.dtype(dtype)
    if width is None:
        width = first_row_width(path)
    parts = [_parse_block(text, line, width, dtype, path) for text, line in _blocks(path, desc)]
    return np.concatenate(parts) if parts else np.empty((0, width), dtype=dtype)


def convert_csv_to_npy(path: Path, out: Path, rows: int, dtype: Any, desc: str, what: str = "rows") -> None:
    """Stream a gzipped numeric CSV of ``rows`` rows into the memory-mapped ``.npy`` file ``out``.

    Args:
        what: what ``rows`` counts, for the error when the file has another number of rows (e.g.
            ``"nodes (one row per node)"``).

    Raises:
        DatasetFileError: as :func:`read_csv_matrix`, or the file has another number of rows than ``rows``.
    """
    path = Path(path)
    dtype = np.dtype(dtype)
    width = first_row_width(path)
    target = np.lib.format.open_memmap(out, mode="w+", dtype=dtype, shape=(rows, width))
    filled = 0
    for text, line in _blocks(path, desc):
        block = _parse_block(text, line, width, dtype, path)
        if filled + block.shape[0] > rows:
            raise DatasetFileError(path, f"has more than the expected {rows:,} {what}", line=rows + 1)
        target[filled : filled + block.shape[0]] = block
        filled += block.shape[0]
    if filled != rows:
        raise DatasetFileError(path, f"has {filled:,} rows, expected {rows:,} {what}")
    target.flush()
    del target
