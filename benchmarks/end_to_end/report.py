"""``report.md`` and PNG plots of an end-to-end benchmark run, from its ``results.json`` alone.

Re-render on any machine with ``python -m benchmarks.end_to_end --report-only DIR``. Without matplotlib the report is
written and the plots are skipped with a note saying how to render them.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from benchmarks.common import cpu_speed
from benchmarks.end_to_end.repeats import repeat_table
from benchmarks.end_to_end.results import PLOTS, finished, models_in, runs_by_row, share_label, target_acc, time_to_target
from benchmarks.end_to_end.rows import ROWS
from benchmarks.common.results import plots_or_note, read_results

__all__ = ["PLOTS", "aims", "one_line", "render", "target_acc", "time_to_target"]

_AIMS = {"heavy": 10.0, "light": 4.0}  # best row vs PyG's steps/s (issue 20)
_BOUND_AIM = 0.9  # best row vs model-only


def _pct(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def _fmt(value: Any, spec: str = ".1f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _named(run: dict[str, Any]) -> str:
    """The row's name in backticks, with an MPS row's worker share."""
    label = share_label(run)
    return f"`{run['row']}`" + (f" ({label})" if label else "")


def one_line(run: dict[str, Any]) -> str:
    """A console line for one row and model."""
    head = f"{run['row']:<18}{run['model']:<7}"
    if share_label(run) and finished(run):
        head += share_label(run) + "  "
    if run.get("kind") == "stages" and run.get("status") == "ok":
        return head + "ms per batch: " + ", ".join(f"{p} {t['total_ms']:.1f}" for p, t in run["stages"].items())
    if run.get("kind") == "sample_alone" and run.get("status") == "ok":
        return head + "sampling alone, ms per batch: " + ", ".join(
            f"{p} {_fmt(ms, '.2f')}" for p, ms in run["sample_alone_ms"].items())  # fmt: skip
    if not finished(run):
        return f"{head}{run.get('status', '?')}: {str(run.get('reason', ''))[:300]}"
    check = run.get("batch_check", {})
    return (f"{head}{run['steps_per_s']:8.2f} steps/s  stall {_fmt(run.get('stall_frac'), '.1%')}  "
            f"best val acc {_fmt(run.get('best_val_acc'), '.3f')}  batches checked {check.get('checked', 0)}"
            f"{'' if check.get('ok', True) else ' WRONG: ' + '; '.join(check.get('problems', []))}")  # fmt: skip


def aims(results: dict[str, Any], model: str) -> list[str]:
    """Lines on the issue's aims for ``model``: best row vs PyG and vs model-only, and what limits it."""
    rows = runs_by_row(results, model)
    ours = [r for r in rows.values() if finished(r) and r.get("kind") == "ours" and r.get("batch_check", {}).get("ok", True)]
    if not ours:
        return [f"- {model}: no row of ours finished."]
    best = max(ours, key=lambda r: r["steps_per_s"])
    lines = [f"- {model}: best row {_named(best)} at {best['steps_per_s']:.1f} steps/s."]
    samples: dict[str, list[str]] = {}
    for r in rows.values():
        if finished(r) and r.get("kind") in ("ours", "model_only") and r.get("batch_check", {}).get("first_sample"):
            samples.setdefault(r["batch_check"]["first_sample"], []).append(r["row"])
    if len(samples) > 1:
        lines.append("  - **our rows sampled different first batches** (expected one sample for every placement): "
                     + "; ".join(f"{', '.join(v)}: {k}" for k, v in samples.items()))  # fmt: skip
    elif samples:
        lines.append(f"  - every row of ours (and model-only) trained on the same first batch (sample {next(iter(samples))}).")
    pyg, bound = rows.get("pyg"), rows.get("model_only")
    if pyg and finished(pyg):
        ratio = best["steps_per_s"] / pyg["steps_per_s"]
        aim = _AIMS.get(model)
        verdict = "" if aim is None else (" (aim ≥ %.0f×: %s)" % (aim, "met" if ratio >= aim else "missed"))
        lines.append(f"  - vs PyG NeighborLoader ({pyg.get('pyg_workers')} workers, {pyg['steps_per_s']:.1f} steps/s): "
                     f"{ratio:.2f}×{verdict}; best val acc {_fmt(best.get('best_val_acc'), '.3f')} vs PyG's "
                     f"{_fmt(pyg.get('best_val_acc'), '.3f')}.")  # fmt: skip
    else:
        lines.append("  - vs PyG: not measured in this run (see the row's status).")
    if bound and finished(bound):
        ratio = best["steps_per_s"] / bound["steps_per_s"]
        lines.append(f"  - vs model-only ({bound['steps_per_s']:.1f} steps/s): {ratio:.2f}× "
                     f"(aim ≥ {_BOUND_AIM}×: {'met' if ratio >= _BOUND_AIM else 'missed'}).")  # fmt: skip
        if ratio < _BOUND_AIM:
            p50 = _pct(best.get("step_ms", []), 0.5)
            lines.append(f"  - what limits `{best['row']}`: stall {_fmt(best.get('stall_frac'), '.1%')} of the step, host wait "
                         f"{_fmt(best.get('wait_ms'), '.2f')} ms, step p50 {_fmt(p50, '.2f')} ms vs model-only "
                         f"{_fmt(_pct(bound.get('step_ms', []), 0.5), '.2f')} ms, producer build "
                         f"{_fmt(best.get('build_ms'), '.2f')} ms per batch{_stage_words(best, results)}.")  # fmt: skip
    return lines


