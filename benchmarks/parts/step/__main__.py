"""The training step on pre-staged batches: plain loop, bare LightningModule, ours, telemetry, bf16, trimmed, compiled.

One run, one graph: for each model (``light``: SAGE 2x128 ``[10, 5]``; ``heavy``: SAGE 3x256 ``[15, 10, 5]``) the
plan's first ``--stage-batches`` batches are built once by ``ZeroCopyDataModule`` (CPU sampler and gather, features
in host memory) and moved to the device before anything is timed; every row (``--rows``, ``--list``) then trains on
the same list of batches, cycled: a plain PyTorch loop, or one ``Trainer.fit`` per row. A step's time is the median
over the ``--steps`` timed steps after ``--warmup`` of start-to-next-start intervals (CUDA events on a GPU, so
nothing synchronizes while training; host timers on the CPU), and the mean from host wall time between device
synchronizations. Every row starts from the same weights; its loss on the first batch (eval mode, before training)
is checked against the plain loop's.

Output (``--out``): ``results.json`` and ``report.md``.

Examples::

    python -m benchmarks.parts.step --out results/step                                  # 20M-node graph, GPU, every row
    python -m benchmarks.parts.step --device cpu --num-nodes 4000 --features 32 --batch-size 64 --warmup 2 --steps 5
    python -m benchmarks.parts.step --models light --rows plain,bare_trim,ours,ours_telemetry,ours_e2e_bf16 --profile  # host time
    python -m benchmarks.parts.step --device cpu --num-nodes 3000 --features 8 --hidden 8 --batch-size 32 --profile  # CPU

With ``--profile`` each row also runs under cProfile and torch.profiler: ``profile.json`` and ``profile.md`` give its
host time per step by group (Lightning loop, our callbacks, our module, optimizer, autograd, PyG, torch) and its top
functions and operators (``benchmarks/parts/step/profiling.py``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import torch  # noqa: E402

from benchmarks.common.meta import machine_info  # noqa: E402
from benchmarks.common.results import write_json  # noqa: E402
from benchmarks.end_to_end.rows import MODELS, ModelSpec, graph_kwargs  # noqa: E402
from benchmarks.parts.step.rows import ROWS, RowSpec, select  # noqa: E402

#: relative difference of a row's first-batch loss from the plain loop's above which the row is flagged
LOSS_TOLERANCE = {False: 1e-3, True: 3e-2}  # fp32, bf16


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parts.step", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])  # fmt: skip
    p.add_argument("--rows", default="all", help="comma-separated rows, or 'all' (--list shows them)")
    p.add_argument("--models", default="light,heavy", help="comma-separated of light, heavy")
    p.add_argument("--device", default="auto", help="auto (cuda if present) | cpu | cuda | cuda:N")
    p.add_argument("--out", default="results/step", help="output folder")
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    p.add_argument("--prepare-only", action="store_true", help="generate (or find) the cached graph and exit")
    p.add_argument("--commit", default=os.environ.get("GPU_CHECK_COMMIT"), help="the tree's commit where it is no git checkout")
    g = p.add_argument_group("graph (SyntheticGraph, cached under --cache-dir; the same cache as benchmarks/end_to_end/)")
    g.add_argument("--num-nodes", type=int, default=20_000_000)
    g.add_argument("--avg-degree", type=float, default=10.0)
    g.add_argument("--features", type=int, default=128, help="fp32 feature width")
    g.add_argument("--classes", type=int, default=16)
    g.add_argument("--homophily", type=float, default=0.8)
    g.add_argument("--feature-signal", type=float, default=0.1)
    g.add_argument("--gen-device", default="auto", help="where the graph is drawn: auto (the run's device) | cpu | cuda")
    g.add_argument("--cache-dir", help="dataset cache root (default $LIGHTNING_ZEROCOPY_CACHE or ~/.cache/lightning_zerocopy)")
    t = p.add_argument_group("steps")
    t.add_argument("--batch-size", type=int, default=1024)
    t.add_argument("--warmup", type=int, default=20, help="steps before timing (compilation happens here)")
    t.add_argument("--steps", type=int, default=200, help="timed steps per row")
    t.add_argument("--stage-batches", type=int, default=64, help="distinct batches pre-staged on the device, cycled")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    t.add_argument("--hidden", type=int, default=0, help="hidden width of every model (0: the model's own; a tiny width "
                   "leaves only host overhead on the CPU)")
    t.add_argument("--profile", action="store_true", help="also profile each row's host time per step (cProfile and "
                   "torch.profiler): profile.json and profile.md (benchmarks/parts/step/profiling.py)")
    t.add_argument("--profile-steps", type=int, default=100, help="steps profiled after --warmup, per profiler")
    args = p.parse_args(argv)
    for name in ("num_nodes", "features", "classes", "batch_size", "steps", "stage_batches", "profile_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.hidden < 0:
        p.error(f"--warmup and --hidden must be >= 0, got {args.warmup} and {args.hidden}")
    try:
        args.row_list = select(args.rows)
    except ValueError as exc:
        p.error(str(exc))
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.model_list if m not in ("light", "heavy")]
    if unknown or not args.model_list:
        p.error(f"--models: unknown model(s) {unknown or args.models!r}; known: light, heavy")
    return args


# ---------------------------------------------------------------------------------------------- one row
def _initial_loss(row: RowSpec, module: Any, batch: Any, device: torch.device) -> float:
    """The row's loss on ``batch`` with its starting weights, eval mode (no dropout), its precision."""
    import torch.nn.functional as F

    import contextlib

    module.to(device).eval()
    eager = torch.compiler.set_stance("force_eager") if row.compile else contextlib.nullcontext()  # no eval-mode compile
    with eager, torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=row.bf16):
        out, y = module._seed_logits(batch)
        loss = float(F.cross_entropy(out.float(), y, ignore_index=-1))
    module.train()
    return loss


