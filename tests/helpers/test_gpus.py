"""How many GPUs the multi-GPU tests (``two_gpus``) run on: ``LZC_TEST_GPUS`` (default 2), e.g. 4 or 8 on a machine
with that many (issue 42: the clique over 4 or 8 shards, the fault cases on as many ranks)."""

from __future__ import annotations

import os

import pytest

__all__ = ["TEST_GPUS", "skip_unless_enough_gpus"]

TEST_GPUS = int(os.environ.get("LZC_TEST_GPUS", "2"))


def skip_unless_enough_gpus() -> None:
    """Skip the calling test where this machine has fewer than :data:`TEST_GPUS` GPUs (``two_gpus`` already skips
    below 2; ``REQUIRE_TWO_GPUS=1`` turns the skip into a failure)."""
    if TEST_GPUS > 2:
        import torch

        if torch.cuda.device_count() < TEST_GPUS:
            pytest.skip(f"LZC_TEST_GPUS={TEST_GPUS} but this machine has {torch.cuda.device_count()} GPUs")
