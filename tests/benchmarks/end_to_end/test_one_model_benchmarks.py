"""What the one-model benchmarks share (``benchmarks/common/one_model_command.py``, ``common/cli.py``,
``end_to_end/one_model.py``, ``end_to_end/one_model_report.py``), each test run on both ``python -m benchmarks.end_to_end.link`` and
``python -m benchmarks.end_to_end.hetero``: presets and rows, the flags' checks, ``--list``, the report, the ``ci`` preset
end to end."""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest
import torch
from helpers.one_model_runs import ONE_MODEL, run_benchmark

BENCHMARKS = list(ONE_MODEL)
#: each benchmark's preset beside ``ci``
OTHER_PRESET = {"link": "gpu", "hetero": "mag"}
#: the validation metric each benchmark reports, as its results and its report name it
METRIC = {"link": ("best_val_auroc", "AUROC"), "hetero": ("best_val_acc", "acc")}


def _command(name: str) -> ModuleType:
    return importlib.import_module(f"{ONE_MODEL[name]}.__main__")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_presets_name_known_rows_and_fill_the_unset_flags(name: str) -> None:
    command = _command(name)
    rows, presets = command.ROWS, command.PRESETS
    assert {"pyg", "cpu", "zc_gpu", "zc_gpu_mps", "model_only", "model_only_mps"} <= set(rows)
    assert rows["model_only_mps"].mps and rows["model_only_mps"].kind == "model_only" and not rows["model_only"].mps
    assert all(set(p.configs.split(",")) <= set(rows) for p in presets.values())
    assert [r.name for r in command.select_rows("all")] == list(rows)
    assert [r.name for r in command.select_rows("model_only,cpu")] == ["model_only", "cpu"]
    with pytest.raises(ValueError, match="unknown row"):
        command.select_rows("cpu,nope")
    ci = command.parse_args(["--preset", "ci"])
    assert ci.fanouts == [5, 5] and ci.steps == presets["ci"].steps and ci.configs == presets["ci"].configs
    other = presets[OTHER_PRESET[name]]
    args = command.parse_args(["--preset", OTHER_PRESET[name], "--steps", "80"])
    assert args.steps == 80 and args.batch_size == other.batch_size and args.threads == other.threads
    assert args.fanouts == [int(f) for f in other.num_neighbors.split(",")]