def run_row(row: RowSpec, spec: ModelSpec, staged: list[Any], dims: tuple[int, int], args: argparse.Namespace,
            device: torch.device) -> dict[str, Any]:  # fmt: skip
    """Train ``spec`` as ``row`` says on ``--warmup + --steps`` of the staged batches; the row's figures (with
    ``--profile``, then twice more under the profilers: ``benchmarks/parts/step/profiling.py``)."""
    t0 = time.perf_counter()
    module = _module(row, spec, dims, args)
    initial = _initial_loss(row, module, staged[0], device)
    result = _train(row, module, staged, args.warmup + args.steps, args, device)
    out = {**result, "initial_loss": initial, "fit_s": time.perf_counter() - t0}
    if args.profile:
        from benchmarks.parts.step.profiling import profile_row

        def train(profiler: Any, steps: int) -> None:
            _train(row, _module(row, spec, dims, args), staged, steps, args, device, profiler)

        out["profile"] = profile_row(train, args.warmup, args.profile_steps)
    return out


def _module(row: RowSpec, spec: ModelSpec, dims: tuple[int, int], args: argparse.Namespace) -> Any:
    """The row's module, from the run's seed (the same initial weights in every row)."""
    import pytorch_lightning as pl
    from torch_geometric.nn.models import GraphSAGE as PyGGraphSAGE

    from benchmarks.parts.step.rows import BareModule
    from lightning_zerocopy import models

    features, classes = dims
    hidden = args.hidden or spec.hidden
    pl.seed_everything(args.seed, verbose=False)
    if row.kind == "ours":
        optimizer = functools.partial(torch.optim.Adam, lr=args.lr, **({"fused": True} if row.fused else {}))
        return models.GraphSAGE(features, classes, hidden_channels=hidden, num_layers=spec.layers, trim=row.trim,
                                compile=row.compile, optimizer=optimizer)  # fmt: skip
    return BareModule(PyGGraphSAGE(features, hidden, spec.layers, classes, dropout=0.5), args.lr, row.trim)


def _train(row: RowSpec, module: Any, staged: list[Any], steps: int, args: argparse.Namespace, device: torch.device,
           profiler: Any = None) -> dict[str, Any]:  # fmt: skip
    """``steps`` training steps of ``module`` on the staged batches, cycled, as ``row`` says; the timer's figures.
    ``profiler`` (a :class:`~benchmarks.parts.step.profiling.StepProfiler`) is told the start of every step."""
    import pytorch_lightning as pl

    from benchmarks.end_to_end.train import StagedBatches
    from benchmarks.parts.step.rows import StepTimer, e2e_callbacks, plain_loop
    from lightning_zerocopy.callbacks import DataTelemetry

    loader = StagedBatches(staged, steps)
    if row.kind == "plain":
        return plain_loop(module.net, loader, args.lr, row.bf16, device, args.warmup,
                          on_step_start=None if profiler is None else profiler.step_start)  # fmt: skip
    timer = StepTimer(device, args.warmup)
    callbacks = [timer, *([DataTelemetry(prog_bar=False)] if row.telemetry else [])]
    if profiler is not None:
        from benchmarks.parts.step.profiling import ProfileSteps

        callbacks.insert(0, ProfileSteps(profiler))
    with tempfile.TemporaryDirectory(prefix="lzc-step-") as root:
        logger: Any = False
        if row.e2e:  # what benchmarks.end_to_end's rows add: a CSVLogger and its training clock
            logger, extra = e2e_callbacks(root, args.warmup, device)
            callbacks += extra
        trainer = pl.Trainer(
            accelerator="gpu" if device.type == "cuda" else "cpu", devices=[device.index or 0] if device.type == "cuda" else 1,
            precision="bf16-mixed" if row.bf16 else "32-true", max_steps=steps, limit_val_batches=0,
            num_sanity_val_steps=0, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, callbacks=callbacks, default_root_dir=root,
        )  # fmt: skip
        trainer.fit(module, train_dataloaders=loader)
    return timer.result()


