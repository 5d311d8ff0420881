"""benchmarks/scaling/host_profile.py: a few steps of each phase profiled, summed by operator per step."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from benchmarks.scaling.host_profile import HostProfile, summarize
from benchmarks.scaling.knobs import parse_knobs


def _entry(key: str, total: float, own: float, count: int) -> SimpleNamespace:
    return SimpleNamespace(key=key, cpu_time_total=total, self_cpu_time_total=own, count=count)


def test_entries_are_per_step_and_largest_host_time_first():
    rows = summarize([_entry("aten::mm", 400.0, 100.0, 8), _entry("cudaMalloc", 1000.0, 1000.0, 2)], steps=4, top=5)
    assert rows == [
        {"name": "cudaMalloc", "host_us": 250.0, "self_us": 250.0, "calls": 0.5},
        {"name": "aten::mm", "host_us": 100.0, "self_us": 25.0, "calls": 2.0},
    ]
    assert summarize([_entry("x", 1.0, 1.0, 1)], steps=0) == []


class _FakeProfiler:
    made: list["_FakeProfiler"] = []

    def __init__(self) -> None:
        self.entered = self.exited = False
        _FakeProfiler.made.append(self)

    def __enter__(self) -> "_FakeProfiler":
        self.entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.exited = True

    def key_averages(self) -> list[SimpleNamespace]:
        return [_entry("aten::add", 30.0, 30.0, 3)]


def _epoch(callback: HostProfile, epoch: int, steps: int) -> None:
    trainer = SimpleNamespace(current_epoch=epoch)
    for i in range(steps):
        callback.on_train_batch_start(trainer, None, None, i)
        callback.on_train_batch_end(trainer, None, None, None, i)
    callback.on_train_epoch_end(trainer, None)


def test_each_phase_is_profiled_once_after_its_skipped_steps():
    _FakeProfiler.made.clear()
    phases = ["warmup", "data", "model", "data"]
    callback = HostProfile(lambda e: phases[e], steps=3, skip=2, make_profiler=_FakeProfiler)
    for epoch in range(4):
        _epoch(callback, epoch, steps=10)
    assert len(_FakeProfiler.made) == 2 and all(p.entered and p.exited for p in _FakeProfiler.made)
    summary = callback.summary()
    assert sorted(summary) == ["data", "model"] and summary["data"]["steps"] == 3
    assert summary["data"]["top"] == [{"name": "aten::add", "host_us": 10.0, "self_us": 10.0, "calls": 1.0}]


def test_a_phase_shorter_than_the_steps_keeps_what_it_profiled():
    callback = HostProfile(lambda e: "data", steps=50, skip=1, make_profiler=_FakeProfiler)
    _epoch(callback, 0, steps=4)
    assert callback.summary()["data"]["steps"] == 3


def test_the_real_profiler_names_the_steps_operators():
    callback = HostProfile(lambda e: "data", steps=2, skip=0)
    trainer = SimpleNamespace(current_epoch=0)
    a = torch.randn(64, 64)
    for i in range(2):
        callback.on_train_batch_start(trainer, None, None, i)
        (a @ a).sum()
        callback.on_train_batch_end(trainer, None, None, None, i)
    names = [row["name"] for row in callback.summary()["data"]["top"]]
    assert "aten::mm" in names or "aten::matmul" in names, names


def test_the_knob_reaches_the_run():
    assert parse_knobs("profile_steps=20") == {"run": {"profile_steps": 20}}


def test_the_log_lines_name_run_rank_and_phase():
    from benchmarks.scaling.host_profile import profile_lines

    top = [{"name": "cudaEventSynchronize", "host_us": 1800.0, "self_us": 1800.0, "calls": 1.0}]
    runs = [{"name": "heavy-worker-2gpu-profile_steps=20", "per_rank_diag": [{"host_profile": {"data": {
        "steps": 20, "top": top}}}, {"host_profile": None}]}, {"name": "skipped", "status": "skipped"}]
    assert profile_lines(runs) == ["heavy-worker-2gpu-profile_steps=20 r0 data (20 steps): "
                                   "cudaEventSynchronize 1800/1800 us x1"]
