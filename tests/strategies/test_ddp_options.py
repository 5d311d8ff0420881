"""ZeroCopyDDPStrategy hands DistributedDataParallel's own options to the wrapper it builds (its ``_setup_model``
overrides Lightning's): the DDP knobs ``benchmarks.scaling.diag`` measures for issue 39."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lightning_zerocopy.strategies import ZeroCopyDDPStrategy


@pytest.fixture
def one_rank_group(tmp_path: Path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _wrap(strategy: ZeroCopyDDPStrategy) -> DistributedDataParallel:
    strategy.parallel_devices = [torch.device("cpu")]
    return strategy._setup_model(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))


def test_ddp_options_reach_the_wrapper(one_rank_group: None) -> None:
    ddp = _wrap(ZeroCopyDDPStrategy(static_graph=True, gradient_as_bucket_view=True, bucket_cap_mb=5))
    assert ddp.static_graph and ddp.gradient_as_bucket_view
    assert ddp.bucket_bytes_cap == 5 * 2**20


def test_ddp_defaults_are_torchs(one_rank_group: None) -> None:
    ddp = _wrap(ZeroCopyDDPStrategy())
    assert not ddp.static_graph and not ddp.gradient_as_bucket_view
    assert ddp.bucket_bytes_cap == 25 * 2**20