def _check_losses(runs: list[dict[str, Any]]) -> None:
    """Flag rows whose first-batch loss differs from the plain loop's (same weights, same batch)."""
    ref = next((r["initial_loss"] for r in runs if r["row"] == "plain" and r["status"] == "ok"), None)
    for r in runs:
        if r["status"] != "ok" or ref is None:
            continue
        rel = abs(r["initial_loss"] - ref) / max(abs(ref), 1e-12)
        r["initial_loss_rel_diff"] = rel
        r["initial_loss_ok"] = rel <= LOSS_TOLERANCE[ROWS[r["row"]].bf16]


# ---------------------------------------------------------------------------------------------- the run
def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"--device {name}: no CUDA device here (use --device cpu)")
        device = torch.device("cuda", device.index or 0)
    return device


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Prepare the graph, stage each model's batches, run every row on them, write the JSON and the report."""
    from benchmarks.end_to_end.train import stage_batches
    from lightning_zerocopy import SyntheticGraph, ZeroCopyDataModule

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = _device(args.device)
    gen_device = device.type if args.gen_device == "auto" else args.gen_device
    out = os.path.abspath(args.out)
    public = {k: v for k, v in vars(args).items() if k not in ("row_list", "model_list")}
    results: dict[str, Any] = {"meta": machine_info(REPO_ROOT, args.cache_dir, args.commit), "args": public,
                               "command": " ".join(["python", "-m", "benchmarks.parts.step", *sys.argv[1:]]),
                               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                               "rows": {r.name: r.doc for r in args.row_list}, "models": {}, "runs": []}  # fmt: skip
    dataset = SyntheticGraph(**graph_kwargs(args, gen_device))
    t0 = time.perf_counter()
    dataset.prepare()
    meta = dataset.cache.meta()
    results["graph"] = {"num_nodes": meta["num_nodes"], "num_edges": meta["num_edges"], "num_features": meta["num_features"],
                        "cache": str(dataset.cache.path), "prepare_s": time.perf_counter() - t0}  # fmt: skip
    print(f"step: graph {meta['num_nodes']:,} nodes, {meta['num_edges']:,} edges ({time.perf_counter() - t0:.1f} s)", flush=True)
    if args.prepare_only:
        write_json(os.path.join(out, "results.json"), results, default=str)
        return results
    for name in args.model_list:
        spec = MODELS[name]
        dm = ZeroCopyDataModule(dataset, fanouts=list(spec.fanouts), batch_size=args.batch_size, drop_last=True,
                                seed=args.seed, sampler_placement="cpu", gather="cpu")  # fmt: skip
        dm.prepare_data()
        dm.setup("fit")
        try:
            t0 = time.perf_counter()
            staged = stage_batches(dm, args.stage_batches, device)
            stage_s = time.perf_counter() - t0
        finally:
            dm.teardown("fit")
        results["models"][name] = {
            "hidden": spec.hidden, "layers": spec.layers, "fanouts": list(spec.fanouts), "staged_batches": len(staged),
            "stage_s": stage_s, "nodes_per_batch": statistics.mean(b.num_nodes for b in staged),
            "edges_per_batch": statistics.mean(b.edge_index.size(1) for b in staged),
            "feature_MB_per_batch": statistics.mean(b.x.numel() * b.x.element_size() for b in staged) / 1e6,
        }  # fmt: skip
        runs = []
        for row in args.row_list:
            base = {"row": row.name, "model": name}
            try:
                runs.append({**base, "status": "ok", **run_row(row, spec, staged, (meta["num_features"], meta["num_classes"]), args, device)})
            except Exception as exc:  # noqa: BLE001 - one broken row must not lose the others' results
                runs.append({**base, "status": "error", "reason": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()[-4000:]})  # fmt: skip
            print("step: " + _one_line(runs[-1]), flush=True)
        _check_losses(runs)
        results["runs"] += runs
        del staged
        if device.type == "cuda":
            torch.cuda.empty_cache()
        write_json(os.path.join(out, "results.json"), results, default=str)
    write_json(os.path.join(out, "results.json"), results, default=str)
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
        f.write(render(results))
    if args.profile:
        from benchmarks.parts.step.profiling import render_profile

        profiles = [{"row": r["row"], "model": r["model"], "median_ms": r["median_ms"], **r["profile"]}
                    for r in results["runs"] if "profile" in r]  # fmt: skip
        write_json(os.path.join(out, "profile.json"), {"command": results["command"], "device": results["device"],
                                                       "meta": results["meta"], "profiles": profiles}, default=str)  # fmt: skip
        with open(os.path.join(out, "profile.md"), "w", encoding="utf-8") as f:
            f.write(render_profile(results))
    print(f"step: wrote results.json and report.md{' and profile.*' if args.profile else ''} in {out}", flush=True)
    return results


