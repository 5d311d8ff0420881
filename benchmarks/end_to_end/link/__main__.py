"""Link prediction end to end against PyG's LinkNeighborLoader on the same graph: steps/s, time to AUROC, stall.

Every row (a data path, picked by name with ``--configs``; ``--list`` shows them) trains the same
``LinkPredictor`` (GraphSAGE encoder, dot decoder, binary cross-entropy; same seed, so the same initial weights)
through Lightning's ``Trainer`` on the same ``SyntheticLinkGraph`` (a cached ``SyntheticGraph`` with held-out
val/test edges and fixed negatives), with the same positives per step and the same negatives ratio, in a process of
its own (MPS rows start through the MPS launcher). PyG's row runs ``LinkNeighborLoader`` with its best worker count
of a short sweep and ``pin_memory``; validation scores the same fixed negatives in every row (AUROC over all of them).
Rows whose feature is missing from this build or machine are reported as skipped with the reason.

Output folder (``--out``): ``results.json`` (rewritten after every row), ``report.md``, ``link.png`` and
``logs/<row>.log``; ``--report-only DIR`` re-renders the report and the plot from the JSON.

Examples::

    python -m benchmarks.end_to_end.link --preset ci --out /tmp/link-ci                 # CPU rows, seconds (CI)
    python -m benchmarks.end_to_end.link --preset gpu --pyg-site /tmp/pygsite --out results/link-gpu
    python -m benchmarks.end_to_end.link --report-only results/link-gpu
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks.common import cli  # noqa: E402
from benchmarks.common.one_model_command import OneModelCommand  # noqa: E402
from benchmarks.end_to_end.rows import CPU_DATA, MPS_PIPELINE, ZC_GPU_DATA, Row, _precheck, mps_prefix, one_model_rows, parse_share  # noqa: E402
from benchmarks.end_to_end.link import report as link_report  # noqa: E402

_SHARED = one_model_rows("LinkNeighborLoader")

#: Every row by name, in the report's order.
ROWS: dict[str, Row] = {row.name: row for row in [
    _SHARED["pyg"],
    _SHARED["cpu"],
    Row("cpu_inproc", "ours", "CPU sampler + CPU gather, PipelineCallback in-process", CPU_DATA,
        pipeline={"mode": "in_process"}, needs_cuda=False),
    Row("cpu_mps", "ours", "CPU sampler + CPU gather, PipelineCallback worker + MPS", CPU_DATA, pipeline=MPS_PIPELINE),
    _SHARED["zc_gpu"],
    _SHARED["zc_gpu_mps"],
    *[Row(f"zc_gpu_mps_{p}", "ours", f"as zc_gpu_mps, the worker's MPS share {p} % (the trainer {100 - p} %)", ZC_GPU_DATA,
          pipeline={**MPS_PIPELINE, "worker_sm_percent": p}) for p in (20, 30)],
    Row("zc_gpu_mps_auto", "ours", "as zc_gpu_mps, worker_sm_percent='auto' (10/20/30 %, calibrated while training; "
        "steps/s include the calibration)", ZC_GPU_DATA, pipeline={**MPS_PIPELINE, "worker_sm_percent": "auto"}),
    Row("zc_uva_mps", "ours", "GPU sampler over the pinned host graph, zero-copy gather, PipelineCallback worker + MPS",
        {"sampler_placement": "uva", "gather": "zerocopy"}, pipeline=MPS_PIPELINE),
    _SHARED["model_only"],
    _SHARED["model_only_mps"],
]}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Preset(cli.OneModelPreset):
    """The graph of a named run (its training and measuring: :class:`~benchmarks.common.cli.OneModelPreset`)."""

    num_nodes: int
    avg_degree: float
    features: int


PRESETS: dict[str, Preset] = {
    # CI: CPU rows on a few thousand nodes, one thread per row process (a shared two-core box)
    "ci": Preset(64, "5,5", 32, 16, 4, 8, 2, 30.0, 300.0, "pyg,cpu,model_only,zc_gpu", "0", 1,
                 num_nodes=3_000, avg_degree=8.0, features=16),  # fmt: skip
    # one GPU, features in host memory: 4M nodes, ~64M directed edges, 2 GB of fp32 features
    "gpu": Preset(1024, "10,5", 128, 400, 40, 100, 4, 45.0, 300.0, "model_only,pyg,zc_gpu_mps,zc_gpu", "4,8,12", 0,
                  num_nodes=4_000_000, avg_degree=16.0, features=128),  # fmt: skip
}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = COMMAND.parser(__doc__, "ci", "re-render report.md and the plot from DIR/results.json")
    p.add_argument("--append", action="store_true", help="keep the runs already in --out/results.json (same graph) and "
                   "add or replace this command's rows: a run split over several commands")  # fmt: skip
    g = p.add_argument_group("graph (SyntheticGraph + SyntheticLinkGraph, cached under --cache-dir)")
    g.add_argument("--num-nodes", type=int)
    g.add_argument("--avg-degree", type=float)
    g.add_argument("--features", type=int, help="fp32 feature width")
    g.add_argument("--classes", type=int, default=16, help="planted classes (homophilous edges make links learnable)")
    g.add_argument("--homophily", type=float, default=0.8)
    g.add_argument("--feature-signal", type=float, default=0.3)
    g.add_argument("--val-fraction", type=float, default=0.02, help="share of the edges held out as val positives")
    g.add_argument("--neg-per-positive", type=int, default=10, help="fixed val/test negatives per positive")
    g.add_argument("--gen-device", default="auto", help="where the graph is drawn: auto | cpu | cuda")
    g.add_argument("--cache-dir", help="dataset cache root (default $LIGHTNING_ZEROCOPY_CACHE or ~/.cache/lightning_zerocopy)")
    t = p.add_argument_group("training and measuring")
    t.add_argument("--batch-size", type=int, help="positive edges per step")
    t.add_argument("--neg-ratio", type=float, default=1.0, help="binary negatives per positive (neg_sampling_ratio)")
    t.add_argument("--num-neighbors", help="fanouts, comma-separated")
    t.add_argument("--hidden", type=int, help="GraphSAGE width (layers: one per fanout)")
    cli.add_step_arguments(t)
    cli.add_target_argument(t, "auroc", "AUROC")
    cli.add_measuring_arguments(t, "LinkNeighborLoader", stage_batches=128, parse_share=parse_share)

    def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if args.neg_ratio <= 0:
            p.error(f"--neg-ratio must be > 0 (AUROC needs negatives), got {args.neg_ratio}")

    return COMMAND.parse(p, argv, ("num_nodes", "features", "batch_size", "hidden", "steps", "val_every", "val_batches",
                                   "neg_per_positive"), check)  # fmt: skip


def select_rows(configs: str) -> list[Row]:
    """The rows named in a comma-separated list (``all``: every row), in the order given (see :func:`pick_rows`)."""
    return COMMAND.select_rows(configs)


def dataset_kwargs(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """``SyntheticGraph`` and ``SyntheticLinkGraph`` arguments (the same in every row, so all load one cache)."""
    graph = dict(num_nodes=args.num_nodes, avg_degree=args.avg_degree, num_features=args.features, num_classes=args.classes,
                 homophily=args.homophily, feature_signal=args.feature_signal, seed=args.seed, device=device,
                 cache_dir=args.cache_dir)  # fmt: skip
    return {"graph": graph, "link": dict(val_fraction=args.val_fraction, test_fraction=args.val_fraction,
                                         neg_per_positive=args.neg_per_positive, seed=args.seed)}  # fmt: skip


def _prepare(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.end_to_end.link.train import build_dataset

    kwargs = dataset_kwargs(args, args.gen_device)
    dataset = build_dataset(kwargs)
    t0 = time.perf_counter()
    data = dataset.load()
    splits = {name: {"positives": s.num_positives, "negatives": s.num_negatives} for name, s in data.splits.items()}
    return {"kwargs": kwargs, "prepare_s": time.perf_counter() - t0, "num_nodes": data.num_nodes, "num_edges": data.num_edges,
            "num_features": data.num_features, "feature_GB": data.x.numel() * data.x.element_size() / 1e9, "splits": splits}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Prepare the graph, run every selected row in its own process, write the JSON, the report and the plot."""
    rows, out, results, start = COMMAND.start(args)
    if args.gen_device == "auto":
        import torch

        args.gen_device = "cuda" if torch.version.cuda and torch.cuda.device_count() > 0 else "cpu"
    print(f"link: preparing the graph ({args.num_nodes:,} nodes, avg degree {args.avg_degree}) on {args.gen_device}", flush=True)
    # on a GPU, a CUDA context of its own, gone before any row starts (MPS rows must find no other context)
    results["graph"] = graph = COMMAND.prepare_graph(args, out, in_process=args.gen_device == "cpu")
    print(f"link: {graph['num_nodes']:,} nodes, {graph['num_edges']:,} message-passing edges, splits {graph['splits']}", flush=True)
    if args.append:
        _keep_previous(results, out, [r.name for r in rows])
    COMMAND.run_rows(rows, args, results, out, start)
    return results


