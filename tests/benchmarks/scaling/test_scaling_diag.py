"""The scaling diagnostics (``benchmarks/scaling/diag.py`` and its parts): knob parsing, the plan, the per-step figures,
the phased loader and its ring, the host readings, NCCL's log, and the whole sweep on gloo ranks (its JSON's shape;
CPU figures are host times and not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


# ---- knobs and plan ------------------------------------------------------------------------------------------------
def test_knob_variants_parse_into_where_they_act() -> None:
    from benchmarks.scaling.knobs import parse_knobs, parse_variants

    assert parse_knobs("static_graph+bucket_cap_mb=100+nccl_max_ctas=2+env.NCCL_ALGO=Ring+torch_threads=4") == {
        "ddp": {"static_graph": True, "bucket_cap_mb": 100.0},
        "env": {"NCCL_MAX_CTAS": "2", "NCCL_ALGO": "Ring"},
        "threads": {"torch_threads": 4},
    }
    assert parse_knobs("static_graph=0+worker_sm_percent=20+sampler_threads=2") == {
        "ddp": {"static_graph": False}, "run": {"worker_sm_percent": 20}, "datamodule": {"sampler_threads": 2}}
    assert parse_knobs("step_sigterm_broadcast=off") == {"run": {"step_sigterm_broadcast": False}}
    assert parse_knobs("gemm_rows=64") == {"run": {"gemm_rows": 64}}
    assert [label for label, _ in parse_variants("mps, comm_timing=off ,")] == ["mps", "comm_timing=off"]
    for bad, says in (("static_grap", "unknown knob 'static_grap'"), ("bucket_cap_mb=-1", "bucket_cap_mb"),
                      ("worker_sm_percent=100", "[1, 99]"), ("mps=maybe", "on/off"), ("env.X", "env.NAME=value"),
                      ("mps+mps", "given twice")):  # fmt: skip
        with pytest.raises(ValueError, match=None) as info:
            parse_knobs(bad)
        assert says in str(info.value), info.value


def test_plan_is_in_priority_order_and_flags_are_checked() -> None:
    from benchmarks.scaling.diag import parse_diag_args

    args = parse_diag_args(["--plan", "heavy-worker,pair,knobs,light-mps", "--gpus", "2,1", "--knobs",
                            "static_graph,torch_threads=2"])  # fmt: skip
    plan = [(r.name, r.pipeline, r.mps, r.gpus, r.independent) for r in args.runs]
    assert plan == [
        ("heavy-worker-1gpu", "worker", True, 1, False), ("heavy-worker-2gpu", "worker", True, 2, False),
        ("heavy-worker-2x1gpu-independent", "worker", True, 2, True),
        ("heavy-worker-2gpu-static_graph", "worker", True, 2, False),
        ("heavy-worker-2gpu-torch_threads=2", "worker", True, 2, False),
        ("light-mps-1gpu", "off", True, 1, False), ("light-mps-2gpu", "off", True, 2, False),
    ]  # fmt: skip
    assert args.runs[3].knobs == {"ddp": {"static_graph": True}} and args.phase_list == ["data", "model"]
    for bad in (["--plan", "huge-worker"], ["--plan", "heavy-gpu"], ["--knobs", "nope"], ["--phases", "data,eval"],
                ["--warmup-batches", "0"], ["--graph", "hetero", "--plan", "knobs", "--knobs", "compile"]):  # fmt: skip
        with pytest.raises(SystemExit):
            parse_diag_args(bad)
    assert parse_diag_args(["--plan", "knobs", "--knobs", "compile"]).runs[0].knobs == {"run": {"compile": True}}


def test_the_compile_knob_compiles_the_homogeneous_model(tmp_path: Path) -> None:
    from benchmarks.scaling.__main__ import _homogeneous_parts, parse_args

    args = parse_args(["--device", "cpu", "--num-nodes", "500", "--cache-dir", str(tmp_path)])
    config = {"loader": "ours", "budget": 0.0, "policy": "replicate", "gpus": 1, "knobs": {"run": {"compile": True}}}
    compiled = _homogeneous_parts(args, config, cuda=False)[1]
    plain = _homogeneous_parts(args, {**config, "knobs": {}}, cuda=False)[1]
    assert compiled.net._compiled_call_impl is not None and plain.net._compiled_call_impl is None


def test_every_run_gets_the_row_buckets_asked_for() -> None:
    """``--gemm-rows N`` reaches every run's scaling flags; 0 (no buckets) unless given, as in the runs before it."""
    from benchmarks.scaling.__main__ import parse_args
    from benchmarks.scaling.diag import _run_argv, parse_diag_args

    for flags, rows in (([], 0), (["--gemm-rows", "64"], 64)):
        args = parse_diag_args(["--plan", "heavy-worker,light-off", *flags])
        assert [parse_args(_run_argv(args, spec, 60.0)).gemm_rows for spec in args.runs] == [rows] * 4


