"""benchmarks.parts.contention: the heavy-shaped batch, the summary, the argument checks on the CPU; the loads beside a
trainer under MPS on a GPU (tests/benchmarks/parts/test_contention.py::test_loads_beside_the_trainer_under_mps)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks.parts.contention import FANOUTS, SEEDS, heavy_batch, main, summarize


def test_the_batch_has_the_heavy_shape_in_neighbor_loaders_layout() -> None:
    batch = heavy_batch("cpu")
    nodes, edges = batch["nodes"], batch["edges"]
    assert nodes[0] == SEEDS and len(nodes) == len(FANOUTS) + 1 and sum(nodes) == batch["x"].shape[0]
    assert edges == [n * f for n, f in zip(nodes, FANOUTS)]
    src, dst = batch["edge_index"]
    first = slice(0, edges[0])  # hop 1's edges go into the seeds, from nodes of hops <= 1
    assert int(dst[first].max()) < SEEDS and int(src[first].max()) < nodes[0] + nodes[1]
    assert torch.equal(heavy_batch("cpu")["x"], batch["x"])  # drawn from a fixed seed


def test_summary_is_the_median_against_the_step_alone() -> None:
    assert summarize([1.0, 2.0, 3.0, 10.0], None) == {"p50_ms": 2.5, "mean_ms": 4.0, "p90_ms": 3.0, "slowdown": None}
    assert summarize([3.0, 3.0, 3.0], alone_p50=2.0)["slowdown"] == 1.5


@pytest.mark.parametrize("argv, message", [(["--loads", "none,gpu"], "--loads: unknown gpu"),
                                           (["--worker-percent", "0"], "--worker-percent must be in [1, 99]")])  # fmt: skip
def test_bad_arguments_are_named(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available() or shutil.which("nvidia-cuda-mps-control") is None,
                    reason="needs a CUDA GPU and MPS")  # fmt: skip
def test_loads_beside_the_trainer_under_mps(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    assert main(["--loads", "none,hbm,dma", "--steps", "5", "--warmup", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["load"] for r in rows] == ["none", "hbm", "dma"]
    assert rows[0]["slowdown"] is None and all(r["slowdown"] > 0 and r["load_rate"] > 0 for r in rows[1:])
