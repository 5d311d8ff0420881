"""``--repeats N``: the scaling sweep in N blocks of alternating order, each run's speed-up taken against the one-GPU run
of its own block, then the medians.

On the lent 2 x H200 VM a run's rate depends on the speed its ranks' CPUs happen to run at while it trains
(:mod:`benchmarks.common.cpu_speed`): the same light 2-GPU run trained at 0.71x and 0.99x of one GPU a rank, minutes
apart (2026-11-30). One run a row cannot then decide a few percent of speed-up. Inside a block the runs follow each
other; reversing the order every other block spreads a drift over both sides of a ratio.
"""

from __future__ import annotations

from statistics import median
from typing import Any, NamedTuple

from benchmarks.end_to_end.repeats import block_order

__all__ = ["Planned", "planned_runs", "sweep_order", "speedups_by_block", "repeat_lines", "repeat_summary"]


class Planned(NamedTuple):
    """One run of the sweep: its rank count, data path, cache budget and policy (``loader``: ``ours`` or ``pyg``)."""

    gpus: int
    pipeline: str
    budget: float
    policy: str
    loader: str = "ours"


def planned_runs(gpus: str, pipelines: str, budgets: str, policies: str, pyg_gpus: str, available: int) -> list[Planned]:
    """The runs of one block, from the comma-separated flags: ours for every rank count up to ``available`` (one GPU
    once, with the first policy: there every policy is replicate), then PyG's rank counts."""
    first_policy = policies.split(",")[0]
    out = [Planned(g, pipeline, float(budget), policy)
           for g in (int(x) for x in gpus.split(",")) if g <= available
           for pipeline in pipelines.split(",") for budget in budgets.split(",") for policy in policies.split(",")
           if g > 1 or policy == first_policy]  # fmt: skip
    out += [Planned(g, "off", 0.0, "-", "pyg") for g in (int(x) for x in pyg_gpus.split(",") if x.strip()) if g <= available]
    return out


def sweep_order(plan: list[Planned], repeats: int) -> list[tuple[int, Planned]]:
    """``(block, run)`` in the order they run: the plan in even blocks, reversed in odd ones."""
    return [(block, run) for block in range(max(1, repeats)) for run in block_order(plan, block)]


def _key(run: dict[str, Any]) -> tuple:
    return (run["gpus"], run.get("loader", "ours"), run.get("pipeline"), run["budget_fraction"], run["policy"])


def _baseline(runs: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any] | None:
    """The one-GPU run of ``run``'s loader, budget and data path, in ``run``'s block if that block has one."""
    same = [b for b in runs if b["gpus"] == 1 and b["budget_fraction"] == run["budget_fraction"]
            and b.get("pipeline") == run.get("pipeline") and b.get("loader") == run.get("loader")
            and "seeds_per_s" in b]  # fmt: skip
    in_block = [b for b in same if b.get("repeat", 0) == run.get("repeat", 0)]
    return (in_block or same or [None])[0]


def speedups_by_block(runs: list[dict[str, Any]]) -> None:
    """Set each finished run's ``speedup_vs_1gpu`` (against its block's one-GPU run, see :func:`_baseline`) and
    ``vs_pyg_same_gpus`` (against PyG's run of as many GPUs in the same block, else any block)."""
    for r in runs:
        if "seeds_per_s" not in r:
            continue
        base = _baseline(runs, r)
        if base is not None:
            r["speedup_vs_1gpu"] = r["seeds_per_s"] / base["seeds_per_s"]
        pyg = [b for b in runs if b.get("loader") == "pyg" and b["gpus"] == r["gpus"] and "seeds_per_s" in b]
        pyg = [b for b in pyg if b.get("repeat", 0) == r.get("repeat", 0)] or pyg
        if pyg and r.get("loader") != "pyg":
            r["vs_pyg_same_gpus"] = r["seeds_per_s"] / pyg[0]["seeds_per_s"]


def repeat_lines(runs: list[dict[str, Any]]) -> list[str]:
    """With runs in more than one block: per run of the plan, its seeds/s, speed-up and steps/s a rank in each block,
    their medians, and the median share of CPUs at full speed before it; ``[]`` with one block."""
    blocks = sorted({r.get("repeat", 0) for r in runs})
    if len(blocks) < 2:
        return []
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(_key(r), []).append(r)
    lines = [f"\nrepeats: {len(blocks)} blocks, speed-up against each block's own 1-GPU run (medians last)",
             f"{'GPUs':>4} {'loader':>6} {'policy':>9} {'seeds/s per block':>34} {'speed-up per block':>24} "
             f"{'median seeds/s':>14} {'median x1':>9} {'steps/s a rank':>14} {'fast CPUs':>9}"]  # fmt: skip
    for key, group in groups.items():
        done = [r for r in group if "seeds_per_s" in r]
        if not done:
            lines.append(f"{key[0]:>4} {key[1]:>6} {key[4]:>9} no finished run")
            continue
        ups = [r["speedup_vs_1gpu"] for r in done if "speedup_vs_1gpu" in r]
        fast = [r["host_cpus"]["fast_share"] for r in done if (r.get("host_cpus") or {}).get("fast_share") is not None]
        rates = ", ".join(format(r["seeds_per_s"], ".0f") for r in done)
        lines.append(f"{key[0]:>4} {key[1]:>6} {key[4]:>9} {rates:>34} "
                     f"{', '.join(format(u, '.2f') for u in ups):>24} {median(r['seeds_per_s'] for r in done):>14.0f} "
                     f"{median(ups) if ups else float('nan'):>9.2f} "
                     f"{median(r['rank_steps_per_s'] for r in done):>14.1f} "
                     f"{median(fast) if fast else float('nan'):>9.2f}")  # fmt: skip
    return lines


def repeat_summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The medians of :func:`repeat_lines` as JSON rows (one per run of the plan that finished at least once)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:
        if "seeds_per_s" in r:
            groups.setdefault(_key(r), []).append(r)
    out = []
    for (gpus, loader, pipeline, budget, policy), done in groups.items():
        ups = [r["speedup_vs_1gpu"] for r in done if "speedup_vs_1gpu" in r]
        out.append({"gpus": gpus, "loader": loader, "pipeline": pipeline, "budget_fraction": budget, "policy": policy,
                    "blocks": len(done), "seeds_per_s": [r["seeds_per_s"] for r in done],
                    "median_seeds_per_s": median(r["seeds_per_s"] for r in done),
                    "median_speedup_vs_1gpu": median(ups) if ups else None,
                    "median_rank_steps_per_s": median(r["rank_steps_per_s"] for r in done)})  # fmt: skip
    return out
