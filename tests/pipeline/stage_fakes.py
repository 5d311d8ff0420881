"""Picklable batch sources for the stage-split tests (a worker process unpickles them, so they live in a module)."""

from __future__ import annotations

import time

from pipeline_fakes import FakeSource, TwoStageSource

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
