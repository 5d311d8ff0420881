"""Picklable batch sources for the stage-split tests (a worker process unpickles them, so they live in a module)."""

from __future__ import annotations

import time

import torch
from helpers.pipeline_fakes import FakeSource, TwoStageSource

#: what :class:`MarkingSource` reports as its gather's bytes
MARKED_BYTES = 4096


class MarkingSource(TwoStageSource):
    """A two-stage source that sleeps in each stage and marks the end of its "feature gather" like a BatchBuilder
    does: ``sample_s`` sampling, ``gather_s`` gathering, then ``assemble_s`` more before ``gather_batch`` returns.
    Its batches are :class:`FakeSource`'s."""

    def __init__(self, *args, sample_s: float = 0.01, gather_s: float = 0.02, assemble_s: float = 0.01, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sample_s, self.gather_s, self.assemble_s = sample_s, gather_s, assemble_s

    def sample_batch(self, item):
        time.sleep(self.sample_s)
        return item

    def gather_batch(self, sampled, out=None, marks=None):
        time.sleep(self.gather_s)
        if marks is not None:
            marks.mark("gather", MARKED_BYTES)
        time.sleep(self.assemble_s)
        return FakeSource.build_batch(self, sampled, out)


#: elements of every sample: the same size each time, so the caching allocator hands a freed sample's block to the next
SAMPLE_NUMEL = 1 << 22


class SlowGatherSource(FakeSource):
    """A two-stage source whose sample is a CUDA tensor filled with its step (on the sampling stream) and whose gather
    first queues ~20 ms of GPU time, then copies the sample into ``x``. A sample let go once its gather is queued goes
    back to the sampling stream's pool, the next sample (allocated 10 ms later) takes the same block and fills it with
    its own step, and the first gather reads that: ``x`` then holds another step's value."""

    def sample_batch(self, item):
        time.sleep(0.01)  # the next sample allocates only after this batch's gather was queued
        return item, torch.full((SAMPLE_NUMEL,), float(item[1]), device="cuda")

    def gather_batch(self, sampled, out=None):
        item, values = sampled
        data = FakeSource.build_batch(self, item)
        torch.cuda._sleep(40_000_000)  # GPU cycles queued on the producer's stream before the read
        data.x = values[: data.x.numel()].view_as(data.x).clone()
        return data
