"""check_finite_features names the first NaN/inf feature's node and column, chunk by chunk, memory-mapped too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_zerocopy.datasets import features
from lightning_zerocopy.datasets.features import NonFiniteFeatureError, check_finite_features
from lightning_zerocopy.graph.shared_memory import open_npy_memmap


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_first_bad_value_is_named_by_node_and_column(value: float, dtype: torch.dtype, monkeypatch) -> None:
    monkeypatch.setattr(features, "_CHUNK_BYTES", 64)  # several chunks: the node id counts the chunks before
    x = torch.randn(50, 6, generator=torch.Generator().manual_seed(1)).to(dtype)
    x[37, 4] = value
    x[41, 0] = value  # a later one is not the one named
    with pytest.raises(NonFiniteFeatureError, match=rf"^T features: {value} at node 37, "
                                                    r"column 4 .* set K: false") as info:
        check_finite_features(x, "T features", "K: false")
    assert (info.value.node, info.value.column) == (37, 4)


def test_finite_and_integer_tables_pass() -> None:
    check_finite_features(torch.randn(100, 3), "x", "k")
    check_finite_features(torch.randint(0, 9, (10, 2)), "x", "k")
    check_finite_features(torch.empty(0, 4), "x", "k")


def test_a_memory_mapped_table_is_checked(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(features, "_CHUNK_BYTES", 4096)
    array = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=(2000, 8))
    array[:] = 1.0
    array[1999, 7] = np.nan  # in the last chunk
    array.flush()
    del array
    with pytest.raises(NonFiniteFeatureError, match=r"nan at node 1999, column 7"):
        check_finite_features(open_npy_memmap(tmp_path / "x.npy"), "the features", "k")
