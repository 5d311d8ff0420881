"""``python -m benchmarks.scaling.diag``: where a DDP rank's step time goes when a second GPU joins (issue 39).

Every run is one scaling fit (``benchmarks.scaling``'s, in a session of its own) in phases: a warm-up epoch on the
data path (``--warmup-batches``), then one measured epoch per ``--phases`` entry, each about ``--phase-s`` seconds
(the steps cut to fit at the warm-up's pace, the same on every rank): ``data`` trains on the data path, ``model``
on a ring of ``--ring-batches`` real batches of the run's own plan, copied on each GPU during the warm-up and
replayed (no data path: DDP, the model and Lightning's per-step work alone). Every rank records its per-step
timeline (CUDA events: forward, backward with the all-reduce's tail, each bucket's all-reduce through a DDP comm
hook, optimizer, the GPU's idle gap; host: the same, the fetch of the next batch, the pipeline's hand-over,
Lightning's time between steps), its threads and CPU use (``/proc``) and, on GPUs, NCCL's transports.

``--plan`` lists the run groups in priority order (a run that would no longer fit in ``--deadline-s``, judged by
the longest finished run like it, is reported as skipped):

* ``<model>-<path>`` (``model``: ``heavy`` or ``light``; ``path``: ``worker``, the pipeline worker under MPS, its
  ``model`` phase the model-only row *with* an MPS daemon (the trainer's share); ``off``, batches built in the
  trainer without MPS, its ``model`` phase the model-only row *without* MPS; ``mps``, as ``off`` but the ranks MPS
  clients with the trainer's share): one run per ``--gpus`` count;
* ``pair`` or ``pair-<model>-<path>`` (default ``pair-heavy-worker``): independent single-GPU fits on the largest
  ``--gpus`` count of GPUs at once, no DDP (:mod:`.pair`): host contention without the all-reduce;
* ``knobs``: each ``--knobs`` variant (:mod:`.knobs`) on ``--knob-base`` at the largest ``--gpus`` count.

``--graph hetero`` runs every group on ``benchmarks.scaling``'s typed graph and model of ``--preset`` (``mag`` by
default): a plan token's ``<model>`` then only names its runs.

The JSON (``--out``, rewritten after every run) holds every run's figures (``runs``: per phase the ranks' steps/s,
the seeds/s, the ratios to the matching 1-GPU run, the ranks' timelines and host figures) and ``table``, one row per
run and phase with each rank's median phase times (:mod:`.diag_report`). Example (the ``scaling_diag`` stage of
``scripts/gpu_session.sh``; CPU: ``--device cpu`` runs the same code with gloo ranks and host clocks)::

    python -m benchmarks.scaling.diag --num-nodes 4000000 --gpus 1,2 --deadline-s 420 --out results/scaling_diag.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks.common.cli import add_gemm_rows_argument  # noqa: E402
from benchmarks.common.cpu_speed import describe  # noqa: E402
from benchmarks.common.results import write_json  # noqa: E402
from benchmarks.common.sessions import forward_stop_signals, restore_signals  # noqa: E402
from benchmarks.scaling.__main__ import HETERO_PRESETS, MODELS, launch, parse_args, synthetic_kwargs  # noqa: E402
from benchmarks.scaling.diag_report import compare, print_table, table_rows  # noqa: E402
from benchmarks.scaling.hetero import prepare_graph as prepare_typed_graph  # noqa: E402
from benchmarks.scaling.host_profile import profile_lines  # noqa: E402
from benchmarks.scaling.knobs import parse_variants  # noqa: E402
from benchmarks.scaling.phases import PHASES  # noqa: E402
from benchmarks.scaling.report import topology  # noqa: E402

__all__ = ["RunSpec", "add_run_flags", "build_plan", "check_run_flags", "main", "parse_diag_args", "run_estimate"]

_PATHS = ("worker", "off", "mps")


@dataclass
class RunSpec:
    """One run of the plan: its group, model, data path (``worker``/``off``), whether the ranks are MPS clients, GPU
    count, independent fits instead of DDP, and the knob variant (label and parsed knobs)."""

    name: str
    group: str
    model: str
    pipeline: str
    mps: bool
    gpus: int
    independent: bool = False
    knobs_label: Optional[str] = None
    knobs: dict[str, Any] = field(default_factory=dict)


def _base(token: str, where: str) -> tuple[str, str]:
    model, _, path = token.partition("-")
    if model not in MODELS or path not in _PATHS:
        raise ValueError(f"{where} {token!r}: write <model>-<path> with model in {sorted(MODELS)} and path in {_PATHS}")
    return model, path


def build_plan(plan: str, gpus: list[int], knobs: str, knob_base: str) -> list[RunSpec]:
    """The runs of ``--plan`` in order (see the module docstring).

    Raises:
        ValueError: an unknown group, model or path, or a bad ``--knobs`` (the message names the flag).
    """
    top = max(gpus)
    runs: list[RunSpec] = []
    for token in (t.strip() for t in plan.split(",") if t.strip()):
        if token == "knobs":
            model, path = _base(knob_base, "--knob-base")
            for label, parsed in parse_variants(knobs):
                runs.append(RunSpec(f"{model}-{path}-{top}gpu-{label}", "knobs", model, _pipeline(path), path != "off",
                                    top, knobs_label=label, knobs=parsed))  # fmt: skip
        elif token == "pair" or token.startswith("pair-"):
            model, path = _base(token[5:] if token != "pair" else "heavy-worker", "--plan")
            runs.append(RunSpec(f"{model}-{path}-{top}x1gpu-independent", "pair", model, _pipeline(path), path != "off",
                                top, independent=True))  # fmt: skip
        else:
            model, path = _base(token, "--plan")
            for count in gpus:
                runs.append(RunSpec(f"{model}-{path}-{count}gpu", token, model, _pipeline(path), path != "off", count))
    return runs


def _pipeline(path: str) -> str:
    return "worker" if path == "worker" else "off"


def add_run_flags(p: argparse.ArgumentParser, out: str, nccl_debug: int = 1) -> None:
    """The flags of the runs themselves (phases, graph, model's data path, cache, time limits), shared by
    ``benchmarks.scaling.diag`` and ``benchmarks.scaling.confirm``; :func:`check_run_flags` reads them."""
    p.add_argument("--phases", default="data,model", help=f"the measured epochs after the warm-up, of {PHASES}")
    p.add_argument("--phase-s", type=float, default=4.0, help="seconds each measured epoch takes (about)")
    p.add_argument("--ring-batches", type=int, default=16, help="batches staged on each GPU for the model phase")
    p.add_argument("--warmup-batches", type=int, default=30)
    p.add_argument("--limit-batches", type=int, default=0, help="the trainer's batch limit per epoch (0: the split)")
    p.add_argument("--deadline-s", type=float, default=0.0, help="seconds for everything (0: none); a run starts "
                   "only with the time a run like it took (at least --min-run-s) left, and gets at most what is left")
    p.add_argument("--min-run-s", type=float, default=30.0, help="the least time a run is expected to need")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per run at most")
    p.add_argument("--prepare-timeout", type=float, default=240.0, help="seconds to draw and cache the graph")
    p.add_argument("--nccl-debug", type=int, default=nccl_debug, help="1: NCCL's set-up log per run, summed in 'nccl'")
    for flag, kind, default in (("--num-nodes", int, 4_000_000), ("--avg-degree", int, 16), ("--features", int, 128),
                                ("--batch-size", int, 1024), ("--budget", float, 0.1), ("--presample-batches", int, 16),
                                ("--worker-sm-percent", int, 10), ("--seed", int, 0)):  # fmt: skip
        p.add_argument(flag, type=kind, default=default)
    p.add_argument("--policy", default="replicate", choices=("replicate", "clique", "auto"))
    p.add_argument("--graph", default="homogeneous", choices=("homogeneous", "hetero"),
                   help="hetero: benchmarks.scaling's typed graph and model of --preset (a plan token's <model> then "
                   "only names its runs; --num-nodes, --avg-degree and --features do not apply)")
    p.add_argument("--preset", default="mag", choices=sorted(HETERO_PRESETS), help="--graph hetero: the preset")
    p.add_argument("--ranking", default="presample", choices=("degree", "presample"))
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    add_gemm_rows_argument(p)  # 0 here (the runs before 2026-11-30 had none); a knob variant's gemm_rows overrides it
    p.add_argument("--out", default=out)


def check_run_flags(args: argparse.Namespace) -> None:
    """Sets ``args.phase_list`` from ``--phases``.

    Raises:
        ValueError: an unknown phase, or a model phase without a warm-up batch to stage (the message names the flag).
    """
    args.phase_list = [x.strip() for x in args.phases.split(",") if x.strip()]
    if not args.phase_list or any(x not in PHASES for x in args.phase_list):
        raise ValueError(f"--phases must name some of {PHASES}, got {args.phases!r}")
    if "model" in args.phase_list and args.warmup_batches < 1:
        raise ValueError("--warmup-batches must be >= 1: the warm-up fills the model phase's ring")


def parse_diag_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling.diag", description=__doc__.split("\n")[0])
    p.add_argument("--plan", default="heavy-worker,heavy-off,pair,knobs,light-worker,light-off",
                   help="run groups in priority order: <model>-<worker|off|mps>, pair[-<model>-<path>], knobs")
    p.add_argument("--gpus", default="1,2", help="GPU counts of the <model>-<path> groups (the largest: pair, knobs)")
    p.add_argument("--knobs", default="static_graph=0+gradient_as_bucket_view=0,torch_threads=4,"
                   "nccl_max_ctas=2+nccl_min_ctas=1,worker_sm_percent=20",
                   help="comma-separated knob variants, each one run (benchmarks/scaling/knobs.py)")
    p.add_argument("--knob-base", default="heavy-worker", help="the <model>-<path> the knob runs vary")
    add_run_flags(p, "results/scaling_diag.json")
    args = p.parse_args(argv)
    try:
        args.gpu_counts = sorted({int(g) for g in args.gpus.split(",") if g.strip()})
        check_run_flags(args)
        args.runs = build_plan(args.plan, args.gpu_counts, args.knobs, args.knob_base)
        if args.graph == "hetero" and any((r.knobs.get("run") or {}).get("compile") for r in args.runs):
            raise ValueError("--knobs compile applies to --graph homogeneous: the typed model builds its net from its "
                             "first batch")  # fmt: skip
    except ValueError as exc:
        p.error(str(exc))
    return args


def _run_argv(args: argparse.Namespace, spec: RunSpec, timeout: float) -> list[str]:
    """The scaling benchmark's flags of one run."""
    argv = ["--model", spec.model, "--num-nodes", str(args.num_nodes), "--avg-degree", str(args.avg_degree),
            "--features", str(args.features), "--batch-size", str(args.batch_size), "--ranking", args.ranking,
            "--presample-batches", str(args.presample_batches), "--precision", args.precision,
            "--warmup-batches", str(args.warmup_batches), "--limit-batches", str(args.limit_batches),
            "--run-budget-s", str(args.phase_s * len(args.phase_list)), "--worker-sm-percent", str(args.worker_sm_percent),
            "--seed", str(args.seed), "--device", args.device, "--timeout", str(timeout),
            "--gemm-rows", str(args.gemm_rows)]  # fmt: skip  (a variant's knob gemm_rows overrides it)
    argv += ["--graph", "hetero", "--preset", args.preset] if args.graph == "hetero" else []
    return argv + (["--cache-dir", args.cache_dir] if args.cache_dir else [])


def prepare_graph(args: argparse.Namespace) -> dict[str, Any]:
    """Draw and cache the run's ``SyntheticGraph`` (``--graph hetero``: the preset's typed graph) once, in a process
    of its own (on ``--device``; this process never touches CUDA), so no run's time pays for it. Returns ``wall_s``
    and the graph's arguments (typed: its summary), or ``error``."""
    run_args = parse_args(_run_argv(args, RunSpec("", "", "heavy", "off", False, 1), args.timeout))
    if args.graph == "hetero":
        started = time.monotonic()
        try:
            graph = prepare_typed_graph(run_args, REPO_ROOT, args.prepare_timeout)
            return {**graph, "wall_s": time.monotonic() - started}
        except RuntimeError as exc:
            return {"wall_s": time.monotonic() - started, "error": str(exc)}
    kwargs = synthetic_kwargs(run_args)
    code = ("import json, sys; from lightning_zerocopy.datasets import SyntheticGraph; "
            "SyntheticGraph(**json.loads(sys.argv[1])).prepare()")  # fmt: skip
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs)], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=args.prepare_timeout)  # fmt: skip
        error = None if proc.returncode == 0 else f"exit {proc.returncode}: {(proc.stderr or '')[-2000:]}"
    except subprocess.TimeoutExpired:
        error = f"ran past --prepare-timeout {args.prepare_timeout:.0f} s"
    return {"kwargs": kwargs, "wall_s": time.monotonic() - started, **({"error": error} if error else {})}


