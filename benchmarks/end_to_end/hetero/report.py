"""``report.md`` of a heterogeneous benchmark run, from its ``results.json`` alone (``--report-only DIR``)."""

from __future__ import annotations

from typing import Any, Optional

from benchmarks.common.results import read_results
from benchmarks.end_to_end import one_model_report as parts
from benchmarks.end_to_end.report import _fmt, _named

__all__ = ["MAG_BATCH", "MAG_TRAIN_PAPERS", "mag_epoch_steps", "one_line", "render", "target_acc"]

#: ogbn-mag's training papers and the batch size of PyG's and OGB's examples
MAG_TRAIN_PAPERS, MAG_BATCH = 629_571, 1024


def mag_epoch_steps() -> int:
    """Steps of an ogbn-mag-sized epoch: 629,571 training papers in batches of 1024 (the last one partial): 615."""
    return -(-MAG_TRAIN_PAPERS // MAG_BATCH)


def target_acc(results: dict[str, Any]) -> Optional[float]:
    """``--target-acc``, else 95 % of the lowest best validation accuracy among the finished rows."""
    return parts.target(results, "target_acc", "best_val_acc")


def one_line(run: dict[str, Any]) -> str:
    """A console line for one row."""
    return parts.console_line(run, 12, lambda r: f"{r['steps_per_s']:8.2f} steps/s  stall {_fmt(r.get('stall_frac'), '.1%')}  "
                              f"best val acc {_fmt(r.get('best_val_acc'), '.3f')}  MAG epoch {_fmt(r.get('mag_epoch_s'), '.1f')} s")  # fmt: skip


def _table(results: dict[str, Any]) -> list[str]:
    def name(r: dict[str, Any]) -> str:
        return _named(r) + (f" ({r['pyg_workers']} workers)" if r.get("pyg_workers") is not None else "")

    return parts.results_table(results, metric="acc", metric_words="accuracy", best="best_val_acc", target=target_acc(results),
                               name=name, extra=[("ogbn-mag epoch s", lambda r: _fmt(r.get("mag_epoch_s"), ".1f"))])  # fmt: skip


def write_report(results: dict[str, Any], out_dir: str) -> str:
    """Write ``report.md``; returns its path."""
    graph, args = results.get("graph", {}), results.get("args", {})
    nodes = graph.get("num_nodes", {}) or {}
    edges = graph.get("num_edges", {}) or {}
    lines = ["# Heterogeneous node classification: lightning-zerocopy vs PyG's hetero NeighborLoader", "",
             *parts.machine_lines(results),
             f"- Graph (SyntheticHeteroGraph, preset `{args.get('preset')}`): {sum(nodes.values()):,} nodes "
             f"({', '.join(f'{t} {n:,}' for t, n in nodes.items())}), {sum(edges.values()):,} edges over {len(edges)} "
             f"edge types; features {graph.get('num_features')} fp32 ({_fmt(graph.get('feature_GB'), '.2f')} GB, host "
             f"memory{'; our rows hold them as ' + args['feature_dtype'] if args.get('feature_dtype') else ''}); "
             f"splits {graph.get('splits')}",
             f"- Training: HeteroNodeClassifier ({args.get('conv')}, h{args.get('hidden')}, fanouts {args.get('fanouts')} "
             f"for every edge type, trimmed per hop), batch {args.get('batch_size')} seed papers, up to {args.get('steps')} "
             f"steps (warm-up {args.get('warmup')}), validation every {args.get('val_every')} steps on "
             f"{args.get('val_batches')} batches, Adam lr {args.get('lr')}, seed {args.get('seed')}",
             "", "Steps/s: steady state after warm-up, training time only (host timer between device syncs, validation "
             "excluded). Stall and host wait: `DataTelemetry`. Time to target: training seconds at the first validation "
             "at or above the target accuracy. ogbn-mag epoch: the time of "
             f"{results.get('mag_epoch_steps', mag_epoch_steps())} steps ({MAG_TRAIN_PAPERS:,} training papers, batch "
             f"{MAG_BATCH}) at the row's steady steps/s (computed, not a separate run; with this run's batch size and "
             "graph). Batches checked: the first training batches against the dataset (`x` rows, seeds and labels, "
             "edge ids in range).", ""]  # fmt: skip
    lines += parts.row_docs(results)
    lines += ["## Results", ""] + _table(results) + parts.build_stage_lines(results)
    return parts.write_report_lines(out_dir, lines)


def render(out_dir: str) -> str:
    """Write ``report.md`` from ``out_dir/results.json``; returns its path.

    Raises:
        FileNotFoundError: no ``results.json`` in ``out_dir``.
    """
    return write_report(read_results(out_dir), out_dir)
