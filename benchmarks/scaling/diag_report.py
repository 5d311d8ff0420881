"""The diagnostic sweep's comparisons and table (``benchmarks.scaling.diag``).

:func:`compare` adds to every phase of a finished run its ratios: ``per_rank_vs_1gpu`` (its ranks' mean steps/s over
the matching single-GPU run's: same model, data path and MPS, no knobs; 1.0 is perfect scaling per rank),
``speedup_vs_1gpu`` (seeds/s over that run's) and, for a knob variant, ``vs_no_knobs`` (its ranks' steps/s over the
same run without knobs). :func:`table_rows` flattens every finished run and phase into one row per rank with the
median phase times of its timeline (ms) and its CPU figures; :func:`print_table` prints them.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["TIMELINE_KEYS", "compare", "print_table", "table_rows"]

#: the timeline figures a table row carries (medians, ms; see benchmarks/scaling/timeline.py)
TIMELINE_KEYS = ("step", "fwd", "bwd", "comm", "comm_tail", "opt", "gap", "h_step", "h_fwd", "h_bwd", "h_opt",
                 "h_between", "h_fetch", "h_handover", "h_lightning", "buckets")  # fmt: skip


def _mean_rate(phase: dict[str, Any]) -> float:
    rates = phase.get("rank_steps_per_s") or [0.0]
    return sum(rates) / len(rates)


def _find(runs: list[dict[str, Any]], run: dict[str, Any], gpus: Optional[int]) -> Optional[dict[str, Any]]:
    """The finished run without knobs, not independent, of ``run``'s model, data path and MPS, on ``gpus`` GPUs
    (``None``: ``run``'s own count)."""
    for other in runs:
        if (other.get("status") == "ok" and other.get("knobs_label") is None and not other.get("independent")
                and other.get("group") != "knobs" and other["model"] == run["model"]
                and other["pipeline"] == run["pipeline"] and other["mps"] == run["mps"]
                and other["gpus"] == (run["gpus"] if gpus is None else gpus)):  # fmt: skip
            return other
    return None


def compare(runs: list[dict[str, Any]]) -> None:
    """Add each finished run's ratios to its phases, in place (see the module docstring)."""
    for run in runs:
        if run.get("status") != "ok":
            continue
        one = _find(runs, run, 1)
        same = _find(runs, run, None) if run.get("knobs_label") is not None else None
        for name, phase in (run.get("phases") or {}).items():
            base = (one or {}).get("phases", {}).get(name)
            if base and _mean_rate(base) > 0:
                phase["per_rank_vs_1gpu"] = _mean_rate(phase) / _mean_rate(base)
                phase["speedup_vs_1gpu"] = phase["seeds_per_s"] / base["seeds_per_s"]
            plain = (same or {}).get("phases", {}).get(name)
            if plain and _mean_rate(plain) > 0:
                phase["vs_no_knobs"] = _mean_rate(phase) / _mean_rate(plain)


def _host(diag: dict[str, Any], phase: str) -> dict[str, Any]:
    load = (diag.get("host_load") or {}).get(phase) or {}
    out: dict[str, Any] = {"machine_busy_cores": load.get("machine_busy_cores"), "cpu_count": load.get("cpu_count")}
    for process in load.get("processes") or []:
        role = process["role"]
        if role in ("trainer", "worker"):
            out[f"{role}_cores"] = process["cores"]
            out[f"{role}_threads"] = process["threads"]
            out[f"{role}_involuntary_per_s"] = process["involuntary_per_s"]
            out[f"{role}_cpu"] = process.get("main_cpu")  # where its main thread was when the phase ended
    return out


def table_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per finished run, phase and rank: the run's name and ratios, the rank's steps/s, its median phase
    times (:data:`TIMELINE_KEYS`, ms) and its CPU figures (``trainer_cores``, ``worker_cores``, threads,
    involuntary context switches per second, the CPU each main thread was on, the machine's busy cores, and the
    share of CPUs at full speed before the run: ``host_fast_share``, :mod:`benchmarks.common.cpu_speed`)."""
    rows = []
    for run in runs:
        if run.get("status") != "ok":
            continue
        for name, phase in (run.get("phases") or {}).items():
            for rank, diag in enumerate(run.get("per_rank_diag") or []):
                medians = (((diag or {}).get("timeline") or {}).get("phases") or {}).get(name, {}).get("median", {})
                rows.append({"run": run["name"], "phase": name, "gpus": run["gpus"], "rank": rank,
                             "steps_per_s": phase["rank_steps_per_s"][rank],
                             "per_rank_vs_1gpu": phase.get("per_rank_vs_1gpu"),
                             "speedup_vs_1gpu": phase.get("speedup_vs_1gpu"), "vs_no_knobs": phase.get("vs_no_knobs"),
                             **{k: medians.get(k) for k in TIMELINE_KEYS}, **_host(diag or {}, name),
                             "host_fast_share": (run.get("host_cpus") or {}).get("fast_share")})  # fmt: skip
    return rows


def _f(value: Any, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def print_table(rows: list[dict[str, Any]]) -> None:
    """The rows as a fixed-width table (ms medians; cores = CPU seconds per second)."""
    head = (f"{'run':<44} {'phase':<5} {'r':>1} {'st/s':>6} {'x1gpu':>5} {'step':>6} {'fwd':>5} {'bwd':>5} "
            f"{'comm':>5} {'tail':>5} {'opt':>5} {'gap':>5} {'h_step':>6} {'h_betw':>6} {'h_fet':>5} {'h_lig':>5} "
            f"{'cores':>5} {'wcore':>5} {'invol':>6} {'busy':>5} {'cpu':>4} {'fast':>5}")  # fmt: skip
    print("\n" + head)
    for r in rows:
        print(f"{r['run'][:44]:<44} {r['phase']:<5} {r['rank']:>1} {_f(r['steps_per_s'], '.1f'):>6} "
              f"{_f(r['per_rank_vs_1gpu']):>5} {_f(r['step']):>6} {_f(r['fwd']):>5} {_f(r['bwd']):>5} "
              f"{_f(r['comm']):>5} {_f(r['comm_tail']):>5} {_f(r['opt']):>5} {_f(r['gap']):>5} {_f(r['h_step']):>6} "
              f"{_f(r['h_between']):>6} {_f(r['h_fetch']):>5} {_f(r['h_lightning']):>5} "
              f"{_f(r.get('trainer_cores')):>5} {_f(r.get('worker_cores')):>5} "
              f"{_f(r.get('trainer_involuntary_per_s'), '.0f'):>6} {_f(r.get('machine_busy_cores'), '.1f'):>5} "
              f"{_f(r.get('trainer_cpu'), 'd'):>4} {_f(r.get('host_fast_share')):>5}")  # fmt: skip
