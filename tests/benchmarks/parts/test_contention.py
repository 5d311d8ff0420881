"""benchmarks.parts.contention: the summary, the argument checks on the CPU; the loads beside a
trainer under MPS on a GPU (tests/benchmarks/parts/test_contention.py::test_loads_beside_the_trainer_under_mps)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch

from benchmarks.parts.contention import main, parse_load, rate_text, summarize


def on_a_gpu_with_mps(test: Callable) -> Callable:
    """A CUDA test (slow) that needs MPS: skipped without a GPU or ``nvidia-cuda-mps-control``."""
    no_mps = not torch.cuda.is_available() or shutil.which("nvidia-cuda-mps-control") is None
    skip = pytest.mark.skipif(no_mps, reason="needs a CUDA GPU and MPS")
    return pytest.mark.cuda(pytest.mark.slow(skip(test)))


def test_summary_is_the_median_against_the_step_alone() -> None:
    assert summarize([1.0, 2.0, 3.0, 10.0], None) == {"p50_ms": 2.5, "mean_ms": 4.0, "p90_ms": 3.0, "slowdown": None}
    assert summarize([3.0, 3.0, 3.0], alone_p50=2.0)["slowdown"] == 1.5


def test_a_load_may_be_held_to_a_rate() -> None:
    assert parse_load("pcie") == ("pcie", None)
    assert parse_load("staged@12.5") == ("staged", 12.5)
    assert parse_load("sample_gather") == ("sample_gather", None)


def test_a_samplers_rate_is_also_given_as_ms_a_batch() -> None:
    assert rate_text(250.0, "batches/s") == "250.0 batches/s (4.00 ms a batch)"
    assert rate_text(40.1, "GB/s") == "40.1 GB/s"
    assert rate_text(None, "GB/s") == "–"


@pytest.mark.parametrize("argv, message", [(["--loads", "none,gpu"], "--loads: unknown load 'gpu'"),
                                           (["--loads", "sm@10"], "only hbm, pcie, dma, pcie_seq, staged take a rate"),
                                           (["--loads", "sample@10"], "only hbm, pcie, dma, pcie_seq, staged take a rate"),
                                           (["--alone-s", "-1"], "--alone-s must be >= 0"),
                                           (["--loads", "pcie@fast"], "the rate after '@' must be a positive number"),
                                           (["--loads", "dma@0"], "the rate after '@' must be a positive number"),
                                           (["--staged-threads", "0"], "--staged-threads must be >= 1"),
                                           (["--worker-percent", "0"], "--worker-percent must be in [1, 99]")])  # fmt: skip
def test_bad_arguments_are_named(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


@on_a_gpu_with_mps
def test_loads_beside_the_trainer_under_mps(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    assert main(["--loads", "none,hbm,dma@5,staged,pcie_seq", "--steps", "5", "--warmup", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["load"] for r in rows] == ["none", "hbm", "dma@5", "staged", "pcie_seq"]
    assert rows[0]["slowdown"] is None and all(r["slowdown"] > 0 and r["load_rate"] > 0 for r in rows[1:])
    assert rows[2]["load_rate"] < 5 * 1.2  # held to its rate (one unit, 1 GB, may end the last pause early)


@on_a_gpu_with_mps
def test_the_sampler_loads_are_timed_alone_at_their_share_and_on_the_whole_gpu(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    assert main(["--loads", "sample,sample_gather", "--steps", "5", "--warmup", "2", "--alone-s", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["load"] for r in rows] == ["none", "sample", "sample_gather"]
    for load in rows[1:]:
        assert load["load_unit"] == "batches/s", load
        assert load["load_rate"] > 0 and load["alone_rate"] > 0 and load["whole_gpu_rate"] > 0, load
