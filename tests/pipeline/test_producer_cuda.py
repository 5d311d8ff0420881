"""The producer on a GPU (``@pytest.mark.cuda``): a batch's sample, allocated on the lookahead thread's stream, must
outlive the gather that reads it on the producer's stream (tests/pipeline/test_producer.py checks the order on the
CPU; this one checks the batches the GPU delivers)."""

from __future__ import annotations

import pytest
import torch
from stage_fakes import SlowGatherSource

from lightning_zerocopy.pipeline import start_pipeline

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("mode", ["in_process", "worker"])
def test_every_batch_holds_its_own_sample_when_the_gather_is_slower_than_the_next_sample(mode):
    src = SlowGatherSource(steps=10, seed=1, features=4)
    client = start_pipeline(mode, depth=2, device="cuda:0", timeout=120, lookahead=True)
    try:
        client.register("t", src)
        seen = [torch.unique(batch.x).tolist() for batch in client.iterate("t", 0)]
    finally:
        client.close()
    assert seen == [[float(step)] for step in range(10)]