def test_a_run_is_expected_to_take_as_long_as_the_longest_run_like_it() -> None:
    from benchmarks.scaling.diag import RunSpec, run_estimate

    done = [{"status": "ok", "gpus": 2, "pipeline": "worker", "independent": False, "wall_s": 60.0},
            {"status": "ok", "gpus": 2, "pipeline": "worker", "independent": False, "wall_s": 50.0},
            {"status": "ok", "gpus": 1, "pipeline": "worker", "independent": False, "wall_s": 45.0},
            {"status": "error", "gpus": 2, "pipeline": "off", "independent": False, "wall_s": 90.0}]  # fmt: skip
    spec = RunSpec("x", "knobs", "heavy", "worker", True, 2)
    assert run_estimate(done, spec, 30.0) == pytest.approx(63.0)
    assert run_estimate(done, RunSpec("y", "pair", "heavy", "worker", True, 2, independent=True), 30.0) == 30.0
    assert run_estimate(done, RunSpec("z", "heavy-off", "heavy", "off", False, 2), 40.0) == 40.0  # errors do not count


# ---- the timeline's figures ------------------------------------------------------------------------------------------
def _mark(host: float) -> Any:
    from benchmarks.scaling.timeline import _Mark

    mark = _Mark(cuda=False)
    mark.host = host
    return mark


def test_step_figures_from_marks() -> None:
    """Host marks in seconds -> ms: phases between hooks, the interval and gap from the previous step, Lightning's
    share of the gap (less the fetch), the all-reduce of each bucket and the last one's tail."""
    from benchmarks.scaling.timeline import step_figures

    previous = {"marks": {"start": _mark(0.0), "end": _mark(0.008)}}
    record = {"marks": {"start": _mark(0.010), "bwd0": _mark(0.013), "bwd1": _mark(0.018), "end": _mark(0.019)},
              "fetch": 0.0015, "handover": 0.001,
              "comm": [[_mark(0.015), _mark(0.016)], [_mark(0.0165), _mark(0.0175)], [_mark(0.017), None]]}  # fmt: skip
    f = step_figures(record, previous)
    expect = {"fwd": 3.0, "bwd": 5.0, "opt": 1.0, "step": 10.0, "gap": 2.0, "h_between": 2.0, "h_fetch": 1.5,
              "h_lightning": 0.5, "h_handover": 1.0, "buckets": 2.0, "comm": 2.0, "comm_tail": 1.0}  # fmt: skip
    for key, value in expect.items():
        assert f[key] == pytest.approx(value), key
    first = step_figures({**record, "fetch": None, "handover": None, "comm": []}, None)
    assert "step" not in first and "h_fetch" not in first and first["buckets"] == 0 and "comm" not in first


def test_summaries_pick_quantiles() -> None:
    from benchmarks.scaling.timeline import summarize_values

    out = summarize_values({"x": [float(v) for v in range(1, 12)], "empty": []})
    assert out["median"] == {"x": 6.0} and out["p10"]["x"] == 2.0 and out["p90"]["x"] == 10.0
    assert out["mean"]["x"] == pytest.approx(6.0)


