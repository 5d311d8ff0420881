"""``report.md`` of the inference benchmark (``benchmarks/inference/``) from its ``results.json``."""

from __future__ import annotations

import os
from typing import Any, Optional

from benchmarks.inference.rows import probe_diff

__all__ = ["render", "write"]


def _ok(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["row"]: r for r in results.get("runs", []) if r.get("status") == "ok"}


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{b / a:.2f}×" if a and b else "–"


def _seconds(run: Optional[dict[str, Any]]) -> str:
    if run is None:
        return "–"
    return f"{run['total_s']:.2f}" + (" (extrap.)" if run.get("extrapolated") else "")


def _layers(run: Optional[dict[str, Any]]) -> str:
    if not run or not run.get("layers"):
        return "–"
    return " / ".join(f"{layer['seconds']:.2f} s, {layer['gb_per_s']:.1f} GB/s"
                      + (f", sampler {layer['sample_s']:.2f} s" if "sample_s" in layer else "") for layer in run["layers"])


def render(results: dict[str, Any]) -> str:
    """The report: the machine and command, then per model the rows' times, per-layer figures and the ratios."""
    meta, graph, runs = results.get("meta", {}), results.get("graph", {}), _ok(results)
    lines = ["# Layer-wise inference over every node: ours vs PyG's BasicGNN.inference and our sampled predict", "",
             f"- Command: `{results.get('command', '')}`",
             f"- Date: {meta.get('date')}; GPU: {meta.get('gpu')}; CPU: {meta.get('cpu')} ({meta.get('cpu_count')} "
             f"logical cores); RAM {meta.get('ram_gib') or 0:.0f} GiB",
             f"- Software: torch {meta.get('torch')}, PyG {meta.get('torch_geometric')}, torch-sparse "
             f"{meta.get('torch_sparse')}, pyg-lib {meta.get('pyg_lib')}; commit {meta.get('commit')}"]  # fmt: skip
    if graph:
        lines.append(f"- Graph: SyntheticGraph, {graph['num_nodes']:,} nodes, {graph['num_edges']:,} edges, "
                     f"{graph['features']} fp32 features ({graph['features_gb']:.2f} GB)")  # fmt: skip
    lines += ["", "Seconds for the logits of every node (one pass; setup excluded: ours the host copy, PyG its worker "
              "sweep). Per layer: seconds and GB/s of input rows read (layer 0 the features, then the previous "
              "layer's outputs; PyG: `x_all[batch.n_id]` rows); ours: the host seconds in the sampler's calls (near the "
              "layer's seconds: the sampler bounds it). `sampled`: its steady rate over the batches it ran, "
              "times the batches of every node.", ""]  # fmt: skip
    models = sorted({m for r in runs.values() for m in r.get("models", {})}, key=lambda m: ("light", "heavy").index(m)
                    if m in ("light", "heavy") else 9)  # fmt: skip
    lines += ["| model | ours s | PyG s | PyG cached s | sampled s | ours × PyG | ours × PyG cached | ours × sampled "
              "| max abs diff, ours vs PyG |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for model in models:
        got = {name: run["models"].get(model) for name, run in runs.items()}
        ours = (got.get("ours") or {}).get("total_s")
        diff = probe_diff((got.get("ours") or {}).get("probe"), (got.get("pyg") or got.get("pyg_cached") or {}).get("probe"))
        lines.append(f"| {model} | {_seconds(got.get('ours'))} | {_seconds(got.get('pyg'))} | "
                     f"{_seconds(got.get('pyg_cached'))} | {_seconds(got.get('sampled'))} | "
                     f"{_ratio(ours, (got.get('pyg') or {}).get('total_s'))} | "
                     f"{_ratio(ours, (got.get('pyg_cached') or {}).get('total_s'))} | "
                     f"{_ratio(ours, (got.get('sampled') or {}).get('total_s'))} | "
                     f"{'–' if diff is None else f'{diff:.2e}'} |")  # fmt: skip
    lines += ["", "| model | row | per layer | setup s | notes |", "|---|---|---|---|---|"]
    for model in models:
        for name, run in runs.items():
            figures = run["models"].get(model)
            if figures is None:
                continue
            notes = (f"batch {figures['batch_size']}, storage {figures['storage']}, sampler "
                     f"{figures.get('sampler_placement', 'cpu')}" if "storage" in figures else
                     f"batch {figures['batch_size']}, {figures['pyg_workers']} workers ({', '.join(figures['pyg_backends'])})"
                     if "pyg_workers" in figures
                     else f"{figures['measured_batches']} of {figures['batches']:,} batches, {figures['batches_per_s']:.1f}/s, "
                     f"fanouts {figures['fanouts']}")  # fmt: skip
            setup = figures.get("setup_s")
            lines.append(f"| {model} | {name} | {_layers(figures)} | {'–' if setup is None else f'{setup:.1f}'} | {notes} |")
    skipped = [r for r in results.get("runs", []) if r.get("status") != "ok"]
    if skipped:
        lines += ["", "Rows that did not run:", ""]
        lines += [f"- `{r['row']}`: {r.get('status')}: {r.get('reason')}" for r in skipped]
    return "\n".join(lines) + "\n"


def write(results: dict[str, Any], folder: str) -> str:
    """``folder/report.md``; returns its path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "report.md")
    with open(path, "w") as f:
        f.write(render(results))
    return path
