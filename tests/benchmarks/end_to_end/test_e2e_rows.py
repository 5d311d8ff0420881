"""The end-to-end benchmark's MPS share rows (``zc_gpu_mps_20``, ``_30``, ``_auto``): listed, the row's share reaching
the MPS launcher and the callback, skipped with the reason on the CPU, and the share in the report."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks.end_to_end import report as e2e_report
from benchmarks.end_to_end.aims import aims_table, end_to_end_row
from benchmarks.end_to_end.rows import ROWS, launcher_share, worker_share
from benchmarks.end_to_end.train import pipeline_options, share_figures
from lightning_zerocopy.callbacks import PipelineCallback
from lightning_zerocopy.pipeline.share_choice import ShareChoice

SHARE_ROWS = ("zc_gpu_mps_20", "zc_gpu_mps_30", "zc_gpu_mps_auto")


def test_share_rows_are_zc_gpu_mps_with_their_own_share(capsys: pytest.CaptureFixture) -> None:
    from benchmarks.end_to_end.__main__ import main

    base = ROWS["zc_gpu_mps"]
    for name, share in zip(SHARE_ROWS, (20, 30, "auto")):
        row = ROWS[name]
        assert row.kind == "ours" and row.mps and row.needs_cuda and row.features_in_host_memory
        assert row.data == base.data and row.pipeline == {**base.pipeline, "worker_sm_percent": share}
        assert worker_share(row, 10) == share and worker_share(row, "auto") == share  # the row's share wins
    assert worker_share(base, 10) == 10 and worker_share(base, "auto") == "auto"  # zc_gpu_mps: the flag's
    assert worker_share(ROWS["zc_gpu"], 30) is None  # no MPS, no share
    main(["--list"])
    listed = capsys.readouterr().out
    assert "zc_gpu_mps_20     as zc_gpu_mps, the worker's MPS share 20 % (the trainer 80 %)" in listed
    assert "zc_gpu_mps_auto   as zc_gpu_mps, worker_sm_percent='auto'" in listed


@pytest.mark.parametrize("value, parsed", [("auto", "auto"), ("AUTO", "auto"), ("20", 20), ("99", 99)])
def test_worker_sm_percent_takes_a_share_or_auto(value: str, parsed: object) -> None:
    from benchmarks.end_to_end.__main__ import parse_args

    assert parse_args(["--worker-sm-percent", value]).worker_sm_percent == parsed
    assert parse_args([]).worker_sm_percent == 10


@pytest.mark.parametrize("value", ["0", "100", "half", ""])
def test_bad_worker_sm_percent_names_the_flag(value: str, capsys: pytest.CaptureFixture) -> None:
    from benchmarks.end_to_end.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--worker-sm-percent", value])
    err = capsys.readouterr().err
    assert "--worker-sm-percent" in err and "in [1, 99] or 'auto'" in err


@pytest.mark.parametrize("row, flag, launched", [("zc_gpu_mps", 10, 10), ("zc_gpu_mps", 30, 30), ("zc_gpu_mps", "auto", 10),
                                                 ("zc_gpu_mps_20", 10, 20), ("zc_gpu_mps_30", "auto", 30),
                                                 ("zc_gpu_mps_auto", 30, 10), ("cpu_mps", 20, 20)])  # fmt: skip
def test_the_launcher_gets_the_rows_share(row: str, flag: object, launched: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The MPS launcher's ``--worker-sm-percent`` (the trainer gets the rest): the row's share, else the flag's; auto
    starts the ladder's first, 10 %, so the trainer has the 90 % the callback expects."""
    from benchmarks.end_to_end.rows import mps_prefix
    from lightning_zerocopy.pipeline import mps

    monkeypatch.setattr(mps, "mps_processes", lambda: [])  # no previous row's daemon to wait for
    prefix = mps_prefix(SimpleNamespace(worker_sm_percent=flag), ROWS[row])
    assert prefix[1:] == ["-m", "lightning_zerocopy.pipeline.mps_launcher", "--worker-sm-percent", str(launched), "--"]
    assert launcher_share(worker_share(ROWS[row], flag)) == launched