def _link_precheck(row: Row) -> Optional[str]:
    """Why ``row`` cannot run here (:func:`_precheck`), naming PyG's link loader for its row."""
    why = _precheck(row)
    if why is not None and row.kind == "pyg":  # the same sampler backend serves PyG's link loader
        why = why.replace("NeighborLoader", "LinkNeighborLoader")
    return why


def _keep_previous(results: dict[str, Any], out: str, planned: list[str]) -> None:
    """``--append``: the earlier runs in ``out`` (same graph) that this command does not repeat."""
    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        previous = json.load(f)
    if previous.get("graph", {}).get("kwargs") != results["graph"]["kwargs"]:
        raise SystemExit(f"--append: {path} holds runs on another graph; use another --out or the same graph flags")
    results["runs"] = [r for r in previous.get("runs", []) if r["row"] not in planned]
    results["rows"] = {**previous.get("rows", {}), **results["rows"]}
    results["command"] = f"{previous.get('command')}; then {results['command']}"


COMMAND = OneModelCommand(
    label="link", module="benchmarks.end_to_end.link", script=__file__, repo_root=REPO_ROOT, rows=ROWS, presets=PRESETS,
    prepare=_prepare, train_module="benchmarks.end_to_end.link.train", render=link_report.render, one_line=link_report.one_line,
    precheck=_link_precheck, prefix=mps_prefix,
)


def main(argv: Optional[list[str]] = None) -> None:
    COMMAND.main(parse_args(argv), run)


if __name__ == "__main__":
    main()
