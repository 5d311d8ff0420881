"""The per-CPU speed probe that benchmarks record as a condition of each run."""

from __future__ import annotations

import json
import os

import pytest
import torch

from benchmarks.common import cpu_speed

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")


@needs_affinity
def test_the_probe_visits_every_allowed_cpu_and_restores_the_thread():
    allowed = os.sched_getaffinity(0)
    seen: list[set[int]] = []
    result = cpu_speed.probe(passes=2, iters=10, timer=lambda n: (seen.append(os.sched_getaffinity(0)), 1.0)[1])
    assert os.sched_getaffinity(0) == allowed
    assert set(result["cpus"]) == allowed and all(len(ms) == 2 for ms in result["cpus"].values())
    assert {cpu for s in seen for cpu in s} == allowed and all(len(s) == 1 for s in seen)  # pinned to one at a time


@needs_affinity
def test_a_timer_that_fails_still_restores_the_thread():
    allowed = os.sched_getaffinity(0)

    def broken(_: int) -> float:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        cpu_speed.probe(timer=broken)
    assert os.sched_getaffinity(0) == allowed


def test_fast_and_slow_samples_are_told_apart():
    result = {"cpus": {0: [8.0, 15.0], 1: [8.4, 14.8], 2: [15.2, 15.0], 3: [9.0, 9.9]}}
    summary = cpu_speed.summarise(result)
    assert summary["cpus"] == 4 and summary["samples"] == 8
    assert summary["fast_share"] == 0.5  # 8.0, 8.4, 9.0, 9.9 are within 1.25x of 8.0
    assert summary["fast_ms"] == pytest.approx(8.7)
    assert summary["slow_over_fast"] == pytest.approx(15.0 / 8.7, abs=1e-3)
    line = cpu_speed.describe(summary)
    assert "50% of 8 samples over 4 CPUs" in line and "(8.7 ms)" in line and "1.72x slower" in line
    assert "(8.7 us)" in cpu_speed.describe(summary, unit="us")


def test_a_machine_all_at_one_speed_and_one_not_probed():
    even = cpu_speed.summarise({"cpus": {0: [8.0], 1: [8.2]}})
    assert even["fast_share"] == 1.0 and even["slow_over_fast"] is None
    assert cpu_speed.describe(even).endswith("none slower")
    nothing = cpu_speed.summarise({"cpus": {}, "unavailable": "no affinity"})
    assert nothing["samples"] == 0 and cpu_speed.describe(nothing) == "host CPUs: not probed"


@needs_affinity
def test_the_command_writes_its_json(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    cpu_speed.main(["--passes", "1", "--out", str(out), "--cuda"])
    written = json.loads(out.read_text())
    assert written["summary"]["samples"] >= 1 and "host CPUs:" in capsys.readouterr().out
    assert written["launch_us"]["summary" if torch.cuda.is_available() else "unavailable"]
    assert (cpu_speed.cuda_launch_timer() is None) == (not torch.cuda.is_available())
