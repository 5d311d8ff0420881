"""The drift-robust comparison's figures (``benchmarks.scaling.confirm``): per configuration the median over repeat
blocks, and the ratios taken inside each block (a configuration against the block's 1-GPU run, ``Ngpu`` against
``Ngpu-torch``), then their median over the blocks; plus the issue's aims against those medians.

A run's rate in a phase is its ranks' mean steps per second by the epoch clock (``rate``, what a user gets, the
logging steps' pauses included) and ``1000 /`` the ranks' mean of their median step interval (``median_rate``, the
steady step without those pauses). Ratios: ``per_rank`` (steps/s a rank over the 1-GPU run's) and ``speedup``
(seeds/s over the 1-GPU run's, so ``gpus x per_rank`` for DDP runs).
"""

from __future__ import annotations

import statistics
from typing import Any, Optional

__all__ = ["AIMS", "block_ratios", "print_summary", "run_rates", "summarize"]

#: the issues' aims per GPU count and model, on the data path: seeds/s of the N-GPU run over the 1-GPU run's
#: (``speedup``) and each rank's steps/s over the 1-GPU run's (``per_rank``); 2 GPUs: issue 39, 4 and 8: issue 42
AIMS: dict[int, dict[str, dict[str, float]]] = {
    2: {"heavy": {"speedup": 1.9, "per_rank": 0.95}, "light": {"speedup": 1.8, "per_rank": 0.95}},
    4: {"heavy": {"speedup": 3.7, "per_rank": 0.92}, "light": {"speedup": 3.4, "per_rank": 0.92}},
    8: {"heavy": {"speedup": 7.0, "per_rank": 0.92}, "light": {"speedup": 6.5, "per_rank": 0.92}},
}


