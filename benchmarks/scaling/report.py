"""The scaling sweep's report: throughput from rank 0's epochs, speed-ups, the table, the topology, the JSON."""

from __future__ import annotations

import argparse
import subprocess
from typing import Any, Optional

from benchmarks.common.results import write_json
from benchmarks.scaling.repeats import repeat_lines, repeat_summary, speedups_by_block
from lightning_zerocopy.cache.nvidia_topo import GpuTopology, TopologyParseError

__all__ = ["report", "throughput", "topology"]


def _pct(counts: Optional[dict[str, float]]) -> str:
    """A type's hit rate with its local / peer / host rows, or why there is none."""
    if not counts:
        return "n/a (gathered in another process or not at all)"
    return (f"{counts['hit_rate']:.1%} (local {counts['local_rows']:.0f}, peer {counts['peer_rows']:.0f}, "
            f"host {counts['host_rows']:.0f})")


def _mean(values: list[Any]) -> Optional[float]:
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def topology() -> dict[str, Any]:
    """``nvidia-smi topo -m``, the GPU list and the NVLink cliques read from the matrix (or why they are missing)."""
    out: dict[str, Any] = {}
    for key, cmd in (("topo_m", ["nvidia-smi", "topo", "-m"]), ("gpus", ["nvidia-smi", "-L"])):
        try:
            out[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            out[key] = f"unavailable: {exc!r}"
    try:  # the groups clique would form if peer access ran exactly over the NVLinks, beside the runs' measured ones
        links = GpuTopology.parse(out["topo_m"])
        out["nvlink_cliques"] = links.nvlink_cliques()
        out["links"] = [list(row) for row in links.links]
    except TopologyParseError as exc:
        out["nvlink_cliques"] = f"unavailable: {exc}"
    return out


def throughput(rank0: dict[str, Any], gpus: int) -> dict[str, Any]:
    """A run's throughput from rank 0's epochs, the first dropped (warm-up): every rank trains as many batches of its
    own seeds as rank 0, so seeds/s over all ranks is ``gpus x batch size x steps / seconds``; the scaling figure
    (``speedup_vs_1gpu``, :func:`report`) is that over the 1-GPU run's. Epochs of equal steps (no ``--run-budget-s``
    cap) give steps / mean epoch time, as before the cap existed."""
    keep = slice(1, None) if len(rank0["epoch_s"]) > 1 else slice(None)
    seconds, steps = rank0["epoch_s"][keep], rank0["epoch_steps"][keep]
    rate = sum(steps) / sum(seconds)
    batch = rank0["batch_size"]
    return {"epoch_s": sum(seconds) / len(seconds), "steps_per_epoch": steps[-1], "measured_steps": sum(steps),
            "rank_steps_per_s": rate, "batch_size": batch, "seeds_per_s": gpus * batch * rate}


def report(args: argparse.Namespace, runs: list[dict[str, Any]], available: int, torch_version: str,
            graph: Optional[dict[str, Any]] = None) -> dict[str, Any]:  # fmt: skip
    """Speed-ups, the table and the JSON (``--out``) of the runs so far (``graph``: the heterogeneous graph's
    summary, under ``--graph hetero``)."""
    speedups_by_block(runs)  # each against its block's 1-GPU run and PyG run (one block: as before)
    print(f"\n{'GPUs':>4} {'loader':>6} {'policy':>9} {'budget':>6} {'pipeline':>8} {'chosen':>9} {'seeds/s':>9} "
          f"{'steps/s':>7} {'speed-up':>8} {'x PyG':>6} {'stall':>6} {'hit rate':>8} {'local':>11} {'peer':>11} "
          f"{'host':>11} {'host GB/s':>9} {'PSS/data':>8}")  # fmt: skip
    for r in runs:
        if "seeds_per_s" not in r:
            continue
        p = r["per_rank"][0]
        stall = _mean(r.get("stall_frac") or [])
        print(f"{r['gpus']:>4} {r.get('loader', 'ours'):>6} {r['policy']:>9} {r['budget_fraction']:>6.0%} "
              f"{r.get('pipeline', '-'):>8} {r['chosen_policy'] or '-':>9} {r['seeds_per_s']:>9.0f} "
              f"{r['rank_steps_per_s']:>7.1f} {r.get('speedup_vs_1gpu', float('nan')):>8.2f} "
              f"{r.get('vs_pyg_same_gpus', float('nan')):>6.2f} {stall if stall is not None else float('nan'):>6.1%} "
              f"{p.get('cache/hit_rate', float('nan')):>8.1%} {p.get('cache/local_rows', 0):>11.0f} "
              f"{p.get('cache/peer_rows', 0):>11.0f} {p.get('cache/host_rows', 0):>11.0f} "
              f"{p.get('cache/host_read_GBps', float('nan')):>9.2f} {r.get('host_pss_over_data', float('nan')):>8.2f}")  # fmt: skip
    for r in runs:  # a cache over typed rows: each featured type's hit rate on every rank
        for rank, per_type in enumerate(r.get("cache_per_type") or []):
            rates = ", ".join(f"{t} {_pct(c)}" for t, c in (per_type or {}).items())
            print(f"{r['gpus']} GPU(s) {r['policy']} rank {rank}: hit rate per type: {rates}")
    summary = repeat_summary(runs)  # --repeats: each run of the plan over the blocks, and its medians
    lines = repeat_lines(runs, summary)
    if lines:
        print("\n".join(lines))
    report = {"benchmark": "scaling", "graph": args.graph,
              "config": {k: v for k, v in vars(args).items() if k != "argv"}, "gpu_count": available, "topology": topology(), "torch": torch_version, "runs": runs}  # fmt: skip
    if lines:
        report["repeats"] = summary
    if graph is not None:
        report["hetero_graph"] = graph
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return report
