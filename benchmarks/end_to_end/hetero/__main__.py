"""Heterogeneous node classification end to end against PyG's hetero NeighborLoader: steps/s, time to accuracy, stall.

Every row (a data path, picked by name with ``--configs``; ``--list`` shows them) trains the same
``HeteroNodeClassifier`` (a SAGEConv per relation, or R-GAT with ``--conv gat``; same seed, so the same initial
weights) through Lightning's ``Trainer`` on the same ``SyntheticHeteroGraph`` (ogbn-mag's shape: papers with features
and labels, authors, institutions and fields of study embedded from their ids; cached on disk), with the same fanouts
for every edge type and the same seeds per step count, in a process of its own (MPS rows start through the MPS
launcher). PyG's row runs ``NeighborLoader`` over a ``HeteroData`` with its best worker count of a short sweep and
``pin_memory``; ``model_only`` trains on batches our CPU builder made before training, moved to the device: the
compute bound. Each row also gives the time of an ogbn-mag-sized epoch (629,571 training papers, batch 1024: 615
steps) at its steady rate. Rows whose feature is missing from this build or machine are reported as skipped.

Output folder (``--out``): ``results.json`` (rewritten after every row), ``report.md`` and ``logs/<row>.log``;
``--report-only DIR`` re-renders the report from the JSON.

Examples::

    python -m benchmarks.end_to_end.hetero --list
    python -m benchmarks.end_to_end.hetero --preset ci --out /tmp/hetero-ci             # tiny graph, CPU rows (CI)
    python -m benchmarks.end_to_end.hetero --prepare-only                               # draw and cache the 10x-MAG graph
    python -m benchmarks.end_to_end.hetero --pyg-site /tmp/pygsite --out results/hetero-mag10x   # one GPU, default rows
    python -m benchmarks.end_to_end.hetero --report-only results/hetero-mag10x
"""

from __future__ import annotations

import argparse
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
from benchmarks.common.results import write_json  # noqa: E402
from benchmarks.end_to_end.hetero import report as hetero_report  # noqa: E402
from benchmarks.end_to_end.rows import MPS_PIPELINE, ZC_GPU_DATA, Row, _precheck, mps_prefix, one_model_rows, parse_share  # noqa: E402

_CACHED = Row("zerocopy_ddp_mps", "ours", "as zc_gpu_mps, under ZeroCopyDDPStrategy on one GPU with --cache-budget: "
              "the hot feature rows of each featured type cached in GPU memory (fewer zero-copy reads beside training)",
              ZC_GPU_DATA, pipeline=MPS_PIPELINE,
              strategy=("lightning_zerocopy.strategies.ZeroCopyDDPStrategy", {"cache_budget": "cache_budget"}))  # fmt: skip

#: Every row by name, in the report's order: the one-model rows, then a one-GPU cache of hot rows per node type.
ROWS: dict[str, Row] = {**one_model_rows("NeighborLoader over a HeteroData"), _CACHED.name: _CACHED}


@dataclass(frozen=True, kw_only=True)
class Preset(cli.OneModelPreset):
    """The graph of a named run (its training and measuring: :class:`~benchmarks.common.cli.OneModelPreset`)."""

    papers: int
    authors: int
    institutions: int
    fields: int
    features: int


