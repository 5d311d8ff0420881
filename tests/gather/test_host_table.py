"""HostFeatureTable: shared/npy storage, picklable handles, CPU gather into (pinned) buffers."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from lightning_zerocopy.gather import FeatureTableHandle, HostFeatureTable
from lightning_zerocopy.graph import save_npy


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_shared_table_gather_and_handle(dtype):
    x = torch.randn(500, 13).to(dtype)
    table = HostFeatureTable.share(x)
    try:
        assert (table.num_rows, table.dim, table.dtype, table.row_bytes) == (500, 13, dtype, 13 * x.element_size())
        ids = torch.randint(0, 500, (321,))
        assert torch.equal(table.gather(ids), x[ids])
        buffer = table.pinned_buffer(400)
        assert buffer.shape == (400, 13) and buffer.dtype == dtype
        out = table.gather(ids.int(), out=buffer[: ids.numel()])
        assert out.data_ptr() == buffer.data_ptr() and torch.equal(out, x[ids])
        handle = pickle.loads(pickle.dumps(table.handle()))
        assert isinstance(handle, FeatureTableHandle)
        other = handle.open()
        assert torch.equal(other.data, x)
        other.data[7].fill_(1.5)  # same memory
        assert bool((table.data[7] == 1.5).all())
    finally:
        table.unlink()
    assert not os.path.exists(table.handle().data.path)


def test_from_npy_bf16(tmp_path):
    x = torch.randn(60, 4).to(torch.bfloat16)
    save_npy(x, tmp_path / "x.npy")
    table = HostFeatureTable.from_npy(tmp_path / "x.npy", dtype=torch.bfloat16)
    assert torch.equal(table.data, x)
    ids = torch.tensor([59, 0, 0, 31])
    assert torch.equal(table.gather(ids), x[ids])
    reopened = pickle.loads(pickle.dumps(table.handle())).open()
    assert torch.equal(reopened.data, x)
    table.unlink()  # an on-disk file is kept
    assert (tmp_path / "x.npy").exists()


def test_bad_input():
    with pytest.raises(TypeError, match="`x`.*float32"):
        HostFeatureTable.share(torch.randint(0, 5, (4, 3)))
    with pytest.raises(ValueError, match="`x`.*2-D"):
        HostFeatureTable.share(torch.randn(4))
    with pytest.raises(ValueError, match="`data`.*contiguous"):
        HostFeatureTable(torch.randn(3, 4).t())
    private = HostFeatureTable(torch.randn(10, 2))
    with pytest.raises(ValueError, match="share"):
        private.handle()
    with pytest.raises(IndexError, match="`ids`.*10"):
        private.gather(torch.tensor([10]))
    with pytest.raises(ValueError, match="`max_rows`"):
        private.pinned_buffer(-1)
