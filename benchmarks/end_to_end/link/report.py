"""``report.md`` and ``link.png`` of a link-prediction benchmark run, from its ``results.json`` alone.

Re-render anywhere with ``python -m benchmarks.end_to_end.link --report-only DIR``; without matplotlib the report is written
and says how to render the plot.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from benchmarks.end_to_end import one_model_report as parts
from benchmarks.end_to_end.report import _fmt, _named
from benchmarks.end_to_end.results import finished as _ok
from benchmarks.end_to_end.results import share_label
from benchmarks.common.results import plots_or_note, read_results

__all__ = ["one_line", "render", "target_auroc"]

_AIM = 3.0  # issue 21: best row vs PyG's LinkNeighborLoader, steps/s on one H200


def target_auroc(results: dict[str, Any]) -> Optional[float]:
    """``--target-auroc``, else 95 % of the lowest best validation AUROC among the finished rows."""
    return parts.target(results, "target_auroc", "best_val_auroc")


def one_line(run: dict[str, Any]) -> str:
    """A console line for one row."""

    def figures(r: dict[str, Any]) -> str:
        share = share_label(r) + "  " if share_label(r) else ""
        return (f"{share}{r['steps_per_s']:8.2f} steps/s  stall {_fmt(r.get('stall_frac'), '.1%')}  best val AUROC "
                f"{_fmt(r.get('best_val_auroc'), '.3f')}")  # fmt: skip

    return parts.console_line(run, 17, figures)


def _table(results: dict[str, Any]) -> list[str]:
    return parts.results_table(results, metric="AUROC", metric_words="AUROC", best="best_val_auroc",
                               target=target_auroc(results), rate=".1f")  # fmt: skip


def _aim(results: dict[str, Any]) -> list[str]:
    runs = {r["row"]: r for r in results.get("runs", []) if _ok(r)}
    ours = [r for r in runs.values() if r.get("kind") == "ours" and r.get("batch_check", {}).get("ok", True)]
    if not ours:
        return ["- No row of ours finished."]
    best = max(ours, key=lambda r: r["steps_per_s"])
    lines = [f"- Best row of ours: {_named(best)} at {best['steps_per_s']:.1f} steps/s, best val AUROC "
             f"{_fmt(best.get('best_val_auroc'), '.3f')}."]  # fmt: skip
    pyg = runs.get("pyg")
    if pyg:
        ratio = best["steps_per_s"] / pyg["steps_per_s"]
        lines.append(f"- vs PyG LinkNeighborLoader ({pyg.get('pyg_workers')} workers, {pyg['steps_per_s']:.1f} steps/s, "
                     f"best val AUROC {_fmt(pyg.get('best_val_auroc'), '.3f')}): {ratio:.2f}× (aim ≥ {_AIM:.0f}× on one "
                     f"H200: {'met' if ratio >= _AIM else 'missed'}).")  # fmt: skip
    else:
        lines.append("- vs PyG: not measured in this run (see the `pyg` row's status).")
    return lines


def write_report(results: dict[str, Any], out_dir: str, plot_note: str) -> str:
    """Write ``report.md``; returns its path."""
    graph, args = results.get("graph", {}), results.get("args", {})
    lines = ["# Link prediction: lightning-zerocopy vs PyG LinkNeighborLoader", "",
             *parts.machine_lines(results),
             f"- Graph (SyntheticLinkGraph over SyntheticGraph, preset `{args.get('preset')}`): {graph.get('num_nodes', 0):,} "
             f"nodes, {graph.get('num_edges', 0):,} message-passing edges, {graph.get('num_features')} fp32 features "
             f"({_fmt(graph.get('feature_GB'), '.2f')} GB, host memory); splits {graph.get('splits')}",
             f"- Training: LinkPredictor (GraphSAGE h{args.get('hidden')}, fanouts {args.get('fanouts')}, dot decoder, BCE), "
             f"{args.get('batch_size')} positives per step + {args.get('neg_ratio')} random negatives per positive, up to "
             f"{args.get('steps')} steps (warm-up {args.get('warmup')}), validation every {args.get('val_every')} steps on "
             f"{args.get('val_batches')} batches of positives with their fixed negatives, Adam lr {args.get('lr')}, seed "
             f"{args.get('seed')}",
             "", "Steps/s: steady state after warm-up, training time only (host timer between device syncs, validation "
             "excluded). Stall and host wait: `DataTelemetry` (the GPU's idle gap before each step / host time between "
             "steps). Time to target: training seconds at the first validation at or above the target AUROC. Batches "
             "checked: the first training batches against the dataset (`x` rows, label edges in range, positives are "
             "train edges, negatives ratio).", ""]  # fmt: skip
    lines += parts.row_docs(results)
    lines += ["## Results", ""] + _table(results) + parts.build_stage_lines(results)
    lines += ["## Aim", ""] + _aim(results) + ["", "## Plot", ""]
    lines.append(plot_note or "![steps/s, validation AUROC over training time, stall](link.png)")
    return parts.write_report_lines(out_dir, lines)


def write_plot(results: dict[str, Any], out_dir: str) -> str:
    """``link.png``: steps/s per row, validation AUROC over training time, stall share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results.get("runs", []) if _ok(r)]
    names = [r["row"] for r in runs]
    colors = ["tab:gray" if n in ("pyg", "model_only") else "tab:blue" for n in names]
    fig, (rate, auroc, stall) = plt.subplots(1, 3, figsize=(17, 4.8))
    rate.barh(names, [r["steps_per_s"] for r in runs], color=colors)
    rate.set_xlabel("training steps/s")
    for r in runs:
        curve = r.get("val_curve") or []
        if curve:
            auroc.plot([c[1] for c in curve], [c[2] for c in curve], marker="o", markersize=3, label=r["row"])
    target = target_auroc(results)
    if target is not None:
        auroc.axhline(target, color="black", linestyle=":", label=f"target {target:.3f}")
    auroc.set_xlabel("training wall time, s")
    auroc.set_ylabel("validation AUROC")
    auroc.legend(fontsize=7)
    stall.barh(names, [100.0 * (r.get("stall_frac") or 0.0) for r in runs], color=colors)
    stall.set_xlabel("stall, % of the step interval")
    for ax in (rate, stall):
        ax.invert_yaxis()
    fig.suptitle("link prediction: lightning-zerocopy rows (blue) vs PyG LinkNeighborLoader and model-only (gray)")
    fig.tight_layout()
    path = os.path.join(out_dir, "link.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render(out_dir: str) -> list[str]:
    """Write ``report.md`` and ``link.png`` from ``out_dir/results.json``; returns the files written.

    Raises:
        FileNotFoundError: no ``results.json`` in ``out_dir``.
    """
    results = read_results(out_dir)
    plots, note = plots_or_note(lambda: [write_plot(results, out_dir)], "Plot", "benchmarks.end_to_end.link", out_dir)
    return [write_report(results, out_dir, note), *plots]