# ---- phases, ring, barrier -------------------------------------------------------------------------------------------
class _Batch:
    def __init__(self, i: int) -> None:
        self.i, self.cloned = i, False

    def clone(self) -> "_Batch":
        copy = _Batch(self.i)
        copy.cloned = True
        return copy


class _Inner:
    def __init__(self, n: int) -> None:
        self.n, self.epochs, self.closed = n, [], 0

    def __len__(self) -> int:
        return self.n

    @property
    def sampler(self) -> "_Inner":
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self):
        try:
            for i in range(self.n):
                time.sleep(0.001)
                yield _Batch(i)
        finally:
            self.closed += 1


def test_phased_loader_stages_a_ring_in_the_warmup_and_replays_it() -> None:
    from benchmarks.scaling.phases import PhasedLoader, RingPhases

    owner = RingPhases(["data", "model"], ring_batches=3, handover=lambda: 0.25)
    dm = SimpleNamespace(loader_factory=None, use_loader_factory=lambda f: setattr(dm, "loader_factory", f))
    owner.attach_host_memory(None, dm)
    inner = _Inner(5)
    loader = dm.loader_factory("train", inner)
    assert isinstance(loader, PhasedLoader) and dm.loader_factory("val", inner) is inner and len(loader) == 5
    assert [owner.phase_of(e) for e in range(3)] == ["warmup", "data", "model"] and owner.epochs == 3
    warm = list(loader)
    assert [b.i for b in warm] == list(range(5)) and [b.i for b in owner.ring] == [0, 1, 2]
    assert all(b.cloned for b in owner.ring) and not any(b.cloned for b in warm)
    fetch, handover = owner.fetched()
    assert fetch > 0 and handover == 0.25
    loader.sampler.set_epoch(1)
    it = iter(loader)
    next(it), next(it)
    it.close()  # the step cap ends the epoch early: the data path's iteration is closed with it
    assert inner.closed == 2 and inner.epochs == [1]
    loader.set_epoch(2)
    replay = list(loader)
    assert [b.i for b in replay] == [0, 1, 2, 0, 1] and replay[0] is owner.ring[0] and owner.fetched() == (0.0, None)
    with pytest.raises(ValueError):
        RingPhases(["train"])


def test_model_phase_without_a_ring_says_what_to_change() -> None:
    from benchmarks.scaling.phases import PhasedLoader, RingPhases

    loader = PhasedLoader(_Inner(2), RingPhases(["model"]))
    loader.set_epoch(1)
    with pytest.raises(RuntimeError, match="--warmup-batches"):
        list(loader)


def test_epoch_barrier_waits_for_every_party(tmp_path: Path) -> None:
    from benchmarks.scaling.pair import EpochBarrier

    first, second = EpochBarrier(str(tmp_path), 2, 0, timeout_s=10), EpochBarrier(str(tmp_path), 2, 1, timeout_s=10)
    released: list[float] = []
    thread = threading.Thread(target=lambda: released.append(first.wait("epoch0") and time.monotonic()))
    thread.start()
    time.sleep(0.3)
    assert not released  # the other party has not arrived
    arrived = time.monotonic()
    assert second.wait("epoch0")
    thread.join(5)
    assert released and released[0] >= arrived
    assert not EpochBarrier(str(tmp_path), 2, 0, timeout_s=0.05).wait("epoch1")


# ---- host readings and NCCL's log ------------------------------------------------------------------------------------
def test_nccl_logs_are_summed(tmp_path: Path) -> None:
    from benchmarks.scaling.nccl_log import nccl_debug_env, read_nccl_logs

    assert nccl_debug_env(str(tmp_path))["NCCL_DEBUG_FILE"].startswith(str(tmp_path))
    (tmp_path / "nccl.host.11.log").write_text(
        "host:11:11 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
        "host:11:11 [0] NCCL INFO NCCL_MAX_CTAS set by environment to 2.\n"
        "host:11:20 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
        "host:11:20 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
        "host:11:20 [0] NCCL INFO 2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer\n")  # fmt: skip
    (tmp_path / "nccl.host.12.log").write_text("host:12:12 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via SHM/direct/direct\n"
                                               "host:12:12 [1] NCCL WARN Cuda failure 'operation not supported'\n")  # fmt: skip
    out = read_nccl_logs(str(tmp_path))
    assert out["files"] == 2 and out["version"] == ["2.21.5+cuda12.4"] and out["channels"] == [[2, 2]]
    assert out["transports"] == {"P2P/CUMEM/read": 2, "SHM/direct/direct": 1}
    assert out["env"] == ["NCCL_MAX_CTAS set by environment to 2."] and len(out["warnings"]) == 1


