"""The parts of a one-model benchmark's ``report.md`` and console lines that the link and heterogeneous benchmarks
share (``benchmarks.end_to_end.link.report``, ``benchmarks.end_to_end.hetero.report``): the target, a row's batch check and failure,
the ratios to PyG and model-only, the run's machine and software lines, the rows' docs, writing the file."""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence

from benchmarks.end_to_end.report import _fmt, _named, _pct, sample_host_cpu
from benchmarks.end_to_end.results import finished, time_to_target

__all__ = ["check_words", "checked_cell", "console_line", "failed_cells", "failed_line", "machine_lines", "rate_ratio",
           "results_table", "row_docs", "target", "write_report_lines"]  # fmt: skip

#: a column of :func:`results_table` beyond the shared ones: its header and its cell of a finished row
Column = tuple[str, Callable[[dict[str, Any]], str]]


def target(results: dict[str, Any], flag: str, metric: str) -> Optional[float]:
    """The ``flag`` argument (e.g. ``target_acc``), else 95 % of the lowest ``metric`` (e.g. ``best_val_acc``) among
    the finished rows."""
    given = results.get("args", {}).get(flag)
    if given is not None:
        return float(given)
    best = [r[metric] for r in results.get("runs", []) if finished(r) and r.get(metric) is not None]
    return round(0.95 * min(best), 4) if best else None


def failed_line(run: dict[str, Any], head: str) -> str:
    """The console line of a row that did not finish: its status and reason after ``head``."""
    return f"{head}{run.get('status', '?')}: {str(run.get('reason', ''))[:300]}"


def check_words(check: dict[str, Any]) -> str:
    """A console line's end on the batch check: ``""`` when it passed, else `` WRONG: `` and its problems."""
    return "" if check.get("ok", True) else " WRONG: " + "; ".join(check.get("problems", []))


def failed_cells(name: str, run: dict[str, Any], columns: int) -> str:
    """The table line of a row that did not finish: its name, status and reason's first line, ``columns`` in all."""
    reason = str(run.get("reason", "")).splitlines()[0][:160] if run.get("reason") else ""
    return f"| `{name}` | {run.get('status')}: {reason} |" + "|" * (columns - 2)


def checked_cell(check: dict[str, Any]) -> str:
    """The table's batch-check cell: ``N ok``, or **WRONG** and the problems."""
    return f"{check.get('checked', 0)} ok" if check.get("ok", True) else "**WRONG**: " + "; ".join(check.get("problems", []))


def rate_ratio(run: dict[str, Any], rates: dict[str, float], ref: str) -> str:
    """``run``'s steps/s over row ``ref``'s (``rates``: the finished rows'), as ``1.23×``; ``–`` without ``ref``."""
    return _fmt(run["steps_per_s"] / rates[ref] if ref in rates else None, ".2f", "×")


def console_line(run: dict[str, Any], width: int, figures: Callable[[dict[str, Any]], str]) -> str:
    """A row's console line: its name in ``width`` characters, then ``figures(run)`` and the batch check of a finished
    row, or its status and reason."""
    head = f"{run['row']:<{width}}"
    if not finished(run):
        return failed_line(run, head)
    check = run.get("batch_check", {})
    return f"{head}{figures(run)}  batches checked {check.get('checked', 0)}{check_words(check)}"


