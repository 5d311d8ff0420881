"""What the end-to-end benchmark's report and plots both read from a run's results dict: the plot files, the
finished runs, the accuracy target and the time to reach it. (Its own module so that ``e2e_report`` and
``e2e_plots`` both import it without importing each other.)"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["PLOTS", "finished", "models_in", "runs_by_row", "share_label", "target_acc", "time_to_target"]

#: The plot files, by what they show.
PLOTS = {
    "steps_per_s.png": "training steps/s per row, against model-only (dashed)",
    "val_acc_over_time.png": "validation accuracy over training wall time (validation excluded)",
    "stall_share.png": "share of the step interval the GPU (CPU: the loop) waited for data",
    "host_read_gbps.png": "feature bytes delivered to training per second",
    "batch_latency.png": "per-batch step interval distribution (after warm-up)",
}


def finished(run: dict[str, Any]) -> bool:
    return run.get("status") == "ok" and run.get("steps_per_s") is not None


def models_in(results: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["model"] for r in results.get("runs", [])))


def runs_by_row(results: dict[str, Any], model: str) -> dict[str, dict[str, Any]]:
    return {r["row"]: r for r in results.get("runs", []) if r["model"] == model}


def target_acc(results: dict[str, Any], model: str) -> Optional[float]:
    """``--target-acc``, else 95 % of the lowest best validation accuracy among the model's finished rows."""
    given = results.get("args", {}).get("target_acc")
    if given is not None:
        return float(given)
    best = [r["best_val_acc"] for r in runs_by_row(results, model).values() if finished(r) and r.get("best_val_acc") is not None]
    return round(0.95 * min(best), 4) if best else None


def time_to_target(run: dict[str, Any], target: Optional[float]) -> Optional[float]:
    """Training seconds (validation excluded) at the first validation reaching ``target``, or None."""
    if target is None:
        return None
    return next((t for _, t, acc in run.get("val_curve", []) if acc >= target), None)


def share_label(run: dict[str, Any]) -> str:
    """An MPS run's worker share, for the report: ``share 20 %``, ``share 20 %, auto`` (the calibration's choice),
    ``share auto, undecided`` (the run ended before the calibration decided); ``""`` for a run without MPS (or
    results written before the share was recorded)."""
    share = run.get("worker_sm_percent")
    if share is None:
        return ""
    if share != "auto":
        return f"share {share} %"
    chosen = run.get("chosen_worker_sm_percent")
    return "share auto, undecided" if chosen is None else f"share {chosen} %, auto"