@pytest.mark.parametrize("row, worker", [("zc_gpu_mps_full", 10), ("zc_gpu_mps_20_full", 20)])
def test_full_rows_leave_the_trainer_unlimited(row: str, worker: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_full`` rows: the worker's share as named, the trainer's own share 100 % (launcher and callback alike)."""
    from benchmarks.end_to_end.rows import mps_prefix
    from lightning_zerocopy.pipeline import mps

    monkeypatch.setattr(mps, "mps_processes", lambda: [])
    prefix = mps_prefix(SimpleNamespace(worker_sm_percent=30), ROWS[row])
    assert prefix[3:] == ["--worker-sm-percent", str(worker), "--trainer-sm-percent", "100", "--"]
    callback = PipelineCallback(**pipeline_options(ROWS[row], SimpleNamespace(worker_sm_percent=30)))
    assert (callback.worker_sm_percent, callback.trainer_sm_percent) == (worker, 100)


def test_the_callback_gets_the_rows_share() -> None:
    args = SimpleNamespace(worker_sm_percent=30)
    assert pipeline_options(ROWS["zc_gpu_mps_20"], args) == {"mode": "worker", "mps": True, "worker_sm_percent": 20}
    assert pipeline_options(ROWS["zc_gpu_mps"], args)["worker_sm_percent"] == 30
    assert pipeline_options(ROWS["zc_gpu_inproc"], args) == {"mode": "in_process"}  # no MPS: no share
    auto = PipelineCallback(**pipeline_options(ROWS["zc_gpu_mps_auto"], args))
    assert auto.worker_sm_percent == "auto" and auto._first_share == 10
    # what a row records: the share as configured and as run (auto: None until the calibration decides)
    assert share_figures(auto) == {"worker_sm_percent": "auto", "chosen_worker_sm_percent": None, "share_choice": None}
    fixed = PipelineCallback(**pipeline_options(ROWS["zc_gpu_mps_20"], args))
    assert share_figures(fixed) == {"worker_sm_percent": 20, "chosen_worker_sm_percent": 20, "share_choice": None}
    auto._last_choice = ShareChoice(20, 3.5, 5.25, keeps_pace=True)  # a fit's calibration decided (then tore down)
    assert share_figures(auto) == {"worker_sm_percent": "auto", "chosen_worker_sm_percent": 20,
                                   "share_choice": {"percent": 20, "build_ms": 3.5, "step_ms": 5.25, "keeps_pace": True}}


def test_share_rows_are_skipped_on_the_cpu_and_append_keeps_them(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("on a GPU these rows train (test_share_rows_train_under_mps)")
    from benchmarks.end_to_end.__main__ import parse_args, run

    def e2e(configs: str, *flags: str) -> dict:
        run(parse_args(["--preset", "ci", "--configs", configs, "--out", str(tmp_path / "out"),
                        "--cache-dir", str(tmp_path / "cache"), "--gen-device", "cpu", *flags]))  # fmt: skip
        return json.loads((tmp_path / "out" / "results.json").read_text())

    e2e("zc_gpu_mps,zc_gpu_mps_auto", "--worker-sm-percent", "auto")
    results = e2e("zc_gpu_mps_20,zc_gpu_mps_30", "--append")
    runs = {r["row"]: r for r in results["runs"]}
    assert set(runs) == {"zc_gpu_mps", *SHARE_ROWS}
    for r in runs.values():
        assert r["status"] == "skipped" and r["reason"] == "needs a CUDA GPU (none here)", r
    report = (tmp_path / "out" / "report.md").read_text()
    for name in SHARE_ROWS:
        assert f"| `{name}` | skipped: needs a CUDA GPU (none here) |" in report and f"- `{name}`: as zc_gpu_mps" in report


def _results() -> dict:
    """Heavy runs of the MPS rows (the auto row chose 20 % and is the fastest) and a light auto run that did not decide."""

    def run(row: str, rate: float, model: str = "heavy", **extra: object) -> dict:
        return {"row": row, "model": model, "kind": ROWS[row].kind, "status": "ok", "steps_per_s": rate,
                "features_in_host_memory": ROWS[row].features_in_host_memory, "precision": "bf16-mixed", "trim": True,
                "val_curve": [[100, 100 / rate, 0.9]], "best_val_acc": 0.9, "step_ms": [1e3 / rate] * 5,
                "batch_check": {"checked": 3, "ok": True, "problems": [], "trimmed": True}, **extra}  # fmt: skip

    choice = {"percent": 20, "build_ms": 3.5, "step_ms": 5.25, "keeps_pace": True}
    return {"args": {"target_acc": None}, "rows": {r: ROWS[r].doc for r in ("model_only", "zc_gpu_mps", *SHARE_ROWS)},
            "runs": [run("model_only", 200.0),
                     run("zc_gpu_mps", 150.0, worker_sm_percent=10, chosen_worker_sm_percent=10, share_choice=None),
                     run("zc_gpu_mps_30", 170.0, worker_sm_percent=30, chosen_worker_sm_percent=30, share_choice=None),
                     run("zc_gpu_mps_auto", 185.0, worker_sm_percent="auto", chosen_worker_sm_percent=20, share_choice=choice),
                     run("all_in_gpu", 199.0),
                     run("zc_gpu_mps_auto", 120.0, "light", worker_sm_percent="auto", chosen_worker_sm_percent=None,
                         share_choice=None)]}  # fmt: skip


def test_report_says_every_mps_rows_share_and_the_auto_choice(tmp_path: Path) -> None:
    results = _results()
    report = Path(e2e_report.write_report(results, str(tmp_path), [], "")).read_text()
    assert "| `zc_gpu_mps` (share 10 %) | 150.0 | 0.75× |" in report
    assert "| `zc_gpu_mps_30` (share 30 %) | 170.0 |" in report
    assert "| `zc_gpu_mps_auto` (share 20 %, auto) | 185.0 | 0.93× |" in report
    assert "| `zc_gpu_mps_auto` (share auto, undecided) | 120.0 |" in report
    assert "| `model_only` | 200.0 |" in report and "| `all_in_gpu` | 199.0 |" in report  # no MPS: no share
    assert ("- `zc_gpu_mps_auto` (heavy): worker share 20 %: a batch built in 3.50 ms keeps pace with a 5.25 ms step"
            in report)  # fmt: skip
    assert "- `zc_gpu_mps_auto` (light): the calibration did not decide within the run" in report
    assert "- light: best row `zc_gpu_mps_auto` (share auto, undecided) at 120.0 steps/s" in report
    # issue 20's "best row of ours": the auto row counts (features in host memory), all_in_gpu does not
    assert end_to_end_row(results, "heavy")["row"] == "zc_gpu_mps_auto"
    cells = next(line for line in aims_table(results, e2e_report.target_acc) if line.startswith("| end to end, features"))
    assert "185.0 steps/s (`zc_gpu_mps_auto`, share 20 %, auto): met" in cells
    assert "120.0 steps/s (`zc_gpu_mps_auto`, share auto, undecided): **missed**" in cells
    assert "share 20 %, auto" in e2e_report.one_line(results["runs"][3])
    assert "share" not in e2e_report.one_line(results["runs"][0])


@pytest.mark.cuda
def test_share_rows_train_under_mps(tmp_path: Path) -> None:
    """Every share row trains under MPS on the ci graph and records its share (and ``model_only_mps``, the trainer a
    client with no worker, trains); the auto row's calibration decides
    within 300 steps (three shares x 50 steps at most) and says which share it chose. In fp32: the trainer at 80 or
    70 % got wrong bf16 GEMMs on an H200 (share_numerics), which stops those rows, a check tested on its own."""
    from test_e2e_benchmark import TRIM_FLAGS, _run_e2e

    configs = "zc_gpu_mps,zc_gpu_mps_20,zc_gpu_mps_30,zc_gpu_mps_auto,model_only_mps"
    out = _run_e2e(tmp_path, "--configs", configs, "--models", "light",
                   "--steps", "300", "--warmup", "10", "--val-every", "100", "--row-budget-s", "0", "--threads", "0",
                   "--precision", "32-true", *TRIM_FLAGS)  # fmt: skip
    runs = {r["row"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert runs["model_only_mps"]["status"] == "ok", runs["model_only_mps"]  # the trainer alone as a client
    for name, share in zip(("zc_gpu_mps", *SHARE_ROWS), (10, 20, 30, "auto")):
        r = runs[name]
        assert r["status"] == "ok" and r["batch_check"]["ok"], r
        assert r["worker_sm_percent"] == share, r
    assert [runs[n]["chosen_worker_sm_percent"] for n in ("zc_gpu_mps", "zc_gpu_mps_20", "zc_gpu_mps_30")] == [10, 20, 30]
    auto = runs["zc_gpu_mps_auto"]
    assert auto["chosen_worker_sm_percent"] in (10, 20, 30) and auto["share_choice"]["percent"] == auto["chosen_worker_sm_percent"]
    print(auto["share_choice"])
    report = (out / "report.md").read_text()
    assert f"`zc_gpu_mps_auto` (share {auto['chosen_worker_sm_percent']} %, auto)" in report


def test_model_only_mps_is_the_bound_with_the_trainer_an_mps_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """``model_only_mps``: model-only's batches, no worker, the trainer launched as an MPS client at 90 %."""
    from benchmarks.end_to_end.rows import mps_prefix
    from lightning_zerocopy.pipeline import mps

    row = ROWS["model_only_mps"]
    assert row.kind == "model_only" and row.pipeline is None and row.mps and not row.features_in_host_memory
    assert not ROWS["model_only"].mps
    monkeypatch.setattr(mps, "mps_processes", lambda: [])
    prefix = mps_prefix(SimpleNamespace(worker_sm_percent=10), row)
    assert prefix[1:] == ["-m", "lightning_zerocopy.pipeline.mps_launcher", "--worker-sm-percent", "10", "--"]


def test_model_only_mps_without_a_daemon_is_skipped_not_run_outside_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without MPS the launcher warns and runs the row anyway; the row then says so instead of timing a non-client
    (the homogeneous benchmark's rows and the one-model benchmarks' alike)."""
    import dataclasses

    from benchmarks.common.rows import RowUnavailable
    from benchmarks.end_to_end.one_model import fit_one_model
    from benchmarks.end_to_end.rows import MODELS
    from benchmarks.end_to_end.train import run_row

    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    row = dataclasses.replace(ROWS["model_only_mps"], needs_cuda=False)  # past the GPU check, on the CPU too
    (result,) = run_row(row, [MODELS["light"]], SimpleNamespace(threads=0), {})
    assert result["status"] == "skipped" and "the launcher started no daemon" in result["reason"], result
    never = lambda *_: pytest.fail("the dataset was built")  # noqa: E731
    with pytest.raises(RowUnavailable, match="the launcher started no daemon"):
        fit_one_model(row, SimpleNamespace(), {}, build_dataset=never, model=never, datamodule=never, batch_check=never,
                      fit_pyg=never, metric="val_acc")


def test_the_staged_row_asks_for_the_copy_engines_gather() -> None:
    """``zc_gpu_mps_staged`` is ``zc_gpu_mps`` but for ``gather_mode``, which the DataModule takes as it is."""
    from lightning_zerocopy import ZeroCopyDataModule
    from lightning_zerocopy.options import GatherMode, choices

    staged, plain = ROWS["zc_gpu_mps_staged"], ROWS["zc_gpu_mps"]
    assert staged.data == {**plain.data, "gather_mode": "staged"} and staged.pipeline == plain.pipeline
    assert "staged" in choices(GatherMode)
    assert "gather_mode" in ZeroCopyDataModule.__init__.__code__.co_varnames
