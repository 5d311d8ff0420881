"""Fixtures of the strategy tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist


@pytest.fixture
def one_rank_group(tmp_path: Path):
    """A gloo process group of this process alone (rank 0 of 1, a ``FileStore`` in ``tmp_path``), destroyed after
    the test."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
