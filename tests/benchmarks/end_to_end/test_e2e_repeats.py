"""``--repeats``: the rows in blocks of alternating order, each row against model-only inside its block."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.end_to_end.repeats import block_order, repeat_table
from tests.benchmarks.end_to_end.test_e2e_benchmark import _run_e2e


def _run(row: str, block: int, rate: float) -> dict:
    return {"row": row, "model": "heavy", "status": "ok", "steps_per_s": rate, "repeat": block}


def test_blocks_alternate_their_order():
    assert block_order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert block_order(["a", "b", "c"], 1) == ["c", "b", "a"]
    assert block_order(["a", "b", "c"], 2) == ["a", "b", "c"]


def test_the_ratio_is_taken_inside_each_block_then_the_median():
    # the machine is faster in block 1: 120 steps/s there is slower than model-only's 140 of the same block, though
    # faster than model-only's 100 of block 0
    results = {"args": {"repeats": 3}, "runs": [
        _run("model_only", 0, 100.0), _run("ours", 0, 90.0), _run("ours", 1, 120.0), _run("model_only", 1, 140.0),
        _run("model_only", 2, 100.0), {"row": "ours", "model": "heavy", "status": "error", "repeat": 2}]}  # fmt: skip
    table = "\n".join(repeat_table(results))
    assert "## Repeats: 3 blocks" in table
    assert "| `ours` | 90.0, 120.0, – | 105.0 | 0.900, 0.857, – | 0.879× |" in table
    assert "| `model_only` | 100.0, 140.0, 100.0 | 100.0 | 1.000, 1.000, 1.000 | 1.000× |" in table


def test_one_block_adds_no_section():
    assert repeat_table({"args": {"repeats": 1}, "runs": [_run("ours", 0, 90.0)]}) == []
    assert repeat_table({"args": {}, "runs": [_run("ours", 0, 90.0)]}) == []  # results written before --repeats


def test_a_cpu_run_in_two_blocks(tmp_path: Path):
    out = _run_e2e(tmp_path, "--configs", "cpu_inproc,model_only", "--models", "light", "--steps", "6", "--warmup",
                   "1", "--repeats", "2")  # fmt: skip
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [(r["row"], r["repeat"]) for r in runs] == [("cpu_inproc", 0), ("model_only", 0), ("model_only", 1),
                                                        ("cpu_inproc", 1)]  # fmt: skip
    assert all(r["status"] == "ok" for r in runs), [r.get("reason") for r in runs]
    report = (out / "report.md").read_text()
    assert "## Repeats: 2 blocks" in report and "| `cpu_inproc` |" in report.split("## Repeats")[1]
    for r in runs:  # each run's steady window: its wall-clock ends and the host's CPUs over it (no GPU here)
        start, end = r["steady_wall"]
        assert start < end and "gpu_clocks" not in r
        assert any(p["role"] == "trainer" for p in r["host_load"]["processes"]), r["host_load"]
        assert r["host_cpus"]["samples"] >= 1  # each CPU's speed, probed before the row
    assert "## Conditions over each run's steady window" in report and "- `cpu_inproc` (light, block 2," in report
    assert report.count("host CPUs: ") == len(runs)