def _one_line(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return f"{r['model']:<6} {r['row']:<20} {r['status']}: {r['reason']}"
    return f"{r['model']:<6} {r['row']:<20} {r['median_ms']:8.3f} ms/step (median), mean {r['mean_ms']:.3f}, loss {r['initial_loss']:.4f}"


def render(results: dict[str, Any]) -> str:
    """The markdown report: ms per step by row and model, each against the bare module of the same model."""
    meta, models = results["meta"], list(results["models"])
    runs = {(r["row"], r["model"]): r for r in results["runs"]}
    lines = [
        "# Training step on pre-staged batches", "",
        f"`{results['command']}`; {results['device']}, torch {meta['torch']}, PyG {meta['torch_geometric']}, "
        f"pytorch_lightning {meta['pytorch_lightning']}; lightning-zerocopy commit {meta['commit']}; {meta['date']}.", "",
        f"Graph: {results['graph']['num_nodes']:,} nodes, {results['graph']['num_edges']:,} edges, "
        f"{results['graph']['num_features']} fp32 features; batch size {results['args']['batch_size']}; "
        f"{results['args']['warmup']} warm-up + {results['args']['steps']} timed steps per row.", "",
    ]  # fmt: skip
    for m in models:
        info = results["models"][m]
        lines.append(f"- `{m}`: SAGE {info['layers']}x{info['hidden']}, fanouts {info['fanouts']}; a batch has "
                     f"{info['nodes_per_batch']:,.0f} nodes, {info['edges_per_batch']:,.0f} edges, "
                     f"{info['feature_MB_per_batch']:.1f} MB of features ({info['staged_batches']} batches staged)")  # fmt: skip
    header = "| row | " + " | ".join(f"{m} ms/step | × bare" for m in models) + " | what |"
    lines += ["", "ms per step: median of start-to-next-start intervals. × bare, same model and run: a `bare_*` "
              "row against `bare` (what trimming and bf16 give); every other row against the bare LightningModule "
              "with its trimming and precision (`bare`, `bare_trim`, `bare_bf16` or `bare_trim_bf16`: the overhead).", "", header, "|---|" + "---:|---:|" * len(models) + "---|"]  # fmt: skip
    flagged = []
    for row, doc in results["rows"].items():
        cells = []
        for m in models:
            r, bare = runs.get((row, m)), runs.get((_bare_of(row), m))
            if r is None or r["status"] != "ok":
                cells += [r["status"] if r else "—", ""]
                continue
            ratio = f"{r['median_ms'] / bare['median_ms']:.2f}" if bare and bare["status"] == "ok" else ""
            cells += [f"{r['median_ms']:.2f}", ratio]
            if r.get("initial_loss_ok") is False:
                flagged.append(f"{row} ({m}): first-batch loss {r['initial_loss']:.5f} vs the plain loop's, "
                               f"relative difference {r['initial_loss_rel_diff']:.2e}")  # fmt: skip
        lines.append(f"| `{row}` | " + " | ".join(cells) + f" | {doc} |")
    errors = [f"- `{r['row']}` ({r['model']}): {r['reason']}" for r in results["runs"] if r["status"] != "ok"]
    lines += ["", "Every row starts from the same weights; its first-batch loss (eval mode) "
              + ("differs from the plain loop's in: " + "; ".join(flagged) if flagged else "matches the plain loop's "
                 f"(relative {LOSS_TOLERANCE[False]:g} in fp32, {LOSS_TOLERANCE[True]:g} in bf16).")]  # fmt: skip
    if errors:
        lines += ["", "Rows that failed:", *errors]
    return "\n".join(lines) + "\n"


def _bare_of(row: str) -> str:
    """What ``row`` is judged against: the bare row that computes what it computes (same trimming, same precision);
    the bare rows against the plain ``bare`` (what trimming and bf16 give)."""
    spec = ROWS[row]
    if spec.kind == "bare":
        return "bare"
    return "bare" + ("_trim" if spec.trim else "") + ("_bf16" if spec.bf16 else "")


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    if args.list:
        for row in ROWS.values():
            print(f"{row.name:<20}{row.doc}")
        return
    run(args)


if __name__ == "__main__":
    main()
