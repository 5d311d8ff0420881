"""``--repeats N``: the rows run in N blocks, in alternating order, and each row is compared with model-only inside its
own block.

On one machine the same row has measured 106 and 136 steps/s on two machine starts, and a row's rate drifts within a
run, so one row's steps/s against another's, run minutes apart, cannot decide a few percent. Inside a block the rows
run back to back; reversing the order every other block spreads a drift over both sides. The report gives each row's
steps/s and ratio to model-only per block, and their medians.
"""

from __future__ import annotations

from statistics import median
from typing import Any, Optional, Sequence, TypeVar

from benchmarks.end_to_end.results import finished, models_in

__all__ = ["block_order", "repeat_table"]

T = TypeVar("T")


def block_order(rows: Sequence[T], block: int) -> list[T]:
    """The rows of block ``block``: in the given order in even blocks, reversed in odd ones."""
    return list(rows) if block % 2 == 0 else list(reversed(rows))


def _rates(results: dict[str, Any], model: str) -> dict[str, dict[int, float]]:
    """steps/s by row, then by block, of ``model``'s finished runs (a run without a block counts as block 0)."""
    rates: dict[str, dict[int, float]] = {}
    for run in results.get("runs", []):
        if run["model"] == model and finished(run):
            rates.setdefault(run["row"], {})[run.get("repeat", 0)] = run["steps_per_s"]
    return rates


def _ratios(rates: dict[str, dict[int, float]], row: str) -> dict[int, float]:
    bound = rates.get("model_only", {})
    return {b: rate / bound[b] for b, rate in rates.get(row, {}).items() if bound.get(b)}


def _cell(values: dict[int, float], blocks: int, spec: str) -> str:
    return ", ".join("–" if values.get(b) is None else f"{values[b]:{spec}}" for b in range(blocks))


def _median(values: dict[int, float]) -> Optional[float]:
    return median(values.values()) if values else None


def repeat_table(results: dict[str, Any]) -> list[str]:
    """Report lines for a run with ``--repeats`` > 1 (none otherwise): per model and row, steps/s and the ratio to
    model-only in each block, and their medians."""
    blocks = int(results.get("args", {}).get("repeats") or 1)
    if blocks < 2:
        return []
    out = [f"## Repeats: {blocks} blocks, the rows in alternating order", "",
           "Each block runs every row once; the ratio to model-only is taken inside a block, then the median over the "
           "blocks. The tables above show each row's last run.", ""]  # fmt: skip
    for model in models_in(results):
        rates = _rates(results, model)
        out += [f"### {model} model", "", "| row | steps/s by block | median | × model-only by block | median × |",
                "|---|---|---|---|---|"]
        for row, by_block in rates.items():
            ratios = _ratios(rates, row)
            mid, mid_ratio = _median(by_block), _median(ratios)
            out.append(f"| `{row}` | {_cell(by_block, blocks, '.1f')} | {mid:.1f} | {_cell(ratios, blocks, '.3f')} | "
                       + ("–" if mid_ratio is None else f"{mid_ratio:.3f}×") + " |")
        out.append("")
    return out