PRESETS: dict[str, Preset] = {
    # about 10x ogbn-mag (736k papers, 1.13M authors, 8.7k institutions, 60k fields): 19.4M nodes, 3.8 GB of fp32
    # paper features; one GPU, features in host memory; fanouts and width of PyG's ogbn-mag example
    "mag10x": Preset(1024, "10,10", 64, 700, 60, 100, 8, 120.0, 900.0, "model_only,pyg,zc_gpu_mps,zc_gpu", "4,8,12", 0,
                     papers=7_363_890, authors=11_346_490, institutions=87_400, fields=599_650, features=128),  # fmt: skip
    # ogbn-mag's own counts: the aim's "ogbn-mag-sized epoch" measured on a graph of that size (the learned embeddings
    # of the featureless types, updated every step, are 10x smaller than at mag10x); the graph fits the GPU too
    "mag": Preset(1024, "10,10", 64, 700, 60, 100, 8, 60.0, 600.0, "model_only,pyg,zc_gpu_mps", "4,8,12", 0,
                  papers=736_389, authors=1_134_649, institutions=8_740, fields=59_965, features=128),  # fmt: skip
    # CI: a tiny graph, CPU rows, one thread per row process (a shared two-core box)
    "ci": Preset(64, "5,5", 32, 16, 4, 8, 2, 30.0, 300.0, "pyg,cpu,model_only,zc_gpu", "0", 1,
                 papers=3_000, authors=4_000, institutions=60, fields=200, features=16),  # fmt: skip
}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = COMMAND.parser(__doc__, "mag10x", "re-render report.md from DIR/results.json")
    p.add_argument("--prepare-only", action="store_true", help="draw and cache the graph, then stop")
    g = p.add_argument_group("graph (SyntheticHeteroGraph, MAG-shaped, cached under --cache-dir)")
    g.add_argument("--papers", type=int, help="papers (features, labels, splits)")
    g.add_argument("--authors", type=int)
    g.add_argument("--institutions", type=int)
    g.add_argument("--fields", type=int, help="fields of study")
    g.add_argument("--features", type=int, help="fp32 paper feature width")
    g.add_argument("--classes", type=int, default=32, help="planted paper classes")
    g.add_argument("--cache-dir", help="dataset cache root (default $LIGHTNING_ZEROCOPY_CACHE or ~/.cache/lightning_zerocopy)")
    t = p.add_argument_group("training and measuring")
    t.add_argument("--batch-size", type=int, help="seed papers per step")
    t.add_argument("--num-neighbors", help="fanouts per hop, comma-separated, the same for every edge type")
    t.add_argument("--conv", choices=("sage", "gat"), default="sage", help="HeteroNodeClassifier's conv (gat: R-GAT)")
    t.add_argument("--hidden", type=int, help="HeteroNodeClassifier width (layers: one per fanout)")
    t.add_argument("--cache-budget", default="20%", help="zerocopy_ddp_mps: the Strategy's cache_budget")
    t.add_argument("--feature-dtype", choices=("float32", "bfloat16", "float16"), help="our rows: the host feature "
                   "tables' dtype (ZeroCopyHeteroDataModule(feature_dtype=...): half the bytes over PCIe; x stays "
                   "float32); default: the graph's fp32. PyG and model-only keep fp32")  # fmt: skip
    cli.add_step_arguments(t)
    cli.add_target_argument(t, "acc", "accuracy")
    cli.add_measuring_arguments(t, "NeighborLoader", stage_batches=64, parse_share=parse_share)
    return COMMAND.parse(p, argv, ("papers", "authors", "institutions", "fields", "features", "batch_size", "hidden",
                                   "steps", "val_every", "val_batches", "classes"))  # fmt: skip


def select_rows(configs: str) -> list[Row]:
    """The rows named in a comma-separated list (``all``: every row), in the order given."""
    return COMMAND.select_rows(configs)


def dataset_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``SyntheticHeteroGraph`` arguments (the same in every row, so all load one cache)."""
    return dict(num_papers=args.papers, author_ratio=args.authors / args.papers,
                institution_ratio=args.institutions / args.papers, field_ratio=args.fields / args.papers,
                num_features=args.features, num_classes=args.classes, seed=args.seed,
                cache_dir=args.cache_dir)  # fmt: skip


def _prepare(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.end_to_end.hetero.train import build_dataset

    kwargs = dataset_kwargs(args)
    dataset = build_dataset(kwargs)
    t0 = time.perf_counter()
    data = dataset.load()
    feature_bytes = sum(x.numel() * x.element_size() for x in data.x.values())
    return {"kwargs": kwargs, "prepare_s": time.perf_counter() - t0, "num_nodes": dict(data.num_nodes),
            "num_edges": {"__".join(e): int(i.size(1)) for e, i in data.edge_index.items()},
            "num_features": {t: int(x.size(1)) for t, x in data.x.items()}, "feature_GB": feature_bytes / 1e9,
            "input_type": data.input_type, "splits": {s: int(data.split(s).numel()) for s in ("train", "val", "test")}}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Prepare the graph, run every selected row in its own process, write the JSON and the report."""
    rows, out, results, start = COMMAND.start(args, mag_epoch_steps=hetero_report.mag_epoch_steps())
    total = args.papers + args.authors + args.institutions + args.fields
    print(f"hetero: preparing the graph ({total:,} nodes, {args.papers:,} papers)", flush=True)
    results["graph"] = graph = COMMAND.prepare_graph(args, out)
    print(f"hetero: {graph['num_nodes']} nodes, {sum(graph['num_edges'].values()):,} edges, splits {graph['splits']}", flush=True)
    if args.prepare_only:
        write_json(os.path.join(out, "results.json"), results, default=str)
        return results
    COMMAND.run_rows(rows, args, results, out, start)
    return results


COMMAND = OneModelCommand(
    label="hetero", module="benchmarks.end_to_end.hetero", script=__file__, repo_root=REPO_ROOT, rows=ROWS, presets=PRESETS,
    prepare=_prepare, train_module="benchmarks.end_to_end.hetero.train", render=lambda out: [hetero_report.render(out)],
    one_line=hetero_report.one_line, precheck=_precheck, prefix=mps_prefix,
)


def main(argv: Optional[list[str]] = None) -> None:
    COMMAND.main(parse_args(argv), run)


if __name__ == "__main__":
    main()
