"""The worker's sampling-stream priority and gather grid bound: read from the environment, checked in the trainer
before a worker starts, applied in the worker."""

from __future__ import annotations

import pytest
import torch

from lightning_zerocopy import ops
from lightning_zerocopy.pipeline.kernel_scheduling import (
    GATHER_BLOCKS_ENV,
    SAMPLE_PRIORITY_ENV,
    apply_gather_blocks,
    gather_blocks_per_sm,
    high_priority_sampling,
    sampling_stream_factory,
)


def _set(monkeypatch: pytest.MonkeyPatch, name: str, value):
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(("value", "high"), [(None, False), ("", False), ("normal", False), (" High ", True)])
def test_the_sampling_priority_is_high_only_when_asked(value, high, monkeypatch: pytest.MonkeyPatch):
    _set(monkeypatch, SAMPLE_PRIORITY_ENV, value)
    assert high_priority_sampling() is high


@pytest.mark.parametrize(("value", "blocks"), [(None, None), ("", None), ("1", 1), (" 512 ", 512), ("65536", 65536)])
def test_the_gather_grid_bound_is_read_in_blocks_per_multiprocessor(value, blocks, monkeypatch: pytest.MonkeyPatch):
    _set(monkeypatch, GATHER_BLOCKS_ENV, value)
    assert gather_blocks_per_sm() == blocks


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        (SAMPLE_PRIORITY_ENV, "urgent", "'high'"),
        (SAMPLE_PRIORITY_ENV, "1", "'high'"),
        (GATHER_BLOCKS_ENV, "0", r"\[1, 65536\]"),
        (GATHER_BLOCKS_ENV, "65537", r"\[1, 65536\]"),
        (GATHER_BLOCKS_ENV, "2.5", r"\[1, 65536\]"),
        (GATHER_BLOCKS_ENV, "many", r"\[1, 65536\]"),
    ],
)
def test_a_bad_value_is_named_in_the_trainer_before_a_worker_starts(name, value, match, monkeypatch):
    from lightning_zerocopy.pipeline import worker

    monkeypatch.setenv(name, value)
    started = []
    monkeypatch.setattr(worker.mp, "get_context", lambda *a: started.append(a))
    with pytest.raises(ValueError, match=f"{name}=.*{match}"):
        worker.WorkerTransport()
    assert started == []  # no process, no pipe


def test_the_sampling_stream_is_the_pipelines_unless_high_priority_is_asked(monkeypatch: pytest.MonkeyPatch):
    made = object()
    make = lambda: made  # noqa: E731
    monkeypatch.delenv(SAMPLE_PRIORITY_ENV, raising=False)
    assert sampling_stream_factory(torch.device("cuda", 0), make, shared=False) is make
    monkeypatch.setenv(SAMPLE_PRIORITY_ENV, "high")
    assert sampling_stream_factory(torch.device("cuda", 0), make, shared=True) is make  # an SM share's stream stays
    assert sampling_stream_factory(torch.device("cuda", 0), make, shared=False) is not make


def test_unset_the_gather_grid_bound_is_left_alone(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(GATHER_BLOCKS_ENV, raising=False)
    assert apply_gather_blocks() is None


@pytest.mark.skipif(ops.WITH_CUDA, reason="a CPU build's refusal")
def test_a_cpu_build_leaves_the_gather_grid_bound_alone(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(GATHER_BLOCKS_ENV, "512")
    assert apply_gather_blocks() is None
    with pytest.raises(RuntimeError, match="without its CUDA kernels"):
        ops.set_gather_blocks_per_sm(512)


@pytest.mark.cuda
def test_the_worker_sets_the_gather_grid_bound_and_gathers_the_same_rows(monkeypatch: pytest.MonkeyPatch):
    if not (torch.cuda.is_available() and ops.WITH_CUDA):
        pytest.skip("needs a GPU and a CUDA build")
    table = torch.randn(10_000, 64).pin_memory()
    ids = torch.randint(0, table.shape[0], (50_000,), device="cuda")
    expected = table[ids.cpu()]
    monkeypatch.setenv(GATHER_BLOCKS_ENV, "1")
    before = ops.set_gather_blocks_per_sm(32)
    try:
        for blocks in (1, 512):
            monkeypatch.setenv(GATHER_BLOCKS_ENV, str(blocks))
            assert apply_gather_blocks() == blocks
            assert ops.set_gather_blocks_per_sm(blocks) == blocks  # what the worker set
            out = torch.empty(ids.shape[0], table.shape[1], device="cuda")
            ops.gather_rows(table, ids, out)
            assert torch.equal(out.cpu(), expected)
        with pytest.raises(ValueError, match=r"\[1, 65536\]"):
            ops.set_gather_blocks_per_sm(0)
    finally:
        ops.set_gather_blocks_per_sm(before)