@pytest.mark.parametrize("name", BENCHMARKS)
@pytest.mark.parametrize("flags,message", [
    (["--configs", "cpu,nope"], "unknown row"), (["--warmup", "20", "--steps", "10"], "--warmup must be in"),
    (["--num-neighbors", "5,x"], "invalid literal"), (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--preset", "nope"], "invalid choice"),
])  # fmt: skip
def test_bad_flags_exit_naming_the_flag(name: str, flags: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        _command(name).parse_args(flags)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", BENCHMARKS)
def test_list_shows_every_row_with_its_doc(name: str, capsys: pytest.CaptureFixture) -> None:
    command = _command(name)
    command.main(["--list"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(command.ROWS)
    assert all(line.endswith(row.doc) for line, row in zip(lines, command.ROWS.values()))


def _results(name: str) -> dict[str, Any]:
    best, _ = METRIC[name]
    run = {"row": "cpu", "kind": "ours", "status": "ok", "steps_per_s": 10.0, best: 0.8, "mag_epoch_s": 61.5,
           "val_curve": [[10, 1.0, 0.5], [20, 2.0, 0.8]], "step_ms": [100.0, 110.0], "stall_frac": 0.25,
           "batch_check": {"checked": 3, "ok": True}}  # fmt: skip
    skipped = {"row": "pyg", "kind": "pyg", "status": "skipped", "reason": "no pyg-lib"}
    graph = {"num_nodes": {"paper": 10}, "num_edges": {"a__b__c": 5}} if name == "hetero" else {"num_nodes": 10, "num_edges": 5}
    return {"args": {"preset": "ci", "fanouts": [5, 5]}, "graph": graph, "rows": {"cpu": "the cpu doc", "pyg": "doc"},
            "runs": [run, skipped]}  # fmt: skip


@pytest.mark.parametrize("name,cells,tail", [
    ("link", "| `cpu` | 10.0 | – | – | 25.0% |", "| 0.800 | 2.0 | – | 3 ok |"),
    ("hetero", "| `cpu` | 10.00 | – | – | 25.0% |", "| 0.800 | 2.0 | 61.5 | – | 3 ok |"),  # and the ogbn-mag epoch
])  # fmt: skip
def test_report_only_renders_the_results(name: str, cells: str, tail: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(_results(name)))
    _command(name).main(["--report-only", str(tmp_path)])
    assert f"{name}: wrote report.md" in capsys.readouterr().out
    text = (tmp_path / "report.md").read_text()
    metric = METRIC[name][1]
    assert f"| row | steps/s | × PyG | × model-only | stall | host wait ms | step p50 / p99 ms | best val {metric} |" in text
    assert cells in text and tail in text  # best metric, time to the target (95 % of 0.8: at the 2nd validation), ...
    assert "| `pyg` | skipped: no pyg-lib |" in text and "- `cpu`: the cpu doc" in text
    assert "Where a build's time goes" not in text  # no row with the producer's stage split


@pytest.mark.parametrize("name", BENCHMARKS)
def test_report_gives_a_pipeline_rows_build_stages(name: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results = _results(name)
    results["runs"][0].update(row="zc_gpu_mps", worker_sm_percent=10, build_ms=37.77, gather_build_GBps=41.93,
                              gather_bound_ms=9.24, build_stages_ms={"sample": 22.53, "gather": 12.17, "assemble": 3.03,
                                                                     "handover": 0.36})  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(results))
    _command(name).main(["--report-only", str(tmp_path)])
    capsys.readouterr()
    text = (tmp_path / "report.md").read_text()
    assert "## Where a build's time goes (the pipeline producer, beside training)" in text
    assert "| `zc_gpu_mps` (share 10 %) | 37.77 | 22.53 | – / – | 12.17 | 41.9 | 9.24 | 3.03 | 0.36 |" in text


@pytest.mark.parametrize("name", BENCHMARKS)
def test_ci_preset_end_to_end(name: str, one_model_ci_run: Callable[[str], Path], tmp_path: Path) -> None:
    out = one_model_ci_run(name)
    command = _command(name)
    preset = command.PRESETS["ci"]
    results = json.loads((out / "results.json").read_text())
    runs = {r["row"]: r for r in results["runs"]}
    assert list(runs) == preset.configs.split(",")
    best, metric = METRIC[name]
    for row in ("cpu", "model_only"):
        r = runs[row]
        assert r["status"] == "ok", r
        assert r["steps_per_s"] > 0 and r["steps"] == preset.steps and r[best] is not None
        assert len(r["val_curve"]) == preset.steps // preset.val_every
        assert r["batch_check"]["ok"] and r["batch_check"]["checked"] >= 1, r["batch_check"]
        assert 0.0 <= r["stall_frac"] <= 1.0 and r["wait_ms"] is not None
    # model-only trains on the plan's own batches, pre-staged: the same validation figure at every validation
    assert [v[2] for v in runs["cpu"]["val_curve"]] == pytest.approx([v[2] for v in runs["model_only"]["val_curve"]], abs=1e-6)
    if not torch.cuda.is_available():
        assert runs["zc_gpu"]["status"] == "skipped" and "CUDA" in runs["zc_gpu"]["reason"]
    pyg = runs["pyg"]
    if any(importlib.util.find_spec(m) for m in ("pyg_lib", "torch_sparse")):
        assert pyg["status"] == "ok" and pyg["batch_check"]["ok"], pyg
    else:  # PyG cannot sample without a backend: the row says so instead of failing
        assert pyg["status"] == "skipped" and "pyg-lib or torch-sparse" in pyg["reason"], pyg

    report = (out / "report.md").read_text()
    assert f"| row | steps/s | × PyG | × model-only | stall | host wait ms | step p50 / p99 ms | best val {metric} |" in report
    for row in runs:
        assert f"`{row}`" in report
    # --report-only re-renders the same report from the JSON alone
    (tmp_path / "results.json").write_text((out / "results.json").read_text())
    proc = run_benchmark(ONE_MODEL[name], "--report-only", str(tmp_path))
    assert "report.md" in proc.stdout
    assert (tmp_path / "report.md").read_text() == report


@pytest.mark.parametrize("name", BENCHMARKS)
def test_gemm_rows_flag_defaults_off(name: str) -> None:
    assert _command(name).parse_args(["--preset", "ci"]).gemm_rows == 0
    assert _command(name).parse_args(["--preset", "ci", "--gemm-rows", "64"]).gemm_rows == 64


def test_gemm_rows_flag_buckets_the_typed_models_linear_products(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--gemm-rows 64``: every linear product of the typed model (one per node type and layer, each on a row count
    of its own every batch) runs on a multiple of 64 rows, and the row records it."""
    from benchmarks.end_to_end.hetero.train import build_dataset, run_row

    command = _command("hetero")
    rows: list[int] = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda x, *a, **kw: rows.append(x.shape[0]) or linear(x, *a, **kw))  # fmt: skip
    args = command.parse_args(["--preset", "ci", "--steps", "4", "--warmup", "2", "--val-every", "2", "--stage-batches",
                               "2", "--cache-dir", str(tmp_path), "--gemm-rows", "64"])  # fmt: skip
    kwargs = command.dataset_kwargs(args)
    build_dataset(kwargs).prepare()
    result = run_row(command.select_rows("model_only")[0], args, kwargs)
    assert result["status"] == "ok" and result["gemm_rows"] == 64, result
    assert rows and all(r % 64 == 0 for r in rows), sorted(set(rows))[:10]
