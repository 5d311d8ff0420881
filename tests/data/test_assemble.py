"""``move_batch`` / ``batch_on_device``: a batch already on the device is handed over without walking it."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from lightning_zerocopy.data.assemble import batch_on_device, move_batch

CPU = torch.device("cpu")


def _batch(device: str = "cpu") -> Data:
    return Data(x=torch.randn(6, 3, device=device), edge_index=torch.tensor([[1, 2], [0, 0]], device=device),
                n_id=torch.arange(6, device=device), batch_size=2, num_sampled_nodes=[2, 4], num_sampled_edges=[2])  # fmt: skip


def test_batch_on_device_reads_every_tensor_and_nested_container() -> None:
    assert batch_on_device(_batch(), CPU)
    assert not batch_on_device(_batch("meta"), CPU)
    mixed = _batch()
    mixed.e_id = torch.empty(2, device="meta")  # one tensor elsewhere is enough
    assert not batch_on_device(mixed, CPU)
    nested = _batch()
    nested.extra = {"a": [torch.zeros(1), (torch.zeros(1, device="meta"),)]}
    assert not batch_on_device(nested, CPU)
    nested.extra = {"a": [torch.zeros(1), (torch.zeros(1), 3, "s", None)]}
    assert batch_on_device(nested, CPU)
    nested.extra = object()  # something it does not know: the caller moves the batch as usual
    assert not batch_on_device(nested, CPU)


def test_move_batch_hands_an_on_device_batch_over_without_walking_it(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _batch()
    x = batch.x
    monkeypatch.setattr(Data, "apply", lambda *a, **k: pytest.fail("walked a batch already on the device"))
    out = move_batch(batch, CPU)
    assert out is batch and out.x is x and out.num_sampled_nodes == [2, 4]


def test_move_batch_still_walks_a_batch_with_a_tensor_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    walked = []
    monkeypatch.setattr(Data, "apply", lambda self, func, *args: walked.append(self) or self)
    batch = _batch()
    batch.e_id = torch.empty(2, device="meta")
    assert move_batch(batch, CPU) is batch and walked == [batch]
