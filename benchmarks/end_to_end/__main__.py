"""End-to-end training against PyG's NeighborLoader on the same graph: steps/s, time to accuracy, a report.

Every row (a data path, picked by name with ``--configs``; ``--list`` shows them) trains the same GraphSAGE
through Lightning's ``Trainer`` on the same generated ``SyntheticGraph`` (cached on disk, planted learnable
classes) with the same seed nodes per step, in a process of its own (MPS rows are started through the MPS
launcher, so the trainer is a client from its first CUDA call). Two models: ``light`` (2-layer SAGE h128,
[10, 5]) and ``heavy`` (3-layer SAGE h256, [15, 10, 5]), the same module configuration in every row, PyG's and
model-only's included: each layer trimmed to the hops it still needs (``--trim``; PyG's torch-sparse batches get
their per-hop counts from ``benchmarks/end_to_end/pyg_hops.py``) and ``--precision`` (bf16-mixed on a GPU). Rows whose
feature is missing from this build or machine are reported as skipped with the reason.

Output folder (``--out``): ``results.json`` (raw, rewritten after every row), ``report.md`` and PNG plots
(re-render anywhere with ``--report-only DIR``; without matplotlib the run still writes the JSON and says
how to render), ``logs/<row>.log``.

Examples::

    python -m benchmarks.end_to_end --preset small --out results/e2e-small            # all rows, ~10 min on an H200
    python -m benchmarks.end_to_end --preset headline --configs pyg,zc_gpu_mps --models heavy --out results/e2e-big
    python -m benchmarks.end_to_end --report-only results/e2e-small                   # plots and report from the JSON
    python -m benchmarks.end_to_end --preset issue20 --pyg-site /tmp/pygsite --out DIR   # issue 20: ~5 min on an H200 (estimated)
    python -m benchmarks.end_to_end --preset issue20 --no-trim --precision 32-true ...   # the module as it was before
    python -m benchmarks.end_to_end --preset issue20 --models heavy --configs zc_gpu_mps,zc_gpu_mps_20,zc_gpu_mps_30,zc_gpu_mps_auto \
        --append --out DIR                                    # the worker's MPS share: 10, 20, 30 % and the calibrated one
    python -m benchmarks.end_to_end --preset issue20 --configs zc_gpu_mps,sample_alone --feature-dtype bfloat16 --out DIR
                                                  # the build's stage split with bf16 host features, and the sampler alone

On the GPU box PyG's sampling backend comes from ``.pyg/*.tgz`` (``mkdir -p /tmp/pygsite && tar xzf .pyg/*.tgz -C
/tmp/pygsite``, then ``--pyg-site /tmp/pygsite``); ``--prepare-only`` builds the graph cache once (``headline``:
~34 GB on disk, kept under ``--cache-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
from typing import Any, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks.common.cli import add_gemm_rows_argument  # noqa: E402
from benchmarks.common import cpu_speed  # noqa: E402
from benchmarks.common.gpu_clocks import GpuClocks  # noqa: E402
from benchmarks.common.meta import machine_info  # noqa: E402
from benchmarks.common.sessions import forward_stop_signals, run_script  # noqa: E402
from benchmarks.end_to_end import report as e2e_report  # noqa: E402
from benchmarks.end_to_end.repeats import block_order  # noqa: E402
from benchmarks.end_to_end.rows import (  # noqa: E402
    MODELS, PRECISIONS, PRESETS, ROWS, _precheck, graph_kwargs, mps_prefix, parse_share, resolve_precision, select_rows,
)  # fmt: skip

_PRESET_FIELDS = list(PRESETS["small"].__dataclass_fields__)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.end_to_end", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])  # fmt: skip
    p.add_argument("--preset", choices=sorted(PRESETS), default="small", help="graph size, steps and budgets (below override it)")
    p.add_argument("--configs", help="comma-separated rows, or 'all' (default: the preset's)")
    p.add_argument("--models", help=f"comma-separated of {sorted(MODELS)} (default: the preset's)")
    p.add_argument("--out", help="output folder (default: results/e2e-<preset>)")
    p.add_argument("--report-only", metavar="DIR", help="re-render report.md and the plots from DIR/results.json "
                   "(into DIR, or into --out when given: DIR may be read-only)")
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    p.add_argument("--pyg-site", metavar="DIR", help="a folder with pyg-lib or torch-sparse, put first on every row's "
                   "import path (the GPU box: where .pyg/*.tgz is unpacked)")  # fmt: skip
    p.add_argument("--commit", default=os.environ.get("GPU_CHECK_COMMIT"),
                   help="the tree's commit for the report where it is no git checkout (default $GPU_CHECK_COMMIT, else git)")
    p.add_argument("--append", action="store_true", help="keep the runs already in --out/results.json (same graph) "
                   "and add or replace this command's rows: a long preset split over several commands")  # fmt: skip
    p.add_argument("--prepare-only", action="store_true", help="generate (or find) the cached graph and exit")
    g = p.add_argument_group("graph (SyntheticGraph, cached under --cache-dir)")
    g.add_argument("--num-nodes", type=int)
    g.add_argument("--avg-degree", type=float, help="average in-degree (both directions counted)")
    g.add_argument("--features", type=int, help="fp32 feature width")
    g.add_argument("--classes", type=int)
    g.add_argument("--homophily", type=float, default=0.8)
    g.add_argument("--feature-signal", type=float, default=0.1, help="class-mean scale vs unit noise (lower: harder)")
    g.add_argument("--gen-device", default="auto", help="where the graph is drawn: auto (cuda if present) | cpu | cuda")
    g.add_argument("--cache-dir", help="dataset cache root (default $LIGHTNING_ZEROCOPY_CACHE or ~/.cache/lightning_zerocopy)")
    t = p.add_argument_group("training and measuring")
    t.add_argument("--batch-size", type=int)
    t.add_argument("--steps", type=int, help="max training steps per row and model")
    t.add_argument("--warmup", type=int, help="steps before the steady-state timer starts")
    t.add_argument("--val-every", type=int, help="validate every N training steps")
    t.add_argument("--val-batches", type=int, help="validation batches per validation")
    t.add_argument("--target-acc", type=float, help="time-to-accuracy target (default: 95%% of the lowest best "
                   "validation accuracy among the rows of a model, decided when the report is written)")  # fmt: skip
    t.add_argument("--stop-at-target", action="store_true", help="end a row's training at the first validation "
                   "reaching --target-acc (after warm-up) instead of running --steps")  # fmt: skip
    t.add_argument("--threads", type=int, help="torch threads per row process (0: torch's default)")
    t.add_argument("--precision", default="auto", choices=PRECISIONS, help="Trainer(precision=...) of every row "
                   "(default auto: bf16-mixed on a GPU, 32-true on the CPU)")  # fmt: skip
    t.add_argument("--trim", action=argparse.BooleanOptionalAction, default=True, help="the model trims each layer to "
                   "the hops it still needs (models' trim=True); --no-trim: every layer on the whole subgraph")  # fmt: skip
    t.add_argument("--check-every", type=int, default=0, help="also check every N-th training batch against the "
                   "dataset, when its step starts and when it ends (a slot rewritten during its step); 0: only the "
                   "first batches")  # fmt: skip
    t.add_argument("--compile", action="store_true", help="every row's model with compile=True (torch.compile, "
                   "dynamic shapes), as `model.init_args.compile: true` in a recipe")  # fmt: skip
    add_gemm_rows_argument(t)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--row-budget-s", type=float, help="stop a row's training after this many seconds (0: none)")
    t.add_argument("--total-budget-s", type=float, help="skip the remaining rows after this many seconds of rows (0: none)")
    t.add_argument("--row-timeout-s", type=float, help="kill a row's process after this many seconds")
    t.add_argument("--repeats", type=int, default=1, help="run the rows in this many blocks, in alternating order; "
                   "the report compares each row with model-only inside each block and gives the medians")  # fmt: skip
    t.add_argument("--pyg-workers", help="NeighborLoader worker counts to sweep; the best trains")
    t.add_argument("--sweep-batches", type=int, default=40, help="batches timed per worker count of the sweep")
    t.add_argument("--stage-batches", type=int, default=256, help="model_only: distinct batches pre-staged on the device")
    t.add_argument("--stage-steps", type=int, default=20, help="stages row: batches timed per path (after 5)")
    t.add_argument("--worker-sm-percent", type=parse_share, default=10, help="MPS rows without a share of their own "
                   "(zc_gpu_mps_20, _30, _auto have one): the pipeline worker's share of SMs, 1-99 or auto")  # fmt: skip
    t.add_argument("--cache-fraction", type=float, default=0.2, help="zc_gpu_hot rows: share of feature rows cached on the GPU")
    t.add_argument("--cache-budget", default="20%", help="zerocopy_ddp rows: the Strategy's cache_budget")
    t.add_argument("--feature-dtype", choices=("float32", "bfloat16", "float16"), help="our rows: the host feature "
                   "table's dtype (ZeroCopyDataModule(feature_dtype=...): half the bytes over PCIe; batch.x stays "
                   "float32); default: the graph's fp32. PyG and model-only keep fp32")  # fmt: skip
    t.add_argument("--x-dtype", choices=("float32", "bfloat16", "float16"), help="our rows and model-only: the dtype "
                   "of batch.x (ZeroCopyDataModule(x_dtype=...); with --feature-dtype bfloat16 and a -mixed precision, "
                   "bfloat16 skips the cast to float32 and halves x in the slots); default: the host table's, cast "
                   "to float32. PyG keeps float32")  # fmt: skip
    p.add_argument("--_prepare", help=argparse.SUPPRESS)
    p.add_argument("--_run", help=argparse.SUPPRESS)
    p.add_argument("--_spec", help=argparse.SUPPRESS)
    p.add_argument("--_result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    preset = PRESETS[args.preset]
    for name in _PRESET_FIELDS:
        if getattr(args, name) is None:
            setattr(args, name, getattr(preset, name))
    for name in ("num_nodes", "features", "classes", "batch_size", "steps", "val_every", "val_batches", "stage_batches",
                 "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.check_every < 0:
        p.error(f"--check-every must be >= 0 (0: only the first batches), got {args.check_every}")
    if not 0 <= args.warmup < args.steps:
        p.error(f"--warmup must be in [0, --steps), got {args.warmup} with --steps {args.steps}")
    if not args.report_only and not args.list and not args._spec:
        try:
            select_rows(args.configs)
        except ValueError as exc:
            p.error(str(exc))
        from benchmarks.common.step_profile import check_profile_variables

        try:  # the profile variables, checked once here rather than in every row's process
            check_profile_variables()
        except ValueError as exc:
            p.error(str(exc))
    return args


# ---------------------------------------------------------------------------------------------- child processes
def _prepare(args: argparse.Namespace) -> dict[str, Any]:
    from lightning_zerocopy import SyntheticGraph

    kwargs = graph_kwargs(args, args.gen_device)
    dataset = SyntheticGraph(**kwargs)
    cached = dataset.cache.exists()
    t0 = time.perf_counter()
    dataset.prepare()
    meta = dataset.cache.meta()
    x_bytes = meta["num_nodes"] * meta["num_features"] * 4
    return {"graph_kwargs": kwargs, "cache": str(dataset.cache.path), "was_cached": cached,
            "prepare_s": time.perf_counter() - t0, "num_nodes": meta["num_nodes"], "num_edges": meta["num_edges"],
            "num_features": meta["num_features"], "num_classes": meta["num_classes"], "feature_GB": x_bytes / 1e9}  # fmt: skip


def _child_main(args: argparse.Namespace) -> None:
    with open(args._spec, "rb") as f:
        spec = pickle.load(f)
    if args._prepare:
        out: Any = _prepare(spec["args"])
    else:
        from benchmarks.end_to_end.train import run_row

        run_args = spec["args"]
        out = run_row(ROWS[args._run], [MODELS[m] for m in spec["models"]], run_args, spec["graph_kwargs"])
    with open(args._result, "w") as f:
        json.dump(out, f)


def _spawn(flags: list[str], spec: dict[str, Any], log_path: str, timeout: float,
           prefix: Optional[list[str]] = None) -> tuple[Any, Optional[str]]:  # fmt: skip
    """Run this file with ``flags`` in a new session; its JSON result, or None and why."""
    result, why = run_script(__file__, flags, spec, log_path, timeout, REPO_ROOT, prefix)
    return result, (why.replace("; see", " (--row-timeout-s); see", 1) if why and why.startswith("timed out") else why)


# ---------------------------------------------------------------------------------------------- orchestration
def run(args: argparse.Namespace) -> dict[str, Any]:
    """Prepare the graph, run every selected row in its own process, write the JSON and the report."""
    rows = select_rows(args.configs)
    if args.stop_at_target and args.target_acc is None:
        raise SystemExit("--stop-at-target needs --target-acc")
    if args.pyg_site:  # this process (the precheck) and every row's process import from it first
        site = os.path.abspath(args.pyg_site)
        sys.path.insert(0, site)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    out = os.path.abspath(args.out or os.path.join("results", f"e2e-{args.preset}"))
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    args.out = out  # every row's process logs its figures under out/logs (CSVLogger)
    import torch  # no driver initialization: the version and the device count only

    cuda = bool(torch.version.cuda and torch.cuda.device_count() > 0)
    args.precision = resolve_precision(args.precision, cuda)
    public = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    results: dict[str, Any] = {"meta": machine_info(REPO_ROOT, args.cache_dir, args.commit), "args": public,
                               "command": " ".join([os.path.basename(sys.executable), "-m", "benchmarks.end_to_end", *sys.argv[1:]]),
                               "rows": {r.name: r.doc for r in rows}, "runs": []}  # fmt: skip
    start = time.monotonic()
    print(f"e2e: preparing the graph ({args.num_nodes:,} nodes, avg degree {args.avg_degree}, {args.features} features); "
          f"models {args.models}, precision {args.precision}, trim {'on' if args.trim else 'off'}"
          f"{', compiled' if args.compile else ''}", flush=True)  # fmt: skip
    if args.gen_device == "auto":
        import torch

        args.gen_device = "cuda" if torch.version.cuda and torch.cuda.device_count() > 0 else "cpu"
    if args.gen_device == "cpu":  # no CUDA involved: in this process
        graph, why = _prepare(args), None
    else:  # a CUDA context of its own, gone before any row starts (MPS rows must find no other context)
        graph, why = _spawn(["--_prepare=1"], {"args": args}, os.path.join(out, "logs", "prepare.log"), max(args.row_timeout_s, 3600))
    if graph is None:
        raise SystemExit(f"e2e: preparing the graph failed: {why}")
    results["graph"] = graph
    print(f"e2e: graph {graph['num_nodes']:,} nodes, {graph['num_edges']:,} edges, {graph['feature_GB']:.2f} GB of features"
          f" ({'cached' if graph['was_cached'] else 'generated'} in {graph['prepare_s']:.1f} s) at {graph['cache']}", flush=True)  # fmt: skip
    if args.prepare_only:
        _write(results, out)
        return results
    if args.append:
        _keep_previous(results, out, [(r.name, m) for r in rows for m in models])
    with GpuClocks(enabled=cuda) as clocks:  # the clocks each row's steady window ran at
        _run_rows(args, rows, models, graph, results, out, clocks)
    results["total_s"] = time.monotonic() - start
    _write(results, out)
    files = e2e_report.render(out)
    print(f"e2e: wrote {', '.join(os.path.basename(f) for f in files)} in {out}", flush=True)
    return results


def _run_rows(args: argparse.Namespace, rows: list[Any], models: list[str], graph: dict[str, Any],
              results: dict[str, Any], out: str, clocks: GpuClocks) -> None:  # fmt: skip
    """Every row (``--repeats`` blocks of them), a process each; ``results`` rewritten after each."""
    rows_start = time.monotonic()  # the budget is for the rows: generating a headline graph can take longer
    for block, row in ((b, row) for b in range(args.repeats) for row in block_order(rows, b)):
        why = _precheck(row)
        if why is None and args.total_budget_s > 0 and time.monotonic() - rows_start > args.total_budget_s:
            why = "the run's time budget (--total-budget-s) was spent"
        if why is not None:
            runs = [{"row": row.name, "model": m, "kind": row.kind, "status": "skipped", "reason": why} for m in models]
        else:
            prefix = mps_prefix(args, row) if row.mps else None
            spec = {"args": args, "models": models, "graph_kwargs": graph["graph_kwargs"]}
            log = os.path.join(out, "logs", f"{row.name}.log")
            host_cpus = cpu_speed.summarise(cpu_speed.probe())  # the machine this row meets, before it starts
            t0 = time.monotonic()
            runs, why = _spawn([f"--_run={row.name}"], spec, log, args.row_timeout_s, prefix)
            if runs is None:
                runs = [{"row": row.name, "model": m, "kind": row.kind, "status": "error", "reason": why} for m in models]
            for r in runs:
                r["process_s"] = time.monotonic() - t0
                r["host_cpus"] = host_cpus
        for r in runs:
            r.setdefault("doc", row.doc)
            r["repeat"] = block
            if r.get("steady_wall") and clocks.enabled:
                r["gpu_clocks"] = clocks.window(*r["steady_wall"])
            results["runs"].append(r)
            print("e2e: " + (f"[block {block + 1}/{args.repeats}] " if args.repeats > 1 else "") + e2e_report.one_line(r),
                  flush=True)  # fmt: skip
        _write(results, out)


def _keep_previous(results: dict[str, Any], out: str, planned: list[tuple[str, str]]) -> None:
    """``--append``: the earlier runs in ``out`` (same graph) that this command does not repeat."""
    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        previous = json.load(f)
    if previous.get("graph", {}).get("cache") != results["graph"]["cache"]:
        raise SystemExit(f"--append: {path} holds runs on another graph ({previous.get('graph', {}).get('cache')}); "
                         "use another --out or the same graph flags")  # fmt: skip
    results["runs"] = [r for r in previous.get("runs", []) if (r["row"], r["model"]) not in set(planned)]
    results["rows"] = {**previous.get("rows", {}), **results["rows"]}
    results["earlier_commands"] = [*previous.get("earlier_commands", []), previous.get("command")]


def _write(results: dict[str, Any], out: str) -> None:
    tmp = os.path.join(out, "results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1, default=str)
    os.replace(tmp, os.path.join(out, "results.json"))


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    if args._spec:
        _child_main(args)
    elif args.list:
        for row in ROWS.values():
            print(f"{row.name:<18}{row.doc}")
    elif args.report_only:
        target = args.report_only
        if args.out and os.path.abspath(args.out) != os.path.abspath(args.report_only):  # e.g. a read-only copy
            import shutil

            os.makedirs(args.out, exist_ok=True)
            shutil.copyfile(os.path.join(args.report_only, "results.json"), os.path.join(args.out, "results.json"))
            target = args.out
        files = e2e_report.render(target)
        print(f"e2e: wrote {', '.join(os.path.basename(f) for f in files)} in {target}")
    else:
        forward_stop_signals()
        run(args)


if __name__ == "__main__":
    main()