# ---- the comparisons ---------------------------------------------------------------------------------------------------
def _run(name: str, gpus: int, rates: list[float], knobs: Any = None, independent: bool = False) -> dict[str, Any]:
    phases = {"data": {"rank_steps_per_s": rates, "seeds_per_s": 10 * sum(rates)}}
    diag = {"timeline": {"phases": {"data": {"median": {"step": 1000 / rates[0], "fwd": 2.0}}}},
            "host_load": {"data": {"processes": [{"role": "trainer", "cores": 1.5, "threads": 30, "involuntary_per_s": 7.0}],
                                   "machine_busy_cores": 3.0, "cpu_count": 32}}}  # fmt: skip
    return {"name": name, "group": "knobs" if knobs else "heavy-worker", "model": "heavy", "pipeline": "worker",
            "mps": True, "gpus": gpus, "independent": independent, "knobs_label": knobs, "status": "ok",
            "phases": phases, "per_rank_diag": [diag] * len(rates)}  # fmt: skip


def test_ratios_and_table_rows() -> None:
    from benchmarks.scaling.diag_report import compare, table_rows

    runs = [_run("one", 1, [120.0]), _run("two", 2, [84.0, 86.0]), _run("pair", 2, [110.0, 114.0], independent=True),
            _run("knob", 2, [102.0, 102.0], knobs="static_graph"), {"name": "skipped", "status": "skipped"}]  # fmt: skip
    compare(runs)
    two, pair, knob = (runs[i]["phases"]["data"] for i in (1, 2, 3))
    assert two["per_rank_vs_1gpu"] == pytest.approx(85 / 120) and two["speedup_vs_1gpu"] == pytest.approx(170 / 120)
    assert pair["per_rank_vs_1gpu"] == pytest.approx(112 / 120) and "vs_no_knobs" not in pair
    assert knob["vs_no_knobs"] == pytest.approx(102 / 85) and knob["per_rank_vs_1gpu"] == pytest.approx(102 / 120)
    rows = table_rows(runs)
    assert [(r["run"], r["rank"]) for r in rows] == [("one", 0), ("two", 0), ("two", 1), ("pair", 0), ("pair", 1),
                                                     ("knob", 0), ("knob", 1)]  # fmt: skip
    assert rows[2]["steps_per_s"] == 86.0 and rows[0]["fwd"] == 2.0 and rows[0]["comm"] is None
    assert rows[0]["trainer_cores"] == 1.5 and rows[0]["trainer_involuntary_per_s"] == 7.0


# ---- the run budget --------------------------------------------------------------------------------------------------
def test_run_budget_paces_the_measured_epochs_by_the_median_warmup_step() -> None:
    """Warm-up steps of 10 ms with two 200 ms outliers in the second half and a slow epoch end: the measured epochs
    get seconds / 10 ms steps (a mean up to the epoch's end read ~5x slower and cut them to a fifth)."""
    from benchmarks.scaling.budget import RunBudget

    now = [0.0]
    budget = RunBudget(warmup_batches=20, seconds=4.0, epochs=3, cuda=False, clock=lambda: now[0])
    loop = SimpleNamespace(max_batches=10_000)
    trainer = SimpleNamespace(current_epoch=0, fit_loop=loop, strategy=SimpleNamespace(broadcast=lambda x: x))
    budget.on_train_start(trainer, None)
    assert loop.max_batches == 20
    for step in range(20):
        now[0] += 0.2 if step in (14, 17) else 0.01
        budget.on_train_batch_end(trainer, None, None, None, step)
    now[0] += 2.0  # the epoch's end (telemetry, the pipeline's switch) is no step
    budget.on_train_epoch_end(trainer, None)
    assert budget.step_s == pytest.approx(0.01)
    assert budget.cap == loop.max_batches == pytest.approx(200, abs=1)  # 4 s over 2 epochs at 10 ms a step


