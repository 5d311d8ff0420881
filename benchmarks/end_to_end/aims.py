"""Issue 20's aims next to what an end-to-end run measured, heavy and light model side by side (a report section).

Reads a run's results dict only (of the other benchmark modules only ``e2e_results``, which imports none, so the
report can import it without a loop). "End to
end" is the fastest finished row of ours that reads features from host memory (``all_in_gpu`` holds them all on
the GPU and is shown beside it, not counted); its batches must have passed the batch check.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from benchmarks.end_to_end.results import share_label

__all__ = ["AIMS", "aims_table", "end_to_end_row"]

#: Issue 20's aims (H200): heavy model-only step ms, end-to-end steps/s, end to end over model-only, over PyG.
AIMS: dict[str, dict[str, float]] = {
    "model_only_ms": {"heavy": 5.0},
    "end_to_end_steps": {"heavy": 180.0, "light": 250.0},
    "vs_model_only": {"heavy": 0.9, "light": 0.9},
    "vs_pyg": {"heavy": 10.0, "light": 4.0},
}


def _finished(run: dict[str, Any]) -> bool:
    return run.get("status") == "ok" and run.get("steps_per_s") is not None


def _host_memory(run: dict[str, Any]) -> bool:
    if "features_in_host_memory" in run:
        return bool(run["features_in_host_memory"])
    return run.get("kind") == "ours" and run.get("row") != "all_in_gpu"  # results written before the key existed


def _rows(results: dict[str, Any], model: str) -> dict[str, dict[str, Any]]:
    return {r["row"]: r for r in results.get("runs", []) if r["model"] == model}


def end_to_end_row(results: dict[str, Any], model: str) -> Optional[dict[str, Any]]:
    """The fastest finished row of ours with features in host memory and correct batches, or None."""
    rows = [r for r in _rows(results, model).values()
            if _finished(r) and _host_memory(r) and r.get("batch_check", {}).get("ok", True)]  # fmt: skip
    return max(rows, key=lambda r: r["steps_per_s"]) if rows else None


def _verdict(value: Optional[float], aim: Optional[float], at_most: bool = False) -> str:
    if value is None or aim is None:
        return ""
    met = value <= aim if at_most else value >= aim
    return ": met" if met else ": **missed**"


def _num(value: Optional[float], spec: str) -> str:
    return "–" if value is None else f"{value:{spec}}"


def _ttt(run: Optional[dict[str, Any]], target: Optional[float]) -> Optional[float]:
    if run is None or target is None:
        return None
    return next((t for _, t, acc in run.get("val_curve", []) if acc >= target), None)


def _module(runs: list[dict[str, Any]]) -> str:
    """The model configuration of a model's finished rows: one line if they agree, else each row's."""
    seen = {(r.get("precision"), r.get("trim"), r.get("batch_check", {}).get("trimmed")) for r in runs}
    if not runs:
        return "–"
    if len(seen) == 1:
        precision, trim, trimmed = next(iter(seen))
        if precision is None:
            return "not recorded (results from before --precision / --trim)"
        state = "trimmed" if trimmed else ("trim on, **batches without per-hop counts**" if trim else "untrimmed")
        return f"{precision}, {state}, in all {len(runs)} rows"
    return "**differs**: " + "; ".join(
        f"`{r['row']}` {r.get('precision')}, {'trimmed' if r.get('batch_check', {}).get('trimmed') else 'untrimmed'}"
        for r in runs
    )


def _column(results: dict[str, Any], model: str, target: Optional[float]) -> list[str]:
    rows = _rows(results, model)
    bound = rows.get("model_only") if rows.get("model_only") and _finished(rows["model_only"]) else None
    pyg = rows.get("pyg") if rows.get("pyg") and _finished(rows["pyg"]) else None
    gpu = rows.get("all_in_gpu") if rows.get("all_in_gpu") and _finished(rows["all_in_gpu"]) else None
    e2e = end_to_end_row(results, model)
    rate = e2e["steps_per_s"] if e2e else None
    bound_ms = 1e3 / bound["steps_per_s"] if bound else None
    vs_bound = rate / bound["steps_per_s"] if e2e and bound else None
    vs_pyg = rate / pyg["steps_per_s"] if e2e and pyg else None
    acc = lambda r: _num(r.get("best_val_acc") if r else None, ".3f")  # noqa: E731
    ttt = lambda r: _num(_ttt(r, target), ".1f")  # noqa: E731
    return [
        f"{_num(bound_ms, '.2f')} ms ({_num(bound['steps_per_s'] if bound else None, '.1f')} steps/s)"
        + _verdict(bound_ms, AIMS["model_only_ms"].get(model), at_most=True),
        (f"{rate:.1f} steps/s (`{e2e['row']}`{', ' + share_label(e2e) if share_label(e2e) else ''})" if e2e else "–") + _verdict(rate, AIMS["end_to_end_steps"].get(model)),
        _num(vs_bound, ".2f") + ("×" if vs_bound else "") + _verdict(vs_bound, AIMS["vs_model_only"].get(model)),
        (_num(vs_pyg, ".2f") + "×" + f" (PyG {pyg['steps_per_s']:.1f} steps/s, {pyg.get('pyg_workers')} workers)"
         if vs_pyg else "–") + _verdict(vs_pyg, AIMS["vs_pyg"].get(model)),  # fmt: skip
        f"{gpu['steps_per_s']:.1f} steps/s" if gpu else "–",
        f"{acc(e2e)} / {acc(bound)} / {acc(pyg)}",
        f"{ttt(e2e)} / {ttt(bound)} / {ttt(pyg)} (target {_num(target, '.3f')})",
        _module([r for r in rows.values() if _finished(r)]),
    ]


_WHAT = [
    ("model-only step (the same batches pre-staged on the GPU)", "heavy ≤ 5 ms"),
    ("end to end, features in host memory (best row of ours)", "≥ 180 heavy, ≥ 250 light steps/s"),
    ("end to end vs model-only", "≥ 0.9×"),
    ("end to end vs PyG `NeighborLoader`, same graph and module", "≥ 10× heavy, ≥ 4× light"),
    ("`all_in_gpu` (features in GPU memory, for reference)", "–"),
    ("best val acc: end to end / model-only / PyG", "within noise"),
    ("time to target, s of training: end to end / model-only / PyG", "reported"),
    ("module in every row: precision, per-hop trimming", "the same"),
]


def aims_table(results: dict[str, Any], target_acc: Callable[[dict[str, Any], str], Optional[float]]) -> list[str]:
    """Report lines: issue 20's aims, one column per model (heavy, light, then any other), measured values and
    met / missed. ``target_acc(results, model)`` gives the time-to-accuracy target."""
    models = list(dict.fromkeys(r["model"] for r in results.get("runs", [])))
    models = [m for m in ("heavy", "light") if m in models] + [m for m in models if m not in ("heavy", "light")]
    if not models:
        return []
    columns = [_column(results, m, target_acc(results, m)) for m in models]
    lines = ["## Issue 20's aims, side by side", "",
             "| what | aim | " + " | ".join(f"{m} model" for m in models) + " |",
             "|---|---|" + "---|" * len(models)]  # fmt: skip
    for i, (what, aim) in enumerate(_WHAT):
        lines.append(f"| {what} | {aim} | " + " | ".join(col[i] for col in columns) + " |")
    lines += ["", "`models.GraphSAGE` + `DataTelemetry` against the bare module (aim: within 5 %) is "
              "`benchmarks.parts.step`'s table, not measured here.", ""]  # fmt: skip
    return lines
