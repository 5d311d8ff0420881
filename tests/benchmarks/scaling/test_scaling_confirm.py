"""The drift-robust comparison (``benchmarks/scaling/confirm.py`` and ``confirm_report.py``): configurations, the
interleaved block order, ratios taken inside each block and their medians, the aims, and the whole comparison on gloo
ranks (a discarded warm-up run first, a JSON written after every run; CPU figures are host times and not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_configurations_and_the_interleaved_block_order() -> None:
    from benchmarks.scaling.confirm import block_order, build_plan, parse_config

    one, torch_ddp, ours, pair = (parse_config(t) for t in ("1gpu", "2gpu-torch", "2gpu", "2x1"))
    assert (one.gpus, one.independent, one.torch_ddp, one.policy) == (1, False, False, None)
    assert (torch_ddp.gpus, torch_ddp.torch_ddp, ours.torch_ddp, pair.independent) == (2, True, False, True)
    assert parse_config("4gpu-clique").policy == "clique" and parse_config("4gpu-clique").gpus == 4
    assert parse_config("4gpu-auto").policy == "auto" and parse_config("4gpu-auto").gpus == 4
    for bad in ("2gpus", "1x1", "1gpu-torch", "1gpu-clique", "1gpu-auto", "gpu"):
        with pytest.raises(ValueError, match="--configs"):
            parse_config(bad)
    configs = [one, torch_ddp, ours]
    orders = [[c.label for c in block_order(configs, b)] for b in range(4)]
    assert orders == [["1gpu", "2gpu-torch", "2gpu"], ["2gpu", "2gpu-torch", "1gpu"], ["2gpu-torch", "2gpu", "1gpu"],
                      ["2gpu-torch", "1gpu", "2gpu"]]  # fmt: skip
    plan = build_plan(configs, ["heavy", "light"], "worker", 2, pair)
    assert [(p.config, p.block, p.spec.model) for p in plan][:4] == [("2x1", -1, "heavy"), ("1gpu", 0, "heavy"),
                                                                     ("2gpu-torch", 0, "heavy"), ("2gpu", 0, "heavy")]  # fmt: skip
    assert len(plan) == 1 + 2 * 2 * 3 and plan[0].warmup and plan[0].spec.independent
    assert plan[-1].spec.model == "light" and plan[-1].spec.name == "light-worker-1gpu-b1"
    from benchmarks.scaling.confirm import _pairs, parse_confirm_args, run_args

    args = parse_confirm_args(["--configs", "1gpu,2gpu,2gpu-clique", "--models", "heavy", "--repeats", "1"])
    assert [run_args(args, p).policy for p in args.plan] == ["replicate", "replicate", "replicate", "clique"]

    assert _pairs([one, torch_ddp, ours, parse_config("2gpu-clique")]) == {"2gpu": "2gpu-torch", "2gpu-clique": "2gpu"}
    four = [parse_config(t) for t in ("1gpu", "2gpu", "4gpu", "4gpu-clique", "4gpu-auto", "2gpu-auto")]
    assert _pairs(four) == {"4gpu-clique": "4gpu", "4gpu-auto": "4gpu", "2gpu-auto": "2gpu"}
    knobs = {p.config: p.spec.knobs for p in plan}
    assert knobs["2gpu-torch"]["ddp"] == {"static_graph": False, "gradient_as_bucket_view": False}
    assert "ddp" not in knobs["2gpu"] and knobs["2gpu"]["run"] == {"comm_timing": False}  # DDP's own all-reduce


def test_a_block_starts_only_with_time_for_two_of_its_runs() -> None:
    from benchmarks.scaling.confirm import build_plan, needed_s, parse_config

    plan = build_plan([parse_config(t) for t in ("1gpu", "2gpu")], ["heavy", "light"], "worker", 2, parse_config("2x1"))
    done = [{"status": "ok", "gpus": 1, "pipeline": "worker", "independent": False, "wall_s": 30.0},
            {"status": "ok", "gpus": 2, "pipeline": "worker", "independent": False, "wall_s": 50.0}]  # fmt: skip
    firsts = [i for i, p in enumerate(plan) if p.block >= 0 and p.config == ("1gpu" if p.block % 2 == 0 else "2gpu")]
    assert [(plan[i].spec.model, plan[i].block) for i in firsts] == [("heavy", 0), ("heavy", 1), ("light", 0), ("light", 1)]
    for i in firsts:  # the block's first run and its second: 1.05 x (30 + 50)
        assert needed_s(done, plan, i, 20.0) == pytest.approx(84.0)
    assert needed_s(done, plan, firsts[0] + 1, 20.0) == pytest.approx(52.5)  # inside a block: the run alone
    assert needed_s(done, plan, 0, 20.0) == 20.0  # the warm-up (independent fits): the floor until one ran


def _run(config: str, block: int, gpus: int, data: list[float], model: list[float], step_ms: float,
         warmup: bool = False) -> dict[str, Any]:  # fmt: skip
    phases = {name: {"rank_steps_per_s": rates, "seeds_per_s": 100.0 * sum(rates)}
              for name, rates in (("data", data), ("model", model))}  # fmt: skip
    diag = {"timeline": {"phases": {"data": {"median": {"step": step_ms}}, "model": {"median": {"step": step_ms / 2}}}}}
    return {"status": "ok", "model": "heavy", "config": config, "block": block, "warmup": warmup, "gpus": gpus,
            "phases": phases, "per_rank_diag": [diag] * len(data)}  # fmt: skip


def test_ratios_are_taken_inside_each_block_then_their_median() -> None:
    """Block 0 runs everything fast, block 1 slow (drift): the per-block ratios agree though the rates do not; the
    warm-up and a skipped run count nowhere."""
    from benchmarks.scaling.confirm_report import summarize

    runs = [_run("2x1", -1, 2, [50.0, 50.0], [90.0, 90.0], 20.0, warmup=True),
            _run("1gpu", 0, 1, [100.0], [200.0], 10.0), _run("2gpu-torch", 0, 2, [80.0, 80.0], [160.0, 160.0], 12.5),
            _run("2gpu", 0, 2, [96.0, 96.0], [190.0, 190.0], 10.4),
            _run("2gpu", 1, 2, [72.0, 72.0], [142.5, 142.5], 13.9), _run("2gpu-torch", 1, 2, [60.0, 60.0], [120.0, 120.0], 16.7),
            _run("1gpu", 1, 1, [75.0], [150.0], 13.3), {"status": "skipped", "model": "heavy", "config": "2gpu", "block": 2}]  # fmt: skip
    summary = summarize(runs, "1gpu", {"2gpu": "2gpu-torch"})["heavy"]
    assert summary["blocks"] == [0, 1] and "2x1" not in summary["configs"]
    ours = summary["configs"]["2gpu"]["data"]
    assert ours["rate_blocks"] == [96.0, 72.0] and ours["rate"] == pytest.approx(84.0)  # the rates drift 25 %
    assert ours["ratio_blocks"]["per_rank"] == pytest.approx([0.96, 0.96])  # ratios inside a block do not
    assert ours["ratios"]["per_rank"] == pytest.approx(0.96) and ours["ratios"]["speedup"] == pytest.approx(1.92)
    assert ours["ratios"]["vs_2gpu-torch"] == pytest.approx(1.2)
    assert ours["ratios"]["per_rank_median"] == pytest.approx((10.0 / 10.4 + 13.3 / 13.9) / 2)  # median of 2
    assert summary["configs"]["2gpu"]["model"]["ratios"]["per_rank"] == pytest.approx(0.95)
    aims = summary["aims"]
    assert aims["config"] == "2gpu" and aims["speedup"]["met"] and aims["per_rank"]["met"]
    assert aims["speedup"]["aim"] == 1.9 and aims["per_rank"]["aim"] == 0.95
    assert summarize(runs[1:3], "1gpu", {})["heavy"]["aims"] == {}  # only the strategy's Ngpu runs are judged
    slow = summarize([runs[1], {**runs[2], "config": "2gpu"}], "1gpu", {})["heavy"]["aims"]
    assert slow["per_rank"]["value"] == pytest.approx(0.8) and slow["per_rank"]["met"] is False
    assert slow["speedup"]["value"] == pytest.approx(1.6) and slow["speedup"]["met"] is False


def _confirm(tmp_path: Path, *flags: str, timeout: float = 1500) -> dict[str, Any]:
    out = tmp_path / "confirm.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.scaling.confirm", "--device", "cpu", "--num-nodes", "5000", "--batch-size",
         "128", "--warmup-batches", "4", "--ring-batches", "3", "--phase-s", "0.3", "--presample-batches", "4",
         "--budget", "0.3", "--timeout", "400", "--cache-dir", str(tmp_path / "cache"), "--out", str(out), *flags],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()) | {"stdout": proc.stdout}


@pytest.mark.slow
def test_comparison_on_gloo_ranks_warms_up_then_interleaves_blocks(tmp_path: Path) -> None:
    report = _confirm(tmp_path, "--configs", "1gpu,2gpu-torch,2gpu", "--repeats", "2", "--models", "light",
                      "--path", "off", "--warmup-run", "1gpu")  # fmt: skip
    assert report["benchmark"] == "scaling_confirm" and "error" not in report["graph"]
    runs = report["runs"]
    assert [(r["config"], r["block"]) for r in runs] == [("1gpu", -1), ("1gpu", 0), ("2gpu-torch", 0), ("2gpu", 0),
                                                         ("2gpu", 1), ("2gpu-torch", 1), ("1gpu", 1)]  # fmt: skip
    for run in runs:
        assert run["status"] == "ok", (run["name"], run.get("error", "")[-3000:])
        assert set(run["phases"]) == {"data", "model"} and len(run["per_rank_diag"]) == run["gpus"]
        ddp = run["per_rank_diag"][0]["timeline"]["ddp"]
        assert not run["per_rank_diag"][0]["timeline"]["comm_hook"]  # DDP's own all-reduce, untimed
        torch_defaults = run["config"] == "2gpu-torch"
        assert ddp["static_graph"] is not torch_defaults and ddp["gradient_as_bucket_view"] is not torch_defaults
    summary = report["summary"]["light"]
    assert summary["blocks"] == [0, 1] and set(summary["configs"]) == {"1gpu", "2gpu-torch", "2gpu"}
    ours = summary["configs"]["2gpu"]
    assert len(ours["data"]["rate_blocks"]) == 2 and ours["data"]["ratios"]["per_rank"] > 0
    assert "vs_2gpu-torch" in ours["model"]["ratios"] and summary["aims"]["config"] == "2gpu"
    assert "light: medians over blocks [0, 1]" in report["stdout"]


@pytest.mark.slow
def test_a_deadline_skips_what_no_longer_fits_and_the_json_keeps_the_rest(tmp_path: Path) -> None:
    report = _confirm(tmp_path, "--configs", "1gpu,2gpu", "--repeats", "1", "--models", "light", "--path", "off",
                      "--warmup-run", "none", "--deadline-s", "1", timeout=300)  # fmt: skip
    assert [(r["config"], r["status"]) for r in report["runs"]] == [("1gpu", "skipped"), ("2gpu", "skipped")]
    assert "--deadline-s" in report["runs"][0]["reason"] and report["summary"] == {}


def test_four_gpus_are_judged_against_issue_42s_aims() -> None:
    """The most GPUs of the ``Ngpu`` labels are judged, against the aims for that count (4: 3.7x, 0.92 a rank)."""
    from benchmarks.scaling.confirm_report import summarize

    runs = [_run("1gpu", 0, 1, [100.0], [200.0], 10.0), _run("4gpu", 0, 4, [93.0] * 4, [190.0] * 4, 10.7),
            _run("4gpu-clique", 0, 4, [95.0] * 4, [190.0] * 4, 10.5), _run("2gpu", 0, 2, [97.0] * 2, [195.0] * 2, 10.3)]
    aims = summarize(runs, "1gpu", {"4gpu-clique": "4gpu"})["heavy"]["aims"]
    assert aims["config"] == "4gpu" and aims["gpus"] == 4
    assert aims["speedup"] == {"value": pytest.approx(3.72), "aim": 3.7, "met": True}
    assert aims["per_rank"] == {"value": pytest.approx(0.93), "aim": 0.92, "met": True}
    assert summarize([runs[0], _run("3gpu", 0, 3, [90.0] * 3, [1.0] * 3, 11.0)], "1gpu", {})["heavy"]["aims"] == {}