# ---- the sweep on gloo ranks --------------------------------------------------------------------------------------------
def _diag(tmp_path: Path, *flags: str, timeout: float = 1500) -> dict[str, Any]:
    out = tmp_path / "diag.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.scaling.diag", "--device", "cpu", "--num-nodes", "5000", "--batch-size", "128",
         "--warmup-batches", "4", "--ring-batches", "3", "--phase-s", "0.3", "--presample-batches", "4", "--budget", "0.3",
         "--timeout", "400", "--cache-dir", str(tmp_path / "cache"), "--out", str(out), *flags],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_sweep_on_two_cpu_ranks_writes_every_figure(tmp_path: Path) -> None:
    """1 and 2 gloo ranks (data and model-only phases), two independent runs at once, and a knob variant that sets
    DDP options, the threads, an environment variable and keeps Lightning's per-step SIGTERM broadcast (the runs skip
    it by default): every run's per-rank timeline, host and DDP figures (the variant's model also has its linear
    products bucketed: gemm_rows)."""
    report = _diag(tmp_path, "--plan", "heavy-off,pair-heavy-off,knobs", "--knob-base", "heavy-off", "--knobs",
                   "static_graph=0+gradient_as_bucket_view=0+bucket_cap_mb=1+torch_threads=1+env.LZC_DIAG_PROBE=x+"
                   "step_sigterm_broadcast=1+profile_steps=2+gemm_rows=64")  # fmt: skip
    assert report["benchmark"] == "scaling_diag" and "topo_m" in report["topology"] and "error" not in report["graph"]
    runs = {r["name"]: r for r in report["runs"]}
    assert list(runs) == report["plan"] == ["heavy-off-1gpu", "heavy-off-2gpu", "heavy-off-2x1gpu-independent",
                                            "heavy-off-2gpu-static_graph=0+gradient_as_bucket_view=0+bucket_cap_mb=1+"
                                            "torch_threads=1+env.LZC_DIAG_PROBE=x+step_sigterm_broadcast=1+"
                                            "profile_steps=2+gemm_rows=64"]  # fmt: skip
    for name, run in runs.items():
        assert run["status"] == "ok", (name, run.get("error", "")[-3000:])
        assert set(run["phases"]) == {"data", "model"} and len(run["per_rank_diag"]) == run["gpus"]
        for phase in run["phases"].values():
            assert len(phase["rank_steps_per_s"]) == run["gpus"] and min(phase["rank_steps_per_s"]) > 0
            assert phase["seeds_per_s"] == pytest.approx(128 * sum(phase["rank_steps_per_s"]))
        for diag in run["per_rank_diag"]:
            assert diag["phases_by_epoch"] == ["warmup", "data", "model"] and diag["ring_batches"] == 3
            timeline = diag["timeline"]
            assert timeline["clock"] == "host" and timeline["comm_hook"] and timeline["ddp"]["parameters"] > 0
            assert sum(timeline["comm_callbacks"].values()) > 0
            for phase in ("data", "model"):
                figures = timeline["phases"][phase]
                assert figures["steps"] > 0 and figures["median"]["buckets"] >= 1
                assert {"fwd", "bwd", "opt", "step", "gap", "comm", "comm_tail", "h_between"} <= set(figures["median"])
                assert len(figures["raw"]["fwd"]) == figures["steps"] or len(figures["raw"]["fwd"]) == 256
            assert timeline["phases"]["model"]["median"]["h_fetch"] == 0.0  # the ring: no data path
            trainer = [p for p in diag["host_load"]["data"]["processes"] if p["role"] == "trainer"]
            assert len(trainer) == 1 and trainer[0]["threads"] >= 1
    assert "vs_no_knobs" in runs[report["plan"][3]]["phases"]["data"]
    assert [runs[name]["step_sigterm_broadcast"] for name in report["plan"]] == [False, False, False, True]  # knob: kept
    for name in report["plan"][1:3]:
        assert runs[name]["phases"]["model"]["per_rank_vs_1gpu"] > 0
    pair = runs["heavy-off-2x1gpu-independent"]
    assert [d["barrier_timeouts"] for d in pair["per_rank_diag"]] == [[], []]
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // 2))  # a rank's share
    assert all(d["threads"]["OMP_NUM_THREADS"] == threads for d in pair["per_rank_diag"])
    knob = runs[report["plan"][3]]["per_rank_diag"]
    assert not any(d["timeline"]["ddp"]["static_graph"] or d["timeline"]["ddp"]["gradient_as_bucket_view"] for d in knob)
    assert all(d["timeline"]["ddp"]["bucket_cap_mb"] == 1.0 for d in knob)
    assert all(d["threads"]["torch_threads"] == 1 and d["env"] == {"LZC_DIAG_PROBE": "x"} for d in knob)
    for d in knob:  # PyTorch's profiler over 2 steps of each phase: the main thread's host time by operator
        assert all(d["host_profile"][p]["steps"] == 2 and d["host_profile"][p]["top"] for p in ("data", "model")), d
    assert all(d["host_profile"] is None for run in report["plan"][:3] for d in runs[run]["per_rank_diag"])
    plain = runs["heavy-off-2gpu"]["per_rank_diag"][0]["timeline"]["ddp"]  # ZeroCopyDDPStrategy's defaults
    assert plain["static_graph"] and plain["gradient_as_bucket_view"]
    rows = report["table"]
    assert len(rows) == sum(2 * r["gpus"] for r in runs.values()) and {r["phase"] for r in rows} == {"data", "model"}
    assert all(r["host_cpus"]["samples"] >= r["host_cpus"]["cpus"] >= 1 for r in runs.values())  # probed before each
    assert all(0 < row["host_fast_share"] <= 1 and row["trainer_cpu"] is not None for row in rows)


