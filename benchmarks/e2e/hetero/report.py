"""``report.md`` of a heterogeneous benchmark run, from its ``results.json`` alone (``--report-only DIR``)."""

from __future__ import annotations

import os
from typing import Any, Optional

from benchmarks.common.results import read_results
from benchmarks.e2e.report import _fmt, _named, _pct
from benchmarks.e2e.results import time_to_target

__all__ = ["MAG_BATCH", "MAG_TRAIN_PAPERS", "mag_epoch_steps", "one_line", "render", "target_acc"]

#: ogbn-mag's training papers and the batch size of PyG's and OGB's examples
MAG_TRAIN_PAPERS, MAG_BATCH = 629_571, 1024


def mag_epoch_steps() -> int:
    """Steps of an ogbn-mag-sized epoch: 629,571 training papers in batches of 1024 (the last one partial): 615."""
    return -(-MAG_TRAIN_PAPERS // MAG_BATCH)


def _ok(run: dict[str, Any]) -> bool:
    return run.get("status") == "ok" and run.get("steps_per_s") is not None


def target_acc(results: dict[str, Any]) -> Optional[float]:
    """``--target-acc``, else 95 % of the lowest best validation accuracy among the finished rows."""
    given = results.get("args", {}).get("target_acc")
    if given is not None:
        return float(given)
    best = [r["best_val_acc"] for r in results.get("runs", []) if _ok(r) and r.get("best_val_acc") is not None]
    return round(0.95 * min(best), 4) if best else None


def one_line(run: dict[str, Any]) -> str:
    """A console line for one row."""
    head = f"{run['row']:<12}"
    if not _ok(run):
        return f"{head}{run.get('status', '?')}: {str(run.get('reason', ''))[:300]}"
    check = run.get("batch_check", {})
    return (f"{head}{run['steps_per_s']:8.2f} steps/s  stall {_fmt(run.get('stall_frac'), '.1%')}  best val acc "
            f"{_fmt(run.get('best_val_acc'), '.3f')}  MAG epoch {_fmt(run.get('mag_epoch_s'), '.1f')} s  batches checked "
            f"{check.get('checked', 0)}{'' if check.get('ok', True) else ' WRONG: ' + '; '.join(check.get('problems', []))}")  # fmt: skip


def _table(results: dict[str, Any]) -> list[str]:
    runs = {r["row"]: r for r in results.get("runs", [])}
    target = target_acc(results)
    rate = {name: r["steps_per_s"] for name, r in runs.items() if _ok(r)}
    out = [f"Target validation accuracy: {_fmt(target, '.3f')}.", "",
           "| row | steps/s | × PyG | × model-only | stall | host wait ms | step p50 / p99 ms | best val acc "
           "| time to target s | ogbn-mag epoch s | setup s | batches checked |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in runs.items():
        if not _ok(r):
            reason = str(r.get("reason", "")).splitlines()[0][:160] if r.get("reason") else ""
            out.append(f"| `{name}` | {r.get('status')}: {reason} |||||||||||")
            continue
        lat, check = r.get("step_ms", []), r.get("batch_check", {})
        checked = f"{check.get('checked', 0)} ok" if check.get("ok", True) else "**WRONG**: " + "; ".join(check.get("problems", []))
        ratio = lambda ref: _fmt(r["steps_per_s"] / rate[ref] if ref in rate else None, ".2f", "×")  # noqa: E731
        workers = f" ({r['pyg_workers']} workers)" if r.get("pyg_workers") is not None else ""
        out.append("| " + " | ".join([
            _named(r) + workers, f"{r['steps_per_s']:.2f}", ratio("pyg"), ratio("model_only"), _fmt(r.get("stall_frac"), ".1%"),
            _fmt(r.get("wait_ms"), ".2f"), f"{_fmt(_pct(lat, 0.5), '.2f')} / {_fmt(_pct(lat, 0.99), '.2f')}",
            _fmt(r.get("best_val_acc"), ".3f"), _fmt(time_to_target(r, target), ".1f"), _fmt(r.get("mag_epoch_s"), ".1f"),
            _fmt(r.get("setup_s"), ".1f"), checked]) + " |")  # fmt: skip
    return out + [""]


def write_report(results: dict[str, Any], out_dir: str) -> str:
    """Write ``report.md``; returns its path."""
    meta, graph, args = results.get("meta", {}), results.get("graph", {}), results.get("args", {})
    nodes = graph.get("num_nodes", {}) or {}
    edges = graph.get("num_edges", {}) or {}
    lines = ["# Heterogeneous node classification: lightning-zerocopy vs PyG's hetero NeighborLoader", "",
             f"- Command: `{results.get('command', '?')}`",
             f"- Date: {meta.get('date')}; host {meta.get('host')}; total {_fmt(results.get('total_s'), '.0f')} s",
             f"- GPU: {meta.get('gpu') or 'none'}; CPU: {meta.get('cpu')} ({meta.get('cpu_count')} logical cores); "
             f"RAM {_fmt(meta.get('ram_gib'), '.0f')} GiB",
             f"- Software: torch {meta.get('torch')}, PyG {meta.get('torch_geometric')}, pytorch_lightning "
             f"{meta.get('pytorch_lightning')}, torch-sparse {meta.get('torch_sparse')}, pyg-lib {meta.get('pyg_lib')}; "
             f"lightning-zerocopy commit {meta.get('commit')}",
             f"- Graph (SyntheticHeteroGraph, preset `{args.get('preset')}`): {sum(nodes.values()):,} nodes "
             f"({', '.join(f'{t} {n:,}' for t, n in nodes.items())}), {sum(edges.values()):,} edges over {len(edges)} "
             f"edge types; features {graph.get('num_features')} fp32 ({_fmt(graph.get('feature_GB'), '.2f')} GB, host "
             f"memory); splits {graph.get('splits')}",
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
    lines += ["## Rows", ""] + [f"- `{name}`: {doc}" for name, doc in results.get("rows", {}).items()] + [""]
    lines += ["## Results", ""] + _table(results)
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def render(out_dir: str) -> str:
    """Write ``report.md`` from ``out_dir/results.json``; returns its path.

    Raises:
        FileNotFoundError: no ``results.json`` in ``out_dir``.
    """
    return write_report(read_results(out_dir), out_dir)