def wait_for_mps_exit(timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait until no MPS daemon or server runs on the machine (the previous run's supervisor stops its daemon after
    the run's processes exit; a run that found it still there would go without MPS): the seconds waited, and the
    pids still there after ``timeout_s``."""
    from lightning_zerocopy.pipeline.mps import mps_processes

    started = time.monotonic()
    left = mps_processes()
    while left and time.monotonic() - started < timeout_s:
        time.sleep(0.1)
        left = mps_processes()
    return {"mps_wait_s": round(time.monotonic() - started, 2), "mps_left": left}


def run_spec(args: argparse.Namespace, spec: RunSpec, timeout: float) -> dict[str, Any]:
    """Launch one run of the plan (once the previous run's MPS daemon is gone) and return its result with the
    spec's fields."""
    waited = wait_for_mps_exit() if args.device == "cuda" else {}
    run_args = parse_args(_run_argv(args, spec, timeout))
    extra = {"phases": args.phase_list, "ring_batches": args.ring_batches, "knobs": spec.knobs, "mps": spec.mps,
             "independent": spec.independent, "check_features": False,
             "nccl_debug": bool(args.nccl_debug) and args.device == "cuda"}  # fmt: skip
    result = launch(run_args, spec.gpus, args.policy, args.budget, spec.pipeline, extra=extra)
    return {**asdict(spec), "status": "error" if "error" in result else "ok", **waited, **result}


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    args = parse_diag_args(argv)
    start = time.monotonic()
    public = {k: v for k, v in vars(args).items() if k != "runs"}
    report: dict[str, Any] = {"benchmark": "scaling_diag", "config": public, "plan": [r.name for r in args.runs],
                              "topology": topology(), "runs": [], "table": []}  # fmt: skip
    print("plan (priority order): " + ", ".join(report["plan"]), flush=True)
    previous = forward_stop_signals()
    try:
        report["graph"] = prepare_graph(args)
        what = f"the {args.preset!r} typed graph" if args.graph == "hetero" else f"{args.num_nodes:,} nodes"
        print(f"graph: {what} ready in {report['graph']['wall_s']:.0f} s"
              + (f" ({report['graph']['error']})" if "error" in report["graph"] else ""), flush=True)  # fmt: skip
        write_json(args.out, report)
        for spec in args.runs:
            left = args.deadline_s - (time.monotonic() - start) if args.deadline_s > 0 else float("inf")
            needed = run_estimate(report["runs"], spec, args.min_run_s)
            if left < needed:
                result = {**asdict(spec), "status": "skipped",
                          "reason": f"{left:.0f} s left of --deadline-s, a run like it needs ~{needed:.0f} s"}  # fmt: skip
            else:
                result = run_spec(args, spec, min(args.timeout, left - 5.0))
            report["runs"].append(result)
            compare(report["runs"])
            report["table"] = table_rows(report["runs"])
            print(_line(result), flush=True)
            write_json(args.out, report)
    finally:
        restore_signals(previous)
        report["total_s"] = time.monotonic() - start
        write_json(args.out, report)
        print_table(report["table"])
        print("\n".join(profile_lines(report["runs"])), flush=True)
        print(f"wrote {args.out} ({report['total_s']:.0f} s)", flush=True)
    return report


def run_estimate(done: list[dict[str, Any]], spec: RunSpec, floor: float) -> float:
    """Seconds a run of ``spec`` is expected to take: the longest finished run of the same GPU count, data path and
    kind (DDP or independent), 5 % more, or ``floor`` (``--min-run-s``) before any such run, never less than it."""
    similar = [r["wall_s"] for r in done if r.get("status") == "ok" and r["gpus"] == spec.gpus
               and r["pipeline"] == spec.pipeline and r["independent"] == spec.independent]  # fmt: skip
    return max([floor, *(1.05 * w for w in similar)])


def _line(result: dict[str, Any]) -> str:
    if result["status"] != "ok":
        why = result.get("reason") or (result.get("error") or "")[-1500:]
        return f"{result['name']}: {result['status']} ({result.get('wall_s', 0):.0f} s) {why}"
    phases = ", ".join(f"{p} {sum(f['rank_steps_per_s']) / len(f['rank_steps_per_s']):.1f} steps/s a rank"
                       + (f" ({f['per_rank_vs_1gpu']:.2f}x 1 GPU)" if f.get("per_rank_vs_1gpu") else "")
                       for p, f in result["phases"].items())  # fmt: skip
    return f"{result['name']}: {phases} ({result['wall_s']:.0f} s; {describe(result.get('host_cpus') or {})})"


if __name__ == "__main__":
    main()
