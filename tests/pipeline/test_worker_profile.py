"""LIGHTNING_ZEROCOPY_WORKER_PROFILE: parsed and checked in the trainer, a window of batches profiled in the producer."""

from __future__ import annotations

import json
import os

import pytest
import torch

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