def _stage_words(run: dict[str, Any], results: dict[str, Any]) -> str:
    """``: sample X (alone Y), gather X (bound Y), assemble X, hand-over X ms`` where the row has a build split."""
    stages = run.get("build_stages_ms") or {}
    if not any(v is not None for v in stages.values()):
        return ""
    alone = _sample_alone_ms(results, run)
    return (f": sample {_fmt(stages.get('sample'), '.2f')} (alone {_fmt(alone, '.2f')}), gather "
            f"{_fmt(stages.get('gather'), '.2f')} (PCIe bound {_fmt(run.get('gather_bound_ms'), '.2f')}), assemble "
            f"{_fmt(stages.get('assemble'), '.2f')}, hand-over {_fmt(stages.get('handover'), '.2f')} ms")  # fmt: skip


def sample_host_cpu(run: dict[str, Any]) -> str:
    """``host / CPU`` ms of a pipeline row's sample stage: the sample's wall time on the thread that sampled it and
    that thread's CPU time (``DataTelemetry``'s means; ``–`` where not measured); the difference is time the thread
    slept, on the GPU or the host (the ``zc_gpu_mps_spin`` row tells which)."""
    telemetry = run.get("telemetry") or {}
    return f"{_fmt(telemetry.get('build_sample_host_ms'), '.2f')} / {_fmt(telemetry.get('build_sample_cpu_ms'), '.2f')}"


def _sample_alone_ms(results: dict[str, Any], run: dict[str, Any]) -> Optional[float]:
    """The ``sample_alone`` row's ms per batch (same model) for ``run``'s sampler placement, or None."""
    placement = run.get("sampler_placement")
    if placement is None:
        placement = getattr(ROWS.get(run.get("row", "")), "data", {}).get("sampler_placement")
    for r in results.get("runs", []):
        if r.get("kind") == "sample_alone" and r.get("status") == "ok" and r.get("model") == run.get("model"):
            return (r.get("sample_alone_ms") or {}).get(placement)
    return None


