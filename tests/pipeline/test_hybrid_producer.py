"""The producer's hybrid sampling: batches sampled ahead on two devices come back in order and unchanged, the
placement reaches the trainer's stats, a sampling thread's error is raised in the trainer."""

from __future__ import annotations

import pytest
from helpers.pipeline_fakes import HybridSource
from test_worker import _assert_same

from lightning_zerocopy.pipeline import PipelineError, start_pipeline


@pytest.mark.parametrize("mode", ["in_process", "worker"])
def test_hybrid_batches_are_build_batchs_in_order_and_the_faster_lane_takes_most(mode):
    src = HybridSource(steps=24, seed=21, huge_at=5, lane_delay={"cpu": 0.03, "gpu": 0.003})
    client = start_pipeline(mode, depth=2, timeout=30)
    client.register("t", src)
    try:
        for epoch, start in ((0, 0), (1, 7)):
            steps = []
            for step, batch in enumerate(client.iterate("t", epoch, start=start), start=start):
                _assert_same(batch, src.reference(epoch, step))
                steps.append(step)
            assert steps == list(range(start, 24))
        sampling = client.stats.sampling
        assert sum(lane.batches for lane in sampling.lanes.values()) == 24 + 17
        assert sampling.lanes["cpu"].batches >= 1 and sampling.lanes["gpu"].batches >= 1
        assert sampling.share("gpu") > sampling.share("cpu")
        assert sampling.last is not None and sampling.last.measured_s > 0
    finally:
        client.close()


def test_interleaved_hybrid_stages_and_an_abandoned_iteration():
    train, val = HybridSource(steps=9, seed=22), HybridSource(steps=4, seed=23, batch_size=8)
    client = start_pipeline("in_process", depth=2, timeout=30)
    client.register("t", train)
    client.register("v", val)
    try:
        it = client.iterate("t", 0)
        for step in range(3):
            _assert_same(next(it), train.reference(0, step))
        for step, batch in enumerate(client.iterate("v", 0)):
            _assert_same(batch, val.reference(0, step))
        for step in range(3, 5):
            _assert_same(next(it), train.reference(0, step))
        it.close()  # abandoned with batches sampled ahead
        for step, batch in enumerate(client.iterate("t", 1)):
            _assert_same(batch, train.reference(1, step))
    finally:
        client.close()


def test_a_failing_sampling_thread_surfaces_in_the_trainer():
    client = start_pipeline("in_process", depth=2, timeout=30)
    client.register("bad", HybridSource(steps=6, sample_fail_at=3))
    try:
        it = client.iterate("bad", 0)
        for _ in range(3):
            next(it)
        with pytest.raises(PipelineError, match=r"(?s)bad batch 3 of epoch 0.*fake sampler failure at step 3"):
            next(it)
        client.register("good", HybridSource(steps=3, seed=4))
        assert len(list(client.iterate("good", 0))) == 3  # the producer and its lanes survive
    finally:
        client.close()
