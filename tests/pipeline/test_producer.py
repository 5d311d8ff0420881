"""The producer's ordering guarantees that only a GPU would otherwise show: a batch's sample outlives its slot write."""

from __future__ import annotations

import pytest
from helpers.pipeline_fakes import FakeSource, TwoStageSource

from lightning_zerocopy.pipeline import producer as producer_module
from lightning_zerocopy.pipeline import start_pipeline

EVENTS: list[tuple[str, int]] = []


class _Sample:
    """A sample that records when it is freed (CPython frees it when its last reference goes)."""

    def __init__(self, item) -> None:
        self.item = item

    def __del__(self) -> None:
        EVENTS.append(("freed", self.item[1]))


class _LifetimeSource(TwoStageSource):
    def sample_batch(self, item):
        return _Sample(item)

    def gather_batch(self, sampled, out=None):
        return FakeSource.build_batch(self, sampled.item, out)


@pytest.mark.parametrize("lookahead", [True, False])
def test_a_sample_is_freed_only_after_its_batch_is_written(monkeypatch, lookahead):
    """On a GPU the sample is allocated on the sampling thread's stream and read by the producer's stream until that
    stream synchronizes after the slot write; freed earlier, its memory goes back to the caching allocator for the
    next sample to overwrite while the gather still reads it (batches silently wrong). So every batch's sample must
    be freed after the batch was written into its slot, in both the three-stage and the two-stage pipeline."""
    EVENTS.clear()
    written = producer_module.write_batch

    def write(layout, buffers, data, sizes):
        written(layout, buffers, data, sizes)
        EVENTS.append(("written", sum(kind == "written" for kind, _ in EVENTS)))

    monkeypatch.setattr(producer_module, "write_batch", write)
    src = _LifetimeSource(steps=6, seed=3)
    client = start_pipeline("in_process", depth=2, timeout=60, lookahead=lookahead)
    try:
        client.register("t", src)
        assert sum(1 for _ in client.iterate("t", 0)) == 6
    finally:
        client.close()
    position = {event: i for i, event in enumerate(EVENTS)}
    for step in range(6):
        assert position[("written", step)] < position[("freed", step)], EVENTS
