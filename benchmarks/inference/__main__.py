"""Exact layer-wise inference over every node against PyG's ``BasicGNN.inference`` and our sampled ``predict``.

Every row (``--configs``; ``--list`` names them, :mod:`benchmarks.inference.rows` describes them) computes the
logits of every node of one cached ``SyntheticGraph`` with the same GraphSAGE, in a process of its own: ``ours``
(``predict_mode: layerwise``), ``pyg`` / ``pyg_cached`` (``BasicGNN.inference`` over ``NeighborLoader([-1])``, best
worker count of a short sweep) and ``sampled`` (our sampled predict, extrapolated from ``--sampled-batches``).
Models: ``light`` (SAGE 2x128) and ``heavy`` (SAGE 3x256). It reports the time of a pass over every node, per layer
with the bytes of input rows read and their GB/s, ours x PyG and ours x sampled, and the largest difference between
our logits and PyG's on ``--probe-nodes`` nodes. Output folder: ``results.json``, ``report.md``, ``logs/<row>.log``.

Examples::

    python -m benchmarks.inference --preset ci --out /tmp/inference-ci              # CPU rows, seconds (smoke test)
    python -m benchmarks.inference --preset 24m --pyg-site /tmp/pygsite --out results/inference-24m
    python -m benchmarks.inference --report-only results/inference-24m
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks.common.results import write_json  # noqa: E402
from benchmarks.common.row_runs import child_main, out_dir, run_rows, start_results, use_pyg_site  # noqa: E402
from benchmarks.common.rows import pick_rows  # noqa: E402
from benchmarks.inference import report  # noqa: E402
from benchmarks.inference.rows import MODELS, PRESETS, ROWS, one_line  # noqa: E402


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.inference", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--preset", choices=sorted(PRESETS), default="ci", help="graph size and batch sizes (flags below override it)")
    p.add_argument("--configs", help=f"comma-separated of {list(ROWS)} or 'all' (default: the preset's)")
    p.add_argument("--models", help=f"comma-separated of {list(MODELS)} (default: the preset's)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda where a GPU is")
    p.add_argument("--out", help="output folder (default: results/inference-<preset>)")
    p.add_argument("--report-only", metavar="DIR", help="re-render DIR/report.md from DIR/results.json")
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    p.add_argument("--pyg-site", metavar="DIR", help="a folder with pyg-lib or torch-sparse, first on every row's path")
    p.add_argument("--commit", default=os.environ.get("GPU_CHECK_COMMIT"), help="the tree's commit where it is no checkout")
    g = p.add_argument_group("graph (SyntheticGraph, cached under --cache-dir)")
    g.add_argument("--num-nodes", type=int)
    g.add_argument("--avg-degree", type=float)
    g.add_argument("--features", type=int)
    g.add_argument("--classes", type=int)
    g.add_argument("--homophily", type=float, default=0.8)
    g.add_argument("--feature-signal", type=float, default=0.1)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--cache-dir", help="dataset cache root (default $LIGHTNING_ZEROCOPY_CACHE or ~/.cache/lightning_zerocopy)")
    r = p.add_argument_group("rows")
    r.add_argument("--batch-size", type=int, help="destination nodes per one-hop batch (ours and PyG's)")
    r.add_argument("--ours-batch-size", type=int, help="ours: destination nodes per batch (default: the preset's)")
    r.add_argument("--sampler-placement", choices=("cpu", "uva", "gpu", "hybrid", "auto"), default="cpu",
                   help="ours and sampled: the DataModule's sampler_placement (PyG samples on the CPU)")
    r.add_argument("--max-batch-edges", type=int, default=2_000_000, help="ours: in-edges per batch at most")
    r.add_argument("--storage", choices=("auto", "host", "gpu"), default="auto", help="ours: where a layer's outputs stay")
    r.add_argument("--layerwise-dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="ours: the dtype a layer's outputs are stored in")  # fmt: skip
    r.add_argument("--sampled-batch-size", type=int, help="sampled: seeds per batch")
    r.add_argument("--sampled-batches", type=int, help="sampled: batches run (the time over all nodes is extrapolated)")
    r.add_argument("--pyg-workers", help="PyG: worker counts to sweep, comma-separated (the best runs the pass)")
    r.add_argument("--sweep-batches", type=int, default=20, help="PyG: batches timed per worker count")
    r.add_argument("--probe-nodes", type=int, default=512, help="nodes whose logits ours and PyG's are compared on")
    r.add_argument("--threads", type=int, help="torch / sampler threads per row process (0: their defaults)")
    r.add_argument("--row-timeout-s", type=float)
    p.add_argument("--_run", help=argparse.SUPPRESS)
    p.add_argument("--_spec", help=argparse.SUPPRESS)
    p.add_argument("--_result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    preset = PRESETS[args.preset]
    for field, value in vars(preset).items():
        if getattr(args, field, None) is None:
            setattr(args, field, value)
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        p.error(f"--models: unknown {unknown}; known: {list(MODELS)}")
    return args


def graph_kwargs(args: argparse.Namespace) -> dict:
    """SyntheticGraph's arguments (the e2e benchmark's, so a graph drawn there is reused from the cache)."""
    return dict(num_nodes=args.num_nodes, avg_degree=args.avg_degree, num_features=args.features,
                num_classes=args.classes, homophily=args.homophily, feature_signal=args.feature_signal,
                seed=args.seed, device=args.device, cache_dir=args.cache_dir)  # fmt: skip


def _prepare(args: argparse.Namespace) -> dict:
    from lightning_zerocopy import SyntheticGraph

    from benchmarks.inference.rows import graph_summary

    kwargs = graph_kwargs(args)
    t0 = time.perf_counter()
    dataset = SyntheticGraph(**kwargs)
    dataset.prepare()
    return {"kwargs": kwargs, "prepare_s": time.perf_counter() - t0, **graph_summary(dataset)}


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args._spec:
        child_main(args, ROWS, _prepare, "benchmarks.inference.rows")
        return 0
    if args.list:
        for row in ROWS.values():
            print(f"{row.name:12s} {row.doc}")
        return 0
    if args.report_only:
        folder = args.out or args.report_only
        with open(os.path.join(args.report_only, "results.json")) as f:
            results = json.load(f)
        print(report.write(results, folder))
        return 0
    use_pyg_site(args.pyg_site)
    rows = pick_rows(args.configs, ROWS, "--configs")
    out = out_dir(args, "inference")
    start = time.monotonic()
    results = start_results(args, rows, REPO_ROOT, "benchmarks.inference")
    from benchmarks.common.sessions import forward_stop_signals, run_script

    forward_stop_signals()
    graph, why = run_script(os.path.abspath(__file__), ["--_run=prepare"], {"args": args, "kwargs": None},
                            os.path.join(out, "logs", "prepare.log"), args.row_timeout_s, REPO_ROOT)  # fmt: skip
    if graph is None:
        print(f"the graph could not be prepared: {why}", file=sys.stderr)
        return 1
    results["graph"] = graph
    print(f"graph: {graph['num_nodes']:,} nodes, {graph['num_edges']:,} edges, {graph['features_gb']:.2f} GB of "
          f"features ({graph['prepare_s']:.0f} s)", flush=True)  # fmt: skip
    try:
        run_rows(rows, args, results, out, start, script=os.path.abspath(__file__), repo_root=REPO_ROOT,
                 label="inference", one_line=one_line, precheck=lambda row: None, prefix=lambda row: None)  # fmt: skip
    finally:
        write_json(os.path.join(out, "results.json"), results, default=str)
        print(report.write(results, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
