"""``benchmarks.scaling --repeats``: the plan, its block order, speed-ups inside each block and the medians."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.scaling.repeats import Planned, planned_runs, repeat_lines, repeat_summary, speedups_by_block, sweep_order
from tests.benchmarks.scaling.test_scaling_benchmark import _run_scaling


def _run(gpus: int, policy: str, seeds: float, block: int, loader: str = "ours", fast: float = 0.4) -> dict[str, Any]:
    return {"gpus": gpus, "policy": policy, "budget_fraction": 0.1 if loader == "ours" else 0.0, "loader": loader,
            "pipeline": "worker" if loader == "ours" else "off", "seeds_per_s": seeds, "repeat": block,
            "rank_steps_per_s": seeds / gpus / 1024, "host_cpus": {"fast_share": fast}}  # fmt: skip


def test_the_plan_runs_one_gpu_once_and_skips_what_the_machine_lacks():
    plan = planned_runs("1,2,4", "worker", "0.1", "replicate,clique", "2,4", available=2)
    assert plan == [Planned(1, "worker", 0.1, "replicate"), Planned(2, "worker", 0.1, "replicate"),
                    Planned(2, "worker", 0.1, "clique"), Planned(2, "off", 0.0, "-", "pyg")]  # fmt: skip


def test_blocks_alternate_their_order():
    plan = planned_runs("1,2", "worker", "0.1", "replicate", "", available=2)
    assert [(b, p.gpus) for b, p in sweep_order(plan, 3)] == [(0, 1), (0, 2), (1, 2), (1, 1), (2, 1), (2, 2)]
    assert [b for b, _ in sweep_order(plan, 0)] == [0, 0]  # at least one block


def test_each_speed_up_is_against_its_own_block():
    # the machine is slower in block 1: its 2-GPU run is slower than block 0's, yet scales the same against its 1 GPU
    runs = [_run(1, "replicate", 100_000, 0), _run(2, "replicate", 180_000, 0), _run(2, "-", 10_000, 0, "pyg"),
            _run(2, "-", 9_000, 1, "pyg"), _run(2, "replicate", 153_000, 1), _run(1, "replicate", 85_000, 1),
            {**_run(2, "clique", 0, 1), "error": "timed out"}]  # fmt: skip
    for r in runs[-1:]:
        del r["seeds_per_s"]
    speedups_by_block(runs)
    assert runs[1]["speedup_vs_1gpu"] == pytest.approx(1.8) and runs[4]["speedup_vs_1gpu"] == pytest.approx(1.8)
    assert runs[1]["vs_pyg_same_gpus"] == pytest.approx(18.0) and runs[4]["vs_pyg_same_gpus"] == pytest.approx(17.0)
    assert "speedup_vs_1gpu" not in runs[-1] and "vs_pyg_same_gpus" not in runs[2]
    summary = {(s["gpus"], s["policy"]): s for s in repeat_summary(runs)}
    two = summary[(2, "replicate")]
    assert two["blocks"] == 2 and two["median_seeds_per_s"] == 166_500 and two["median_speedup_vs_1gpu"] == pytest.approx(1.8)
    assert summary[(2, "clique")]["blocks"] == 0 and summary[(2, "clique")]["median_seeds_per_s"] is None
    assert two["median_fast_cpu_share"] == pytest.approx(0.4)
    text = "\n".join(repeat_lines(runs))
    assert "repeats: 2 blocks" in text and "180000, 153000" in text and "1.80, 1.80" in text
    assert "no finished run" in text


def test_one_block_adds_no_lines_and_takes_any_baseline():
    runs = [_run(1, "replicate", 100_000, 0), _run(2, "replicate", 150_000, 0)]
    speedups_by_block(runs)
    assert runs[1]["speedup_vs_1gpu"] == pytest.approx(1.5) and repeat_lines(runs) == []


def test_a_cpu_sweep_in_two_blocks(tmp_path):
    report = _run_scaling(tmp_path, "--gpus", "1", "--budgets", "0", "--epochs", "1", "--repeats", "2")
    assert [r["repeat"] for r in report["runs"]] == [0, 1] and all("error" not in r for r in report["runs"])
    assert all(r["host_cpus"]["samples"] >= 1 for r in report["runs"])  # each CPU's speed, probed before each run
    (row,) = report["repeats"]
    assert row["blocks"] == 2 and row["median_speedup_vs_1gpu"] == pytest.approx(1.0)
