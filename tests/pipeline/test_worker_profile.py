"""LIGHTNING_ZEROCOPY_WORKER_PROFILE: parsed and checked in the trainer, a window of batches profiled in the producer."""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import load_diagnostic

from lightning_zerocopy.pipeline.worker_profile import PROFILE_ENV, ProfileSpec, WorkerProfile, profile_spec


@pytest.mark.parametrize(("suffix", "skip", "batches"), [("", 200, 40), (":5", 5, 40), (":0:3", 0, 3)])
def test_the_profile_window_is_read_from_the_environment(suffix, skip, batches, tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILE_ENV, f"{tmp_path / 'prof'}{suffix}")
    assert profile_spec() == ProfileSpec(str(tmp_path / "prof"), skip, batches)
    assert (tmp_path / "prof").is_dir()


def test_unset_nothing_is_profiled(monkeypatch):
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    assert profile_spec() is None
    WorkerProfile(None).before_batch()  # a no-op


@pytest.mark.parametrize("suffix", [":x", ":-1", ":1:0", ":1:2:3"])
def test_a_bad_profile_value_is_named_in_the_trainer_before_a_worker_starts(suffix, tmp_path, monkeypatch):
    from lightning_zerocopy.pipeline import worker

    monkeypatch.setenv(PROFILE_ENV, f"{tmp_path}{suffix}")
    started = []
    monkeypatch.setattr(worker.mp, "get_context", lambda *a: started.append(a))
    with pytest.raises(ValueError, match=f"{PROFILE_ENV}=.*<dir>"):
        worker.WorkerTransport()
    assert started == []


def test_only_the_window_is_profiled_and_written_once(tmp_path):
    profile = WorkerProfile(ProfileSpec(str(tmp_path), skip=2, batches=3))
    for i in range(10):
        profile.before_batch()
        with torch.profiler.record_function(f"batch_{i}"):
            torch.ones(64, 64).sum()
    names = {e.get("name") for e in json.load(open(next(tmp_path.glob("worker_trace_*.json"))))["traceEvents"]}
    assert {"batch_2", "batch_3", "batch_4"} <= names and not names & {"batch_0", "batch_1", "batch_5", "batch_9"}
    assert sorted(os.listdir(tmp_path)) == sorted([f"worker_trace_{os.getpid()}.json", f"worker_ops_{os.getpid()}.txt"])



def test_with_write_at_close_the_window_is_written_only_when_closed(tmp_path):
    profile = WorkerProfile(ProfileSpec(str(tmp_path), skip=1, batches=2), write_at_close=True)
    for i in range(6):
        profile.before_batch()
        with torch.profiler.record_function(f"batch_{i}"):
            torch.ones(64, 64).sum()
    assert os.listdir(tmp_path) == []  # a trainer's timed steps would count the seconds writing takes
    profile.close()
    profile.close()
    names = {e.get("name") for e in json.load(open(next(tmp_path.glob("worker_trace_*.json"))))["traceEvents"]}
    assert {"batch_1", "batch_2"} <= names and not names & {"batch_0", "batch_3", "batch_5"}


def test_the_trace_summary_gives_each_streams_kernels_their_waits_and_each_threads_calls():
    summary = load_diagnostic("worker_trace_summary")
    events = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "sampler"}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 7, "ts": 0, "dur": 5,
         "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "pick", "pid": 0, "tid": 21, "ts": 3000, "dur": 100,
         "args": {"correlation": 1, "stream": 21}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 7, "ts": 10, "dur": 3200,
         "args": {"correlation": 2}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "pid": 0, "tid": 21, "ts": 3150, "dur": 2,
         "args": {"correlation": 2, "stream": 21}},
        {"ph": "X", "cat": "kernel", "name": "gather", "pid": 0, "tid": 13, "ts": 100, "dur": 2900,
         "args": {"stream": 13}},
    ]  # fmt: skip
    text = summary.summarize(events, top=5)
    assert "stream 13: 1 events, busy 2.9 ms" in text and "stream 21: 2 events" in text
    assert "launch call -> start on the GPU: p50 3.140 ms" in text  # the kernel waited 3 ms, the copy 3.14 ms
    assert "thread 7 (sampler)" in text and "cudaMemcpyAsync" in text
    assert summary.summarize([], top=5).startswith("no GPU activity")


def test_the_comparison_lists_the_kernels_that_grew_most_first_and_those_only_one_trace_has():
    def kernels(*spans):
        return [{"ph": "X", "cat": "kernel", "name": n, "ts": 0, "dur": d, "args": {"stream": 7}} for n, d in spans]

    here = kernels(("gemm", 300), ("gemm", 300), ("relu", 10), ("cast", 50))
    base = kernels(("gemm", 100), ("gemm", 100), ("relu", 10), ("sort", 20))
    text = load_diagnostic("worker_trace_summary").compare(here, base, top=5)
    assert "2 names in both, their added time 0.40 ms" in text  # gemm: (300 - 100) us x 2
    rows = text.splitlines()
    assert rows[2].split() == ["0.40", "300.0", "100.0", "2", "2", "gemm"] and rows[3].split()[0] == "0.00"
    assert rows[rows.index("only here: ") + 1].endswith("cast") and rows[-1].endswith("sort")
