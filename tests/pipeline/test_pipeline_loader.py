"""PipelineLoader moving to another producer between two batches (worker_sm_percent="auto" switches workers): the
epoch goes on from the next step with the same batches, and the old producer's iteration is ended."""

from __future__ import annotations

import pytest
import torch
from helpers.pipeline_fakes import FakeSource

from lightning_zerocopy.pipeline import start_pipeline
from lightning_zerocopy.pipeline.loader import PipelineLoader


class _Inner:
    """The DataModule loader a PipelineLoader stands in for (only what it reads)."""

    def __init__(self, steps: int) -> None:
        self.steps, self.epoch, self.start_step = steps, 0, 0

    def __len__(self) -> int:
        return self.steps


@pytest.mark.parametrize("mode", ["in_process", "worker"])
def test_moving_to_another_producer_mid_epoch_keeps_the_batches(mode) -> None:
    src = FakeSource(steps=7, features=4, batch_size=8, seed=5)
    first, second = start_pipeline(mode, depth=2), start_pipeline("in_process", depth=3)
    try:
        for client in (first, second):
            client.register("train", src)
        current = [first]
        loader = PipelineLoader(first, "train", _Inner(src.steps), current=lambda: current[0])
        got = []
        for step, batch in enumerate(loader):
            got.append(batch.x.clone())
            if step == 2:
                current[0] = second  # from the next batch on
        assert len(got) == src.steps
        for step, x in enumerate(got):
            assert torch.equal(x, src.build_batch(src.plan(0, step)).x), step
        assert first.stats.batches == 3 and second.stats.batches == 4
        assert first._stages["train"].gen is None  # the first producer's iteration was ended
        # and it can serve again (a move back to it)
        assert [b.x.shape for b in first.iterate("train", 0, 0, 2)] == [got[0].shape, got[1].shape]
    finally:
        first.close()
        second.close()
