"""PNG plots of an end-to-end benchmark run (matplotlib, headless), from its results dict."""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.end_to_end.results import PLOTS, finished, models_in, runs_by_row, target_acc  # noqa: E402

__all__ = ["write_plots"]


def _ok_runs(results: dict[str, Any], model: str) -> list[dict[str, Any]]:
    return [r for r in runs_by_row(results, model).values() if finished(r)]  # a row's last run (--repeats)


def _per_model(results: dict[str, Any], out_dir: str, name: str, draw: Callable[[Any, str, list], None]) -> str:
    models = models_in(results) or ["none"]
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        runs = _ok_runs(results, model)
        if runs:
            draw(ax, model, runs)
        else:
            ax.text(0.5, 0.5, "no finished rows", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{model} model")
    fig.suptitle(PLOTS[name])
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(key: str, label: str, scale: float = 1.0, bound: Optional[str] = None) -> Callable[[Any, str, list], None]:
    def draw(ax: Any, model: str, runs: list) -> None:
        names = [r["row"] for r in runs]
        values = [(r.get(key) or 0.0) * scale for r in runs]
        colors = ["tab:gray" if r["row"] in ("model_only", "pyg") else "tab:blue" for r in runs]
        ax.barh(names, values, color=colors)
        ax.invert_yaxis()
        ax.set_xlabel(label)
        ref = next((r for r in runs if r["row"] == bound), None) if bound else None
        if ref is not None:
            ax.axvline(ref[key] * scale, color="tab:red", linestyle="--", label=bound)
            ax.legend(loc="lower right")

    return draw


def _accuracy(results: dict[str, Any]) -> Callable[[Any, str, list], None]:
    def draw(ax: Any, model: str, runs: list) -> None:
        for r in runs:
            curve = r.get("val_curve") or []
            if curve:
                ax.plot([c[1] for c in curve], [c[2] for c in curve], marker="o", markersize=3, label=r["row"])
        target = target_acc(results, model)
        if target is not None:
            ax.axhline(target, color="black", linestyle=":", label=f"target {target:.3f}")
        ax.set_xlabel("training wall time, s")
        ax.set_ylabel("validation accuracy")
        ax.legend(fontsize=7)

    return draw


def _latency(ax: Any, model: str, runs: list) -> None:
    data = [r.get("step_ms") or [0.0] for r in runs]
    try:
        ax.boxplot(data, orientation="horizontal", showfliers=False)  # matplotlib >= 3.10
    except TypeError:
        ax.boxplot(data, vert=False, showfliers=False)
    ax.set_yticks(range(1, len(runs) + 1), [r["row"] for r in runs])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("step interval, ms (box: quartiles, whiskers: 1.5 IQR)")


def write_plots(results: dict[str, Any], out_dir: str) -> list[str]:
    """Write every plot of :data:`benchmarks.end_to_end.results.PLOTS` into ``out_dir``; returns the paths."""
    return [
        _per_model(results, out_dir, "steps_per_s.png", _bars("steps_per_s", "steps/s", bound="model_only")),
        _per_model(results, out_dir, "val_acc_over_time.png", _accuracy(results)),
        _per_model(results, out_dir, "stall_share.png", _bars("stall_frac", "stall, % of step", scale=100.0)),
        _per_model(results, out_dir, "host_read_gbps.png", _bars("gather_GBps", "feature GB/s delivered")),
        _per_model(results, out_dir, "batch_latency.png", _latency),
    ]
