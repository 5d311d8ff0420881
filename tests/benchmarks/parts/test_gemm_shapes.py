"""benchmarks.parts.gemm_shapes: the argument check on the CPU; on a GPU, every variant's figures from its own process
and the fresh-shape batches' row counts varying while the repeated ones stay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.parts.gemm_shapes import _jittered_batch, main


def test_an_unknown_cache_variant_is_refused_with_the_choices(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--caches", "default,huge"])
    assert "unknown --caches huge: choose from default, none, large" in capsys.readouterr().err


def test_fresh_batches_vary_their_row_counts_and_fixed_ones_do_not() -> None:
    fixed = [_jittered_batch(s, "cpu", jitter=False)["nodes"] for s in range(4)]
    fresh = [_jittered_batch(s, "cpu", jitter=True)["nodes"] for s in range(4)]
    assert all(n == fixed[0] for n in fixed) and len({tuple(n) for n in fresh}) == 4
    batch = _jittered_batch(7, "cpu", jitter=True)
    assert batch["x"].shape[0] == sum(batch["nodes"]) and int(batch["edge_index"].max()) < batch["x"].shape[0]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_every_variant_reports_host_times_from_its_own_process(tmp_path: Path) -> None:
    out = tmp_path / "gemm.json"
    main(["--caches", "default,none", "--calls", "20", "--steps", "4", "--warmup", "2", "--out", str(out)])
    results = json.loads(out.read_text())["results"]
    for name in ("default", "none"):
        gemm, step = results[name]["gemm_host_us"], results[name]["step"]
        assert set(gemm) == {"mm", "addmm"} and all(set(v) == {"repeat", "fresh", "pool"} for v in gemm.values())
        assert all(v > 0 for times in gemm.values() for v in times.values())
        assert set(step) == {"repeat", "fresh", "fresh_rows64"} and all(s["host_ms"] > 0 and s["gpu_ms"] > 0 for s in step.values())