def results_table(results: dict[str, Any], *, metric: str, metric_words: str, best: str, target: Optional[float],
                  rate: str = ".2f", name: Callable[[dict[str, Any]], str] = _named,
                  extra: Sequence[Column] = ()) -> list[str]:  # fmt: skip
    """The report's results table: the target line (the metric in ``metric_words``), then a line per row (``name``,
    steps/s as ``rate``, the ratios to PyG and model-only, stall, host wait, step p50/p99, the best validation
    ``metric`` (key ``best``), the time to ``target``, the ``extra`` columns, setup time, the batch check), or its
    status and reason."""
    runs = {r["row"]: r for r in results.get("runs", [])}
    rates = {row: r["steps_per_s"] for row, r in runs.items() if finished(r)}
    headers = ["row", "steps/s", "× PyG", "× model-only", "stall", "host wait ms", "step p50 / p99 ms",
               f"best val {metric}", "time to target s", *(h for h, _ in extra), "setup s", "batches checked"]  # fmt: skip
    out = [f"Target validation {metric_words}: {_fmt(target, '.3f')}.", "", "| " + " | ".join(headers) + " |",
           "|" + "---|" * len(headers)]  # fmt: skip
    for row, r in runs.items():
        if not finished(r):
            out.append(failed_cells(row, r, len(headers)))
            continue
        lat = r.get("step_ms", [])
        out.append("| " + " | ".join([
            name(r), f"{r['steps_per_s']:{rate}}", rate_ratio(r, rates, "pyg"), rate_ratio(r, rates, "model_only"),
            _fmt(r.get("stall_frac"), ".1%"), _fmt(r.get("wait_ms"), ".2f"),
            f"{_fmt(_pct(lat, 0.5), '.2f')} / {_fmt(_pct(lat, 0.99), '.2f')}", _fmt(r.get(best), ".3f"),
            _fmt(time_to_target(r, target), ".1f"), *(cell(r) for _, cell in extra), _fmt(r.get("setup_s"), ".1f"),
            checked_cell(r.get("batch_check", {}))]) + " |")  # fmt: skip
    return out + [""]


def build_stage_lines(results: dict[str, Any]) -> list[str]:
    """The report's ``## Where a build's time goes`` section: each pipeline row's producer stages beside training
    (means after warm-up, ``DataTelemetry``), or nothing when no row has them."""
    rows = [r for r in results.get("runs", [])
            if finished(r) and any(v is not None for v in (r.get("build_stages_ms") or {}).values())]  # fmt: skip
    if not rows:
        return []
    out = ["## Where a build's time goes (the pipeline producer, beside training)", "",
           "Means after warm-up, from CUDA events on the worker's streams. Sample host / CPU: the sample's wall time "
           "on its thread and that thread's CPU time. Gather: GB/s of the bytes read; its bound: "
           "those bytes over the PCIe bandwidth of a contiguous pinned copy measured by the producer.", "",
           "| row | build ms | sample ms | sample host / CPU ms | gather ms | gather GB/s | gather PCIe bound ms "
           "| assemble ms | hand-over ms |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        stages = r["build_stages_ms"]
        out.append("| " + " | ".join([
            _named(r), _fmt(r.get("build_ms"), ".2f"), _fmt(stages.get("sample"), ".2f"), sample_host_cpu(r),
            _fmt(stages.get("gather"), ".2f"),
            _fmt(r.get("gather_build_GBps"), ".3g"), _fmt(r.get("gather_bound_ms"), ".2f"),
            _fmt(stages.get("assemble"), ".2f"), _fmt(stages.get("handover"), ".2f")]) + " |")  # fmt: skip
    return out + [""]


def machine_lines(results: dict[str, Any]) -> list[str]:
    """The report's command, date, GPU/CPU/RAM and software lines."""
    meta = results.get("meta", {})
    return [f"- Command: `{results.get('command', '?')}`",
            f"- Date: {meta.get('date')}; host {meta.get('host')}; total {_fmt(results.get('total_s'), '.0f')} s",
            f"- GPU: {meta.get('gpu') or 'none'}; CPU: {meta.get('cpu')} ({meta.get('cpu_count')} logical cores); "
            f"RAM {_fmt(meta.get('ram_gib'), '.0f')} GiB",
            f"- Software: torch {meta.get('torch')}, PyG {meta.get('torch_geometric')}, pytorch_lightning "
            f"{meta.get('pytorch_lightning')}, torch-sparse {meta.get('torch_sparse')}, pyg-lib {meta.get('pyg_lib')}; "
            f"lightning-zerocopy commit {meta.get('commit')}"]  # fmt: skip


def row_docs(results: dict[str, Any]) -> list[str]:
    """The report's ``## Rows`` section: every row's doc."""
    return ["## Rows", ""] + [f"- `{name}`: {doc}" for name, doc in results.get("rows", {}).items()] + [""]


def write_report_lines(out_dir: str, lines: list[str]) -> str:
    """``lines`` as ``out_dir/report.md``; returns its path."""
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path