def test_deadline_skips_what_no_longer_fits(tmp_path: Path) -> None:
    report = _diag(tmp_path, "--plan", "light-off", "--gpus", "1,2", "--deadline-s", "1", timeout=300)
    assert [(r["name"], r["status"]) for r in report["runs"]] == [("light-off-1gpu", "skipped"),
                                                                  ("light-off-2gpu", "skipped")]  # fmt: skip
    assert "--deadline-s" in report["runs"][0]["reason"] and report["table"] == []


def test_a_typed_graph_runs_both_phases_on_one_and_two_cpu_ranks(tmp_path: Path) -> None:
    """``--graph hetero``: the preset's typed graph is drawn once, then 1 and 2 gloo ranks train it in the data and
    model-only phases with each rank's timeline (where a typed rank's step goes: issue 39's clique on that graph)."""
    report = _diag(tmp_path, "--graph", "hetero", "--preset", "ci", "--plan", "heavy-off", "--batch-size", "32")
    assert "error" not in report["graph"] and report["graph"]["num_nodes"]["paper"] == 3000, report["graph"]
    runs = {r["name"]: r for r in report["runs"]}
    assert list(runs) == ["heavy-off-1gpu", "heavy-off-2gpu"]
    for name, run in runs.items():
        assert run["status"] == "ok", (name, run.get("error", "")[-3000:])
        assert [set(t) for t in run["cache_per_type"]] == [{"paper"}] * run["gpus"]  # the typed cache's counts
        for phase in run["phases"].values():
            assert len(phase["rank_steps_per_s"]) == run["gpus"] and min(phase["rank_steps_per_s"]) > 0
            assert phase["seeds_per_s"] == pytest.approx(32 * sum(phase["rank_steps_per_s"]))
        for diag in run["per_rank_diag"]:
            assert diag["phases_by_epoch"] == ["warmup", "data", "model"]
            assert all(diag["timeline"]["phases"][p]["steps"] > 0 for p in ("data", "model"))
