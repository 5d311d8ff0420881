"""The producer's stage split (sample, gather, assemble, hand-over) on the CPU: the clock, the protocol, the sums.

On the CPU every stage is a host time, so the fakes' sleeps give lower bounds the split must respect. The GPU
side (CUDA events, the PCIe bound) is in ``test_stage_times_cuda.py``.
"""

from __future__ import annotations

import time

import pytest
import torch
from helpers.pipeline_fakes import FakeSource, TwoStageSource
from stage_fakes import MARKED_BYTES, MarkingSource

from lightning_zerocopy.pipeline import start_pipeline
from lightning_zerocopy.pipeline.stage_times import (
    STAGES,
    BuildStages,
    EventPairs,
    SampleTime,
    StageClock,
    StageTotals,
    elapsed_s,
)

SLACK = 0.9  # sleeps never end early, but perf_counter and sleep may disagree by a hair


def _clocked_build(clock: StageClock, marked: bool = True) -> None:
    clock.begin()
    clock.record("sample_start")
    time.sleep(0.01)
    clock.record("start")
    time.sleep(0.02)
    if marked:
        clock.mark("gather", 1000)
    time.sleep(0.01)
    clock.record("built")
    clock.record("write_start")
    time.sleep(0.005)
    clock.record("written")


def test_a_host_clock_splits_a_build_into_its_stages():
    clock = StageClock()
    _clocked_build(clock)
    assert clock.split and clock.marked and not clock.gpu_times
    stages = clock.stages(handover_s=0.003, h2d_GBps=50.0)
    assert stages.sample_s >= 0.01 * SLACK
    assert stages.gather_s >= 0.02 * SLACK
    assert stages.assemble_s >= 0.015 * SLACK  # after the gather's mark, and the slot write
    assert stages.handover_s == 0.003
    assert stages.gather_bytes == 1000
    assert stages.gather_bound_s == pytest.approx(1000 / 50e9)
    assert stages.gather_GBps == pytest.approx(1000 / stages.gather_s * 1e-9)
    assert list(stages.seconds()) == list(STAGES) and not stages.gpu_times


def test_without_a_mark_the_gather_is_the_whole_gather_batch_with_the_bytes_of_x():
    clock = StageClock()
    _clocked_build(clock, marked=False)
    stages = clock.stages(handover_s=0.0, h2d_GBps=None, x_bytes=640)
    assert stages.gather_s >= 0.03 * SLACK  # start -> built
    assert 0.005 * SLACK <= stages.assemble_s < 0.03  # the slot write only
    assert stages.gather_bytes == 640 and stages.gather_bound_s is None


def test_a_sample_timed_elsewhere_counts_and_begin_forgets_the_previous_batch():
    clock = StageClock()
    clock.begin()
    clock.sample = SampleTime(0.5, cpu_s=0.125)
    clock.record("start")
    clock.record("built")
    stages = clock.stages(0.0, None)
    assert stages.sample_s == 0.5 and (stages.sample_host_s, stages.sample_cpu_s) == (0.5, 0.125)
    assert clock.sample is None  # read once
    clock.begin()
    assert not clock.split and clock.span("start", "built") is None and clock.gather_bytes == 0
    clock.sample = SampleTime(0.25)  # a hybrid dispatcher's: its host time only
    clock.record("start")
    stages = clock.stages(0.0, None)
    assert stages.sample_s == 0.25 and stages.sample_host_s is None and stages.sample_cpu_s is None


class _Event:
    """A stand-in for a CUDA timing event."""

    def __init__(self, done: bool = True, at_ms: float = 0.0, fail: bool = False) -> None:
        self.done, self.at_ms, self.fail = done, at_ms, fail

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: "_Event") -> float:
        if self.fail or end.fail:
            raise RuntimeError("event not recorded")
        return end.at_ms - self.at_ms


def test_elapsed_s_reads_only_completed_events_and_never_raises():
    assert elapsed_s(_Event(at_ms=1.0), _Event(at_ms=3.5)) == pytest.approx(2.5e-3)
    assert elapsed_s(_Event(), _Event(done=False)) is None
    assert elapsed_s(_Event(done=False), _Event()) is None
    assert elapsed_s(_Event(fail=True), _Event()) is None