def _build_stage_table(results: dict[str, Any], model: str) -> list[str]:
    """Where each pipeline row's build time went: the producer's stages (means after warm-up) beside their bounds."""
    rows = [r for r in runs_by_row(results, model).values()
            if finished(r) and any(v is not None for v in (r.get("build_stages_ms") or {}).values())]  # fmt: skip
    if not rows:
        return []
    out = [f"### {model} model", "",
           "| row | feature dtype | build ms | sample ms | sample host / CPU ms | sample alone ms | gather ms "
           "| gather GB/s | gather PCIe bound ms | assemble ms | hand-over ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        stages = r["build_stages_ms"]
        out.append("| " + " | ".join([
            _named(r), str(r.get("feature_dtype") or "float32"), _fmt(r.get("build_ms"), ".2f"),
            _fmt(stages.get("sample"), ".2f"), sample_host_cpu(r), _fmt(_sample_alone_ms(results, r), ".2f"),
            _fmt(stages.get("gather"), ".2f"),
            _fmt(r.get("gather_build_GBps"), ".3g"), _fmt(r.get("gather_bound_ms"), ".2f"),
            _fmt(stages.get("assemble"), ".2f"), _fmt(stages.get("handover"), ".2f")]) + " |")  # fmt: skip
    return out + [""]


def _sample_alone_lines(results: dict[str, Any]) -> list[str]:
    """The ``sample_alone`` row: ms per batch of the sampler alone, per model and placement."""
    out = []
    for r in results.get("runs", []):
        if r.get("kind") != "sample_alone":
            continue
        if r.get("status") != "ok":
            out.append(f"- {r['model']}: {r.get('status')}: {r.get('reason', '')}")
            continue
        errors = r.get("sample_alone_errors") or {}
        out.append(f"- {r['model']} ({r.get('batches')} batches on {r.get('device')}): " + ", ".join(
            f"`{p}` {_fmt(ms, '.2f')} ms" + (f" ({errors[p]})" if p in errors else "")
            for p, ms in r["sample_alone_ms"].items()))  # fmt: skip
    return out


def _table(results: dict[str, Any], model: str) -> list[str]:
    rows = runs_by_row(results, model)
    target = target_acc(results, model)
    bound = rows.get("model_only")
    pyg = rows.get("pyg")
    bound_rate = bound["steps_per_s"] if bound and finished(bound) else None
    pyg_rate = pyg["steps_per_s"] if pyg and finished(pyg) else None
    out = [f"### {model} model (target val acc {_fmt(target, '.3f')})", "",
           "| row | steps/s | × model-only | × PyG | stall | host wait ms | feature GB/s | build ms | step p50 / p99 ms "
           "| best val acc | time to target s | setup s | batches checked |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in rows.items():
        if r.get("kind") in ("stages", "sample_alone"):
            continue
        if not finished(r):
            out.append(f"| `{name}` | {r.get('status')}: {str(r.get('reason', '')).splitlines()[0][:160] if r.get('reason') else ''} ||||||||||||")
            continue
        rate = r["steps_per_s"]
        lat = r.get("step_ms", [])
        check = r.get("batch_check", {})
        checked = f"{check.get('checked', 0)} ok" if check.get("ok", True) else "**WRONG**: " + "; ".join(check.get("problems", []))
        out.append("| " + " | ".join([
            _named(r), f"{rate:.1f}", _fmt(rate / bound_rate if bound_rate else None, ".2f", "×"),
            _fmt(rate / pyg_rate if pyg_rate else None, ".2f", "×"), _fmt(r.get("stall_frac"), ".1%"),
            _fmt(r.get("wait_ms"), ".2f"), _fmt(r.get("gather_GBps"), ".3g"), _fmt(r.get("build_ms"), ".2f"),
            f"{_fmt(_pct(lat, 0.5), '.2f')} / {_fmt(_pct(lat, 0.99), '.2f')}", _fmt(r.get("best_val_acc"), ".3f"),
            _fmt(time_to_target(r, target), ".1f"), _fmt(r.get("setup_s"), ".1f"), checked]) + " |")  # fmt: skip
    return out + [""]


_TABLE_KEYS = {"stall_ms", "stall_frac", "step_ms", "wait_ms", "seps", "gather_GBps", "build_ms", "build_sample_ms",
               "build_gather_ms", "build_assemble_ms", "build_handover_ms", "gather_build_GBps", "gather_bound_ms"}


def _other_telemetry(results: dict[str, Any]) -> list[str]:
    """DataTelemetry figures the table does not show (a sampler's device shares, predicted times, cache hits)."""
    out = []
    for r in results.get("runs", []):
        extra = {k: v for k, v in (r.get("telemetry") or {}).items() if k not in _TABLE_KEYS and v is not None}
        if finished(r) and extra:
            out.append(f"- `{r['row']}` ({r['model']}): " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(extra.items())))
    return out


def _stage_tables(results: dict[str, Any]) -> list[str]:
    """The ``stages`` row: median ms per batch of each build stage and path, per model."""
    out: list[str] = []
    for r in results.get("runs", []):
        if r.get("kind") != "stages":
            continue
        if r.get("status") != "ok":
            out += [f"- {r['model']}: {r.get('status')}: {r.get('reason', '')}", ""]
            continue
        out += [f"### {r['model']} model: {r['nodes_per_batch']:,.0f} nodes, {r['edges_per_batch']:,.0f} edges, "
                f"{r['feature_MB_per_batch']:.1f} MB of features per batch ({r['threads']} threads)", "",
                "| sampler + gather | sample ms | gather ms | copy to device ms | total ms | batches/s if alone |",
                "|---|---|---|---|---|---|"]  # fmt: skip
        for path, t in r["stages"].items():
            out.append(f"| `{path}` | {t['sample_ms']:.2f} | {t['gather_ms']:.2f} | {t['copy_ms']:.2f} | "
                       f"{t['total_ms']:.2f} | {1e3 / t['total_ms']:.0f} |" if t["total_ms"] > 0 else f"| `{path}` | – |")  # fmt: skip
        out.append("")
    return out


def _share_choices(results: dict[str, Any]) -> list[str]:
    """What the ``worker_sm_percent='auto'`` rows' calibration measured and chose."""
    out = []
    for r in results.get("runs", []):
        if not finished(r) or r.get("worker_sm_percent") != "auto":
            continue
        choice = r.get("share_choice")
        if choice is None:
            out.append(f"- `{r['row']}` ({r['model']}): the calibration did not decide within the run (the row's log "
                       "says what it measured and how many training steps it needs)")  # fmt: skip
            continue
        verdict = "keeps pace with" if choice["keeps_pace"] else "cannot keep pace with (the data path bounds)"
        out.append(f"- `{r['row']}` ({r['model']}): worker share {choice['percent']} %: a batch built in "
                   f"{choice['build_ms']:.2f} ms {verdict} a {choice['step_ms']:.2f} ms step")  # fmt: skip
    return out


def _gpu_words(clocks: dict[str, Any]) -> str:
    if not clocks.get("samples"):
        return f"GPU clocks not sampled ({clocks.get('why')})"
    words = (f"GPU SM {clocks['sm_mhz']} MHz (min {clocks['sm_mhz_min']}), memory {clocks['mem_mhz']} MHz, "
             f"{clocks['power_w']} W, ≤ {clocks['temp_c_max']:.0f} °C, util {clocks['util']:.0f} %, reasons {clocks['reasons']}")
    if clocks.get("pcie_gen_min") is not None:  # JSON from before 2026-11-30 has none of these
        words += f", PCIe gen ≥ {clocks['pcie_gen_min']} x{clocks.get('pcie_width_min')}"
    if clocks.get("dirty_mb_max") is not None:
        writeback = clocks.get("writeback_mb_max") or 0
        words += f"; host page cache dirty ≤ {clocks['dirty_mb_max']:.0f} MB, writeback ≤ {writeback:.0f} MB"
    return words


def _host_words(load: dict[str, Any]) -> str:
    words = []
    for p in load.get("processes", []):
        if p["role"] in ("trainer", "worker"):
            waited = p.get("main_runqueue_ms_per_s")
            words.append(f"{p['role']} {p['cores']:.2f} cores, {p['involuntary_per_s']:.0f} involuntary switches/s"
                         + ("" if waited is None else f", main thread waited {waited:.1f} ms/s for a core"))
    words.append(f"machine {load.get('machine_busy_cores')} of {load.get('cpu_count')} cores busy, steal "
                 f"{load.get('steal_cores')}")
    return "; ".join(words)


def _conditions(results: dict[str, Any]) -> list[str]:
    """What each finished run's steady window ran on: the GPU's clocks (sampled by the orchestrator) and the host's
    CPUs (the row process and its worker, from ``/proc``; the share of CPUs at full speed before the row,
    :mod:`benchmarks.common.cpu_speed`). Tells a slower run of the same row apart: lower clocks,
    a core shared, or neither (contention inside the GPU)."""
    out = []
    for r in results.get("runs", []):
        if not finished(r) or not (r.get("gpu_clocks") or r.get("host_load")):
            continue
        block = f", block {r['repeat'] + 1}" if int(results.get("args", {}).get("repeats") or 1) > 1 else ""
        parts = [_gpu_words(r["gpu_clocks"])] if r.get("gpu_clocks") else []
        parts += [_host_words(r["host_load"])] if r.get("host_load") else []
        parts += [cpu_speed.describe(r["host_cpus"])] if r.get("host_cpus") else []  # rows since 2026-11-30
        out.append(f"- `{r['row']}` ({r['model']}{block}, {r['steps_per_s']:.1f} steps/s): " + "; ".join(parts))
    return out


def write_report(results: dict[str, Any], out_dir: str, plots: list[str], plot_note: str) -> str:
    """Write ``report.md``; returns its path."""
    meta, graph, args = results.get("meta", {}), results.get("graph", {}), results.get("args", {})
    lines = ["# End-to-end benchmark: lightning-zerocopy vs PyG NeighborLoader", "",
             f"- Command: `{results.get('command', '?')}`"
             + "".join(f"; earlier runs kept from `{c}`" for c in results.get("earlier_commands", [])),
             f"- Date: {meta.get('date')}; host {meta.get('host')}; total {_fmt(results.get('total_s'), '.0f')} s",
             f"- GPU: {meta.get('gpu') or 'none'}; CPU: {meta.get('cpu')} ({meta.get('cpu_count')} logical cores); "
             f"RAM {_fmt(meta.get('ram_gib'), '.0f')} GiB; disk free {_fmt(meta.get('disk_free_gib'), '.0f')} GiB",
             f"- Software: Python {meta.get('python')}, torch {meta.get('torch')}, PyG {meta.get('torch_geometric')}, "
             f"pytorch_lightning {meta.get('pytorch_lightning')}, torch-sparse {meta.get('torch_sparse')}, "
             f"pyg-lib {meta.get('pyg_lib')}; lightning-zerocopy commit {meta.get('commit')}",
             f"- Graph (SyntheticGraph, preset `{args.get('preset')}`): {graph.get('num_nodes', 0):,} nodes, "
             f"{graph.get('num_edges', 0):,} edges, {graph.get('num_features')} fp32 features "
             f"({_fmt(graph.get('feature_GB'), '.2f')} GB), {graph.get('num_classes')} planted classes, "
             f"homophily {args.get('homophily')}, feature signal {args.get('feature_signal')}",
             f"- Training: batch {args.get('batch_size')}, up to {args.get('steps')} steps (warm-up {args.get('warmup')}), "
             f"validation every {args.get('val_every')} steps on {args.get('val_batches')} batches, Adam lr {args.get('lr')}, "
             f"seed {args.get('seed')}; row budget {args.get('row_budget_s')} s of training",
             f"- Model, the same in every row (PyG's and model-only's too): precision {args.get('precision', '32 (not recorded)')}, "
             f"per-hop trimming {({True: 'on', False: 'off'}).get(args.get('trim'), 'off (not recorded)')}"
             + ("; `torch.compile`d (`compile=True`, dynamic shapes)" if args.get("compile") else "")
             + (f"; linear products on row counts rounded up to {args['gemm_rows']} (`GemmRowBuckets`)"
                if args.get("gemm_rows") else "")
             + (f"; our rows store the host features as {args['feature_dtype']}" if args.get("feature_dtype") else "")
             + (f"; `x` delivered as {args['x_dtype']} by our rows and model-only's (PyG's float32)"
                if args.get("x_dtype") else " (`x` delivered as float32)" if args.get("feature_dtype") else ""),
             "", "Steps/s: steady state after warm-up, training time only (host timer between device syncs, validation "
             "excluded). Stall, host wait, feature GB/s, build ms and the step interval come from `DataTelemetry`. "
             "Feature GB/s: bytes of `x` delivered per second of step interval (read from host memory by the zero-copy rows, "
             "partly from GPU memory with a cache, wholly for `all_in_gpu` and `model_only`). "
             "Time to target: training seconds at the first validation at or above the target. Setup: from `fit` to the "
             "first training step (host memory, CSC, pipeline start; PyG: its loaders). Batches checked: the "
             "first training batches compared with the dataset (seeds in plan order, `x`, `y`, `edge_index` range).",
             ""]  # fmt: skip
    lines += ["## Rows", ""] + [f"- `{name}`: {doc}" for name, doc in results.get("rows", {}).items()] + [""]
    lines += ["## Results", ""]
    for model in models_in(results):
        lines += _table(results, model)
    lines += repeat_table(results)
    split = [line for model in models_in(results) for line in _build_stage_table(results, model)]
    alone = _sample_alone_lines(results)
    if split or alone:
        lines += ["## Where a build's time goes (the pipeline producer, beside each stage's bound)", "",
                  "Means after warm-up, from `DataTelemetry`: GPU times from CUDA events on the streams that do the work "
                  "(host times on the CPU). Sample: the sampler, unique/relabel included; host / CPU: the same "
                  "sample's wall time on its thread and that thread's CPU time (the rest of the wall time the thread "
                  "waited); its bound, sample alone: the same sampler timed back to back on an idle GPU (the "
                  "`sample_alone` row). Gather: the feature rows, "
                  "GB/s of their bytes in the host table's dtype; its bound: those bytes over the PCIe bandwidth of a "
                  "contiguous pinned copy measured by the producer (rows a GPU cache serves included, so with a cache the "
                  "bound is an upper bound). Assemble: labels, id maps, the cast of `x`, copies into the slot. Hand-over: "
                  "host time from the producer's stream sync to its `ready` message.", ""] + split  # fmt: skip
        if alone:
            lines += ["Sampling alone (`sample_alone`), ms per batch:", ""] + alone + [""]
    stages = _stage_tables(results)
    if stages:
        lines += ["## Per-stage build times (no training running)", ""] + stages
    shares = _share_choices(results)
    if shares:
        lines += ["## Worker share chosen by the calibration (`worker_sm_percent='auto'`)", ""] + shares + [""]
    conditions = _conditions(results)
    if conditions:
        lines += ["## Conditions over each run's steady window", ""] + conditions + [""]
    other = _other_telemetry(results)
    if other:
        lines += ["## Other DataTelemetry figures (means after warm-up)", ""] + other + [""]
    from benchmarks.end_to_end.aims import aims_table  # issue 20's aims (imports nothing of ours)

    lines += aims_table(results, target_acc)
    lines += ["## Aims", ""]
    for model in models_in(results):
        lines += aims(results, model)
    lines += ["", "## Plots", ""]
    lines += [f"![{desc}]({name})" for name, desc in PLOTS.items() if name in map(os.path.basename, plots)]
    if plot_note:
        lines.append(plot_note)
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def render(out_dir: str) -> list[str]:
    """Write ``report.md`` and the plots from ``out_dir/results.json``; returns the files written.

    Raises:
        FileNotFoundError: no ``results.json`` in ``out_dir``.
    """
    results = read_results(out_dir)

    def write_plots() -> list[str]:
        from benchmarks.end_to_end.plots import write_plots

        return write_plots(results, out_dir)

    plots, note = plots_or_note(write_plots, "Plots", "benchmarks.end_to_end", out_dir)
    if note:
        print(f"e2e: {note}")
    return [write_report(results, out_dir, plots, note), *plots]

