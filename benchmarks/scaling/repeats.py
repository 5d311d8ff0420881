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


def _reference(runs: list[dict[str, Any]], run: dict[str, Any], matches: Any) -> dict[str, Any] | None:
    """The first finished run that ``matches``, in ``run``'s block if that block has one, else in any block."""
    same = [b for b in runs if "seeds_per_s" in b and matches(b)]
    in_block = [b for b in same if b.get("repeat", 0) == run.get("repeat", 0)]
    return (in_block or same or [None])[0]


def speedups_by_block(runs: list[dict[str, Any]]) -> None:
    """Set each finished run's ``speedup_vs_1gpu`` (against the one-GPU run of its loader, budget and data path) and
    ``vs_pyg_same_gpus`` (against PyG's run of as many GPUs), each reference from the run's own block where it has
    one."""
    for r in runs:
        if "seeds_per_s" not in r:
            continue
        base = _reference(runs, r, lambda b: b["gpus"] == 1 and b["budget_fraction"] == r["budget_fraction"]
                          and b.get("pipeline") == r.get("pipeline") and b.get("loader") == r.get("loader"))  # fmt: skip
        if base is not None:
            r["speedup_vs_1gpu"] = r["seeds_per_s"] / base["seeds_per_s"]
        pyg = _reference(runs, r, lambda b: b.get("loader") == "pyg" and b["gpus"] == r["gpus"])
        if pyg is not None and r.get("loader") != "pyg":
            r["vs_pyg_same_gpus"] = r["seeds_per_s"] / pyg["seeds_per_s"]


def repeat_summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run of the plan, in plan order: its seeds/s and speed-ups over the blocks where it finished, their medians,
    its median steps/s a rank and the median share of CPUs at full speed before it (``blocks`` 0: it never finished)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(_key(r), []).append(r)
    out = []
    for (gpus, loader, pipeline, budget, policy), group in groups.items():
        done = [r for r in group if "seeds_per_s" in r]
        ups = [r["speedup_vs_1gpu"] for r in done if "speedup_vs_1gpu" in r]
        fast = [r["host_cpus"]["fast_share"] for r in done if (r.get("host_cpus") or {}).get("fast_share") is not None]
        out.append({"gpus": gpus, "loader": loader, "pipeline": pipeline, "budget_fraction": budget, "policy": policy,
                    "blocks": len(done), "seeds_per_s": [r["seeds_per_s"] for r in done], "speedups_vs_1gpu": ups,
                    "median_seeds_per_s": median(r["seeds_per_s"] for r in done) if done else None,
                    "median_speedup_vs_1gpu": median(ups) if ups else None,
                    "median_rank_steps_per_s": median(r["rank_steps_per_s"] for r in done) if done else None,
                    "median_fast_cpu_share": median(fast) if fast else None})  # fmt: skip
    return out


def repeat_lines(runs: list[dict[str, Any]], summary: list[dict[str, Any]] | None = None) -> list[str]:
    """:func:`repeat_summary` (``summary`` where the caller has it already) as a table, with runs in more than one
    block; ``[]`` with one block."""
    if len({r.get("repeat", 0) for r in runs}) < 2:
        return []
    nan = float("nan")
    lines = [f"\nrepeats: {len({r.get('repeat', 0) for r in runs})} blocks, speed-up against each block's own 1-GPU run "
             "(medians last)",
             f"{'GPUs':>4} {'loader':>6} {'policy':>9} {'seeds/s per block':>34} {'speed-up per block':>24} "
             f"{'median seeds/s':>14} {'median x1':>9} {'steps/s a rank':>14} {'fast CPUs':>9}"]  # fmt: skip
    for row in summary if summary is not None else repeat_summary(runs):
        head = f"{row['gpus']:>4} {row['loader']:>6} {row['policy']:>9}"
        if not row["blocks"]:
            lines.append(f"{head} no finished run")
            continue
        rates = ", ".join(format(v, ".0f") for v in row["seeds_per_s"])
        ups = ", ".join(format(v, ".2f") for v in row["speedups_vs_1gpu"])
        lines.append(f"{head} {rates:>34} {ups:>24} {row['median_seeds_per_s']:>14.0f} "
                     f"{row['median_speedup_vs_1gpu'] or nan:>9.2f} {row['median_rank_steps_per_s']:>14.1f} "
                     f"{row['median_fast_cpu_share'] or nan:>9.2f}")  # fmt: skip
    return lines