def test_a_sample_time_reads_its_events_once_and_gives_them_back():
    pool = EventPairs()
    timing = SampleTime(0.25, (_Event(at_ms=0.0), _Event(at_ms=4.0)), pool)
    assert timing.seconds() == pytest.approx(4e-3) and len(pool) == 1
    assert timing.seconds() == 0.25  # the events are gone: the host time
    pending = SampleTime(0.125, (_Event(), _Event(done=False)), pool)
    assert pending.seconds() == 0.125 and len(pool) == 2  # not complete: never waited for, still given back
    unread = SampleTime(0.1, pool.take(), pool)
    unread.release()
    assert len(pool) == 2 and unread.events is None


def test_stage_totals_sum_the_stages_and_the_gathers_rate():
    totals = StageTotals()
    assert totals.mean_ms() == {} and totals.gather_GBps is None and totals.h2d_GBps is None
    totals.add(BuildStages(0.001, 0.002, 0.003, 0.0005, gather_bytes=2_000_000, gather_bound_s=0.0001))
    totals.add(BuildStages(0.003, 0.004, 0.001, 0.0015, gather_bytes=4_000_000))  # no bound for this one
    means = totals.mean_ms()
    assert means["sample"] == pytest.approx(2.0) and means["gather"] == pytest.approx(3.0)
    assert means["assemble"] == pytest.approx(2.0) and means["handover"] == pytest.approx(1.0)
    assert means["gather_bound"] == pytest.approx(0.1)  # over the batches that had one
    assert totals.gather_GBps == pytest.approx(6e6 / 0.006 * 1e-9)
    assert totals.h2d_GBps == pytest.approx(2e6 / 1e-4 * 1e-9)


def _same(a, b) -> None:
    assert sorted(a.keys()) == sorted(b.keys())
    for key in b.keys():
        if isinstance(b[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("mode, lookahead", [("in_process", True), ("in_process", False), ("worker", True)])
def test_the_producer_sends_each_batchs_stages_with_it(mode, lookahead):
    """Every ready batch carries its split (the source's sleeps bound each stage from below), the client keeps the
    latest and the sums, and the batches themselves are unchanged."""
    src = MarkingSource(steps=5, seed=2, sample_s=0.01, gather_s=0.02, assemble_s=0.01)
    client = start_pipeline(mode, depth=2, timeout=60, lookahead=lookahead)
    try:
        client.register("t", src)
        seen = []
        for step, batch in enumerate(client.iterate("t", 0)):
            _same(batch, FakeSource.build_batch(src, src.plan(0, step)))
            seen.append(client.stats.last_stages)
        assert len(seen) == 5 and all(isinstance(s, BuildStages) for s in seen)
        for stages in seen:
            assert not stages.gpu_times and stages.gather_bound_s is None  # CPU slots: host times, no PCIe
            assert stages.sample_s >= 0.01 * SLACK
            assert stages.gather_s >= 0.02 * SLACK
            assert stages.assemble_s >= 0.01 * SLACK
            assert stages.handover_s >= 0.0
            assert stages.gather_bytes == MARKED_BYTES
        totals = client.stats.stages
        assert totals.batches == 5 and totals.gather_bytes == 5 * MARKED_BYTES
        assert set(totals.mean_ms()) == set(STAGES)
    finally:
        client.close()


def test_a_source_that_does_not_mark_counts_its_whole_gather_with_the_bytes_of_x():
    src = TwoStageSource(steps=3, seed=4)
    client = start_pipeline("in_process", depth=2, timeout=60)
    try:
        client.register("t", src)
        for batch in client.iterate("t", 0):
            stages = client.stats.last_stages
            assert stages is not None and stages.gather_bytes == batch.x.numel() * batch.x.element_size()
    finally:
        client.close()


def test_a_source_with_build_batch_only_reports_no_split():
    client = start_pipeline("in_process", depth=2, timeout=60)
    try:
        client.register("t", FakeSource(steps=3, seed=1))
        for _ in client.iterate("t", 0):
            assert client.stats.last_stages is None
        assert client.stats.stages.batches == 0 and client.stats.batches == 3
    finally:
        client.close()


def test_a_sample_timed_by_the_clocks_boundaries_has_no_host_or_cpu_split():
    clock = StageClock()
    clock.begin()
    clock.record("sample_start")
    clock.record("start")
    clock.record("built")
    stages = clock.stages(0.0, None)
    assert stages.sample_s >= 0 and stages.sample_host_s is None and stages.sample_cpu_s is None