def run_rates(run: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per phase of a finished run: ``rate`` (mean steps/s a rank, epoch clock), ``median_rate`` (1000 / the ranks'
    mean median step in ms; absent without a timeline) and ``seeds_per_s``."""
    out: dict[str, dict[str, float]] = {}
    for phase, figures in (run.get("phases") or {}).items():
        rates = figures.get("rank_steps_per_s") or []
        entry = {"rate": sum(rates) / len(rates) if rates else 0.0, "seeds_per_s": float(figures.get("seeds_per_s", 0.0))}
        steps = [(((d or {}).get("timeline") or {}).get("phases") or {}).get(phase, {}).get("median", {}).get("step")
                 for d in run.get("per_rank_diag") or []]  # fmt: skip
        steps = [s for s in steps if s]
        if steps:
            entry["median_rate"] = 1000.0 / (sum(steps) / len(steps))
        out[phase] = entry
    return out


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def block_ratios(block: dict[str, dict[str, Any]], base: str, pairs: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Ratios inside one block (``label -> finished run``): each run against ``base``'s (``per_rank``,
    ``per_rank_median``, ``speedup``) and, for each ``label -> other`` of ``pairs``, against ``other``'s
    (``vs_<other>``), per phase. Labels missing from the block get no ratio."""
    out: dict[str, dict[str, Any]] = {}
    rates = {label: run_rates(run) for label, run in block.items()}
    for label, mine in rates.items():
        entry: dict[str, Any] = {}
        for phase, figures in mine.items():
            ref = rates.get(base, {}).get(phase, {})
            ratios = {"per_rank": _ratio(figures["rate"], ref.get("rate")),
                      "per_rank_median": _ratio(figures.get("median_rate"), ref.get("median_rate")),
                      "speedup": _ratio(figures["seeds_per_s"], ref.get("seeds_per_s"))}  # fmt: skip
            other = pairs.get(label)
            if other is not None:
                ratios[f"vs_{other}"] = _ratio(figures["rate"], rates.get(other, {}).get(phase, {}).get("rate"))
            entry[phase] = {k: v for k, v in ratios.items() if v is not None}
        out[label] = entry
    return out


def _median(values: list[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def summarize(runs: list[dict[str, Any]], base: str, pairs: dict[str, str]) -> dict[str, Any]:
    """Per model: per label and phase the rates of every block and their medians, the within-block ratios and their
    medians (``ratios``), and ``aims``: the data path's medians against :data:`AIMS` for the ``Ngpu`` label with the
    most GPUs (warm-up runs and runs that did not finish count nowhere)."""
    models: dict[str, Any] = {}
    done = [r for r in runs if r.get("status") == "ok" and not r.get("warmup")]
    for model in dict.fromkeys(r["model"] for r in done):
        blocks: dict[int, dict[str, dict[str, Any]]] = {}
        for run in (r for r in done if r["model"] == model):
            blocks.setdefault(int(run["block"]), {})[run["config"]] = run
        per_block = {b: block_ratios(block, base, pairs) for b, block in sorted(blocks.items())}
        labels = list(dict.fromkeys(label for block in blocks.values() for label in block))
        table: dict[str, Any] = {}
        for label in labels:
            runs_of = [blk[label] for blk in blocks.values() if label in blk]
            hits = [r["expected_hit_rate"] for r in runs_of if r.get("expected_hit_rate") is not None]
            entry: dict[str, Any] = {"gpus": runs_of[0]["gpus"], "policy": runs_of[0].get("chosen_policy"),
                                     "expected_hit_rate": _median(hits)}  # fmt: skip
            phases = dict.fromkeys(p for blk in blocks.values() if label in blk for p in blk[label].get("phases") or {})
            for phase in phases:
                rates = [run_rates(blk[label]).get(phase, {}) for blk in blocks.values() if label in blk]
                ratios = [per_block[b].get(label, {}).get(phase, {}) for b in per_block if label in blocks[b]]
                names = dict.fromkeys(k for r in ratios for k in r)
                entry[phase] = {
                    "rate_blocks": [r.get("rate") for r in rates], "rate": _median([r["rate"] for r in rates if "rate" in r]),
                    "median_rate": _median([r["median_rate"] for r in rates if "median_rate" in r]),
                    "ratios": {k: _median([r[k] for r in ratios if k in r]) for k in names},
                    "ratio_blocks": {k: [r.get(k) for r in ratios] for k in names},
                }  # fmt: skip
            table[label] = entry
        models[model] = {"blocks": sorted(blocks), "configs": table, "aims": _aims(model, table, base)}
    return models


def _aims(model: str, table: dict[str, Any], base: str) -> dict[str, Any]:
    """The data path's median ratios of the ``Ngpu`` label with the most GPUs against :data:`AIMS`."""
    candidates = [(e["gpus"], label) for label, e in table.items() if label.endswith("gpu") and label != base]
    if not candidates:
        return {}
    gpus, label = max(candidates)
    aims = AIMS.get(gpus, {}).get(model)
    if aims is None:
        return {}
    ratios = (table[label].get("data") or {}).get("ratios") or {}
    out: dict[str, Any] = {"config": label, "gpus": gpus}
    for name, target in aims.items():
        value = ratios.get(name)
        out[name] = {"value": value, "aim": target, "met": None if value is None else value >= target}
    return out


def _f(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_summary(summary: dict[str, Any]) -> None:
    """One table per model: each label's median steps/s a rank on the data path and model-only (the blocks' own in
    brackets), its median ratios to the 1-GPU run (per rank and seeds/s) and to its pair (``Ngpu`` over
    ``Ngpu-torch``, ``Ngpu-clique`` over ``Ngpu``), its cache's expected hit rate, then the aims."""
    for model, entry in summary.items():
        print(f"\n{model}: medians over blocks {entry['blocks']} (ratios taken inside each block)")
        print(f"{'config':<12} {'data st/s a rank':<30} {'model-only st/s a rank':<30} {'x1gpu':>6} {'x1gpu(m)':>8} "
              f"{'speedup':>7} {'vs pair':>7} {'hit':>5}")  # fmt: skip
        for label, figures in entry["configs"].items():
            data, model_only = figures.get("data") or {}, figures.get("model") or {}

            def cell(phase: dict[str, Any]) -> str:
                blocks = ", ".join(_f(v, ".1f") for v in phase.get("rate_blocks") or [])
                return f"{_f(phase.get('rate'), '.1f')} ({blocks})"

            versus = next((v for k, v in (data.get("ratios") or {}).items() if k.startswith("vs_")), None)
            print(f"{label:<12} {cell(data):<30} {cell(model_only):<30} "
                  f"{_f((data.get('ratios') or {}).get('per_rank'), '.3f'):>6} "
                  f"{_f((model_only.get('ratios') or {}).get('per_rank'), '.3f'):>8} "
                  f"{_f((data.get('ratios') or {}).get('speedup'), '.2f'):>7} {_f(versus, '.3f'):>7} "
                  f"{_f(figures.get('expected_hit_rate'), '.3f'):>5}")  # fmt: skip
        for name, aim in (entry.get("aims") or {}).items():
            if isinstance(aim, dict):
                verdict = "n/a" if aim["met"] is None else ("met" if aim["met"] else "NOT met")
                print(f"  aim {name} ({entry['aims']['config']}): {_f(aim['value'], '.3f')} >= {aim['aim']:.2f}: {verdict}")
