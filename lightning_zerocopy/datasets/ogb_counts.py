"""OGB's own count files (``raw/num-node-list.csv.gz``, ``raw/num-edge-list.csv.gz``), read and checked.

OGB writes how many nodes and edges each graph has next to the data. A data file that was emptied or cut short at
a line boundary still parses; only these counts reveal it. :func:`check_count` compares what a data file held with
its count file and names the file that disagrees. Any reader of an OGB folder (node or link property prediction)
can call it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from lightning_zerocopy.datasets.base import DatasetFileError
from lightning_zerocopy.datasets.csv_gz import read_csv_matrix

__all__ = ["EDGE_COUNT_FILE", "NODE_COUNT_FILE", "check_count", "read_count"]

NODE_COUNT_FILE = "num-node-list.csv.gz"
EDGE_COUNT_FILE = "num-edge-list.csv.gz"


def read_count(path: Path) -> Optional[int]:
    """The count in OGB's count file ``path`` (one graph: one integer on one line), or ``None`` when it is absent.

    Raises:
        DatasetFileError: the file holds no count, a negative one, or counts of several graphs.
    """
    path = Path(path)
    if not path.is_file():
        return None
    values = read_csv_matrix(path, np.int64, f"ogb: {path.name}", width=1)
    if values.shape[0] != 1 or int(values[0, 0]) < 0:
        problem = "is empty" if values.shape[0] == 0 else (
            f"holds {values.shape[0]:,} counts (one per graph), but this dataset is one graph"
            if values.shape[0] > 1 else f"holds {int(values[0, 0])}"
        )
        raise DatasetFileError(path, f"{problem}: it must hold the count (an integer >= 0) on one line")
    return int(values[0, 0])


def check_count(data_file: Path, found: int, count_file: Path, what: str) -> None:
    """Raise if ``data_file`` held ``found`` ``what`` (e.g. ``"edges"``) but ``count_file`` says otherwise; nothing
    to check when ``count_file`` is absent.

    Raises:
        DatasetFileError: naming ``data_file`` (the one that usually is cut short) and what ``count_file`` says.
    """
    expected = read_count(count_file)
    if expected is None or expected == found:
        return
    short = "short" if found < expected else "long"
    raise DatasetFileError(
        data_file,
        f"has {found:,} {what}, but {Path(count_file).name} says {expected:,}: {Path(data_file).name} is too {short} "
        f"(truncated or replaced?) or {Path(count_file).name} is wrong; copy or download the dataset again",
    )
