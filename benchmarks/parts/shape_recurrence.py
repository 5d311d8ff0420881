"""How often a sampled batch's GEMM row counts recur, and what cuBLAS's heuristics cache would make of them.

cuBLAS picks a GEMM algorithm per problem shape on the host and keeps its picks in a heuristics cache
(``CUBLASLT_HEURISTICS_CACHE_CAPACITY``, 8192 entries by default). Measured on an H200: a shape it has not seen costs
~105-110 µs of host time per call, a cached one ~15 µs (with the cache off every call costs ~85-110 µs). The heavy
model (PyG GraphSAGE, 3 layers, fanouts [15, 10, 5], 1024 seeds, trimmed by ``num_sampled_nodes_per_hop``) runs its
GEMMs on row counts that are prefix sums of the batch's per-hop node counts ``nodes[k]`` (PyG's
``num_sampled_nodes``): ``trim_to_layer`` narrows layer ``l``'s input to the first ``4 - l`` hops, so layer 0 works
on ``nodes[0] + ... + nodes[3]`` rows, layer 1 on ``nodes[0] + nodes[1] + nodes[2]`` and layer 2 on
``nodes[0] + nodes[1]``. Every sampled batch draws counts of its own, so a step pays the new-shape price for each
row count the cache does not hold.

This samples the batches a training run of the heavy model samples, without a GPU: the scaling benchmark's
``SyntheticGraph`` (power-law degrees, average degree 16, 128 features, 32 classes; ``--num-nodes``, 4M there,
1M here by default), our CPU neighbor sampler (:class:`~lightning_zerocopy.sampling.NeighborSampler`, as the
DataModule's builder makes it) and the seeds of the DataModule's training plan
(:class:`~lightning_zerocopy.data.plan.BatchPlan`: the training split shuffled per epoch, 1024 seeds a batch,
``drop_last``, a sampler seed per batch). It records each batch's per-hop node counts and reports:

* the distinct values of each prefix sum (``nodes[0]``, the seed count, is constant and feeds no GEMM; it is listed
  for completeness) over the run, exactly and rounded up to multiples of 64 and 256;
* for LRU caches of 1,024 to 1,048,576 keys, each distinct row count taking ``--keys-per-rowcount`` keys (6: the
  forward and backward GEMMs of ``lin_l`` and ``lin_r``), the hit rate of the GEMM calls in the run's last half and
  the host µs a step would spend choosing algorithms (110 µs a miss, 15 µs a hit, ``--calls-per-rowcount`` calls per
  row count per step), for the exact row counts and for row counts padded to a multiple of 64 or 256.

CPU only::

    python -m benchmarks.parts.shape_recurrence                      # 1M nodes, 3,000 batches
    python -m benchmarks.parts.shape_recurrence --num-nodes 4000000 --batches 6000 --out results/shape_rec_4m.json
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

#: the heavy model's sampling (``benchmarks.scaling``'s ``MODELS["heavy"]``) and batch size
FANOUTS = (15, 10, 5)
BATCH_SIZE = 1024
#: the scaling benchmark's ``SyntheticGraph`` besides its node count (its ``synthetic_kwargs`` defaults)
AVG_DEGREE, FEATURES, CLASSES = 16, 128, 32
#: prefix lengths (hops summed) of the row counts the trimmed 3-layer GraphSAGE's GEMMs run on: layers 2, 1, 0
GEMM_PREFIXES = (2, 3, 4)
#: LRU capacities simulated, in keys
CAPACITIES = (1024, 2048, 4096, 8192, 65536, 1048576)
#: row-count rounding: 1 (exact), then padding to a multiple of 64 and of 256
BUCKETS = (1, 64, 256)
#: host µs of one GEMM call whose shape the heuristics cache misses / holds (H200 measurement)
MISS_US, HIT_US = 110.0, 15.0


# ------------------------------------------------------------------------------------------------- row counts


def prefix_sums(nodes: Sequence[int]) -> list[int]:
    """``[nodes[0], nodes[0] + nodes[1], ...]``: the row counts of the first 1, 2, ... hops of a batch."""
    sums, total = [], 0
    for count in nodes:
        total += int(count)
        sums.append(total)
    return sums


def round_up(rows: int, multiple: int) -> int:
    """``rows`` padded up to a multiple of ``multiple`` (``1``: unchanged)."""
    return -(-rows // multiple) * multiple


def gemm_row_counts(nodes: Sequence[int], bucket: int = 1, prefixes: Sequence[int] = GEMM_PREFIXES) -> list[int]:
    """The distinct GEMM row counts of one batch, in layer order of ``prefixes`` (prefix lengths), each rounded up to
    a multiple of ``bucket``."""
    sums = prefix_sums(nodes)
    return list(dict.fromkeys(round_up(sums[p - 1], bucket) for p in prefixes))


# ------------------------------------------------------------------------------------------------- LRU model


class LRUCache:
    """A least-recently-used set of at most ``capacity`` keys (as cuBLAS's heuristics cache is modeled here)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._keys: OrderedDict[Hashable, None] = OrderedDict()

    def access(self, key: Hashable) -> bool:
        """Look ``key`` up: ``True`` on a hit (it becomes the most recent); on a miss it is inserted, evicting the
        least recent key when full (a capacity of 0 holds nothing)."""
        if key in self._keys:
            self._keys.move_to_end(key)
            return True
        if self.capacity > 0:
            if len(self._keys) >= self.capacity:
                self._keys.popitem(last=False)
            self._keys[key] = None
        return False

    def __len__(self) -> int:
        return len(self._keys)


@dataclass(frozen=True)
class CacheOutcome:
    """What one simulated cache saw over the measured steps."""

    hits: int
    lookups: int
    steps: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def host_us_per_step(self, keys_per_rowcount: int, calls_per_rowcount: int) -> float:
        """Host µs a step spends on algorithm choice: each lookup stands for ``calls_per_rowcount /
        keys_per_rowcount`` GEMM calls, a miss costing :data:`MISS_US` and a hit :data:`HIT_US`."""
        if not self.steps:
            return 0.0
        misses = self.lookups - self.hits
        us = self.hits * HIT_US + misses * MISS_US
        return us * calls_per_rowcount / keys_per_rowcount / self.steps


def simulate_lru(steps: Sequence[Sequence[int]], capacity: int, keys_per_rowcount: int,
                 measure_from: int = 0) -> CacheOutcome:  # fmt: skip
    """Run an LRU of ``capacity`` keys over the steps' row counts, each row count looked up as its
    ``keys_per_rowcount`` keys ``(rows, 0..K-1)`` in turn; count the lookups of steps ``measure_from`` onwards."""
    if keys_per_rowcount < 1:
        raise ValueError(f"keys_per_rowcount must be >= 1, got {keys_per_rowcount}")
    cache = LRUCache(capacity)
    hits = lookups = 0
    for index, row_counts in enumerate(steps):
        measured = index >= measure_from
        for rows in row_counts:
            for part in range(keys_per_rowcount):
                hit = cache.access((rows, part))
                if measured:
                    hits += hit
                    lookups += 1
    return CacheOutcome(hits, lookups, max(0, len(steps) - measure_from))


# ------------------------------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class SampledRun:
    """The per-hop node counts of a run's batches and what sampling them took."""

    nodes: list[list[int]]
    num_nodes: int
    num_edges: int
    train_nodes: int
    steps_per_epoch: int
    graph_s: float
    sample_s: float


def sample_hop_counts(num_nodes: int, batches: int, seed: int = 0, cache_dir: Optional[str] = None,
                      threads: Optional[int] = None, progress_every: int = 0) -> SampledRun:  # fmt: skip
    """Sample ``batches`` training batches of the heavy model from the ``SyntheticGraph`` of ``num_nodes`` (drawn
    and cached on first use) and return their ``num_sampled_nodes``.

    The seeds and sampler seeds are the DataModule's training plan's (``NodeTask.plan``: shuffled, ``drop_last``,
    the ``train`` stream, one sampler seed per batch), epoch after epoch; the sampler is the one its CPU builder opens
    over the host CSC (``CSCGraph.from_edge_index`` of the dataset's ``edge_index``, ``replace=False``).
    """
    from lightning_zerocopy.data.plan import SPLIT_STREAMS, BatchPlan
    from lightning_zerocopy.datasets import SyntheticGraph
    from lightning_zerocopy.graph.csc import CSCGraph
    from lightning_zerocopy.sampling import NeighborSampler

    start = time.perf_counter()
    dataset = SyntheticGraph(num_nodes=num_nodes, avg_degree=AVG_DEGREE, num_features=FEATURES, num_classes=CLASSES,
                             cache_dir=cache_dir, device="cpu")  # fmt: skip
    data = dataset.load()
    graph = CSCGraph.from_edge_index(data.edge_index, data.num_nodes)
    sampler = NeighborSampler(graph, fanouts=list(FANOUTS), replace=False, num_threads=threads)
    plan = BatchPlan(data.train_idx, BATCH_SIZE, shuffle=True, drop_last=True, seed=seed,
                     stream=SPLIT_STREAMS["train"], sampler_seed="batch")  # fmt: skip
    if len(plan) < 1:
        raise ValueError(f"{data.train_idx.numel()} training nodes make no batch of {BATCH_SIZE}: raise --num-nodes")
    graph_s = time.perf_counter() - start
    nodes: list[list[int]] = []
    start = time.perf_counter()
    while len(nodes) < batches:
        item = plan.item(len(nodes) // len(plan), len(nodes) % len(plan))
        nodes.append([int(n) for n in sampler.sample(item.seed_ids, item.batch_seed).num_sampled_nodes])
        if progress_every and len(nodes) % progress_every == 0:
            took = time.perf_counter() - start
            print(f"  {len(nodes):,}/{batches:,} batches, {took / len(nodes) * 1e3:.1f} ms a batch so far", flush=True)
    return SampledRun(nodes, data.num_nodes, data.num_edges, int(data.train_idx.numel()), len(plan), graph_s,
                      time.perf_counter() - start)  # fmt: skip


# ------------------------------------------------------------------------------------------------- report


def distinct_counts(nodes: Sequence[Sequence[int]], buckets: Sequence[int] = BUCKETS) -> dict[str, dict[str, int]]:
    """Per bucket (``"exact"``, ``"pad64"``, ...): the distinct values of each prefix sum (``"p1"`` ... ``"pN"``)
    over the batches, and of the GEMM row counts together (``"gemm"``)."""
    sums = [prefix_sums(n) for n in nodes]
    hops = len(sums[0]) if sums else 0
    result: dict[str, dict[str, int]] = {}
    for bucket in buckets:
        row = {f"p{k + 1}": len({round_up(s[k], bucket) for s in sums}) for k in range(hops)}
        row["gemm"] = len({m for n in nodes for m in gemm_row_counts(n, bucket)})
        result[bucket_name(bucket)] = row
    return result


def bucket_name(bucket: int) -> str:
    """A rounding's name in the report: ``exact`` (``1``) or ``pad<multiple>``."""
    return "exact" if bucket == 1 else f"pad{bucket}"


def cache_table(nodes: Sequence[Sequence[int]], capacities: Sequence[int], keys_per_rowcount: int,
                calls_per_rowcount: int, buckets: Sequence[int] = BUCKETS) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Per bucket, per capacity: the GEMM calls' hit rate over the last half of the batches and the implied host µs
    per step (:meth:`CacheOutcome.host_us_per_step`)."""
    measure_from = len(nodes) // 2
    table: dict[str, list[dict[str, Any]]] = {}
    for bucket in buckets:
        steps = [gemm_row_counts(n, bucket) for n in nodes]
        rows = []
        for capacity in capacities:
            outcome = simulate_lru(steps, capacity, keys_per_rowcount, measure_from)
            rows.append({"capacity": capacity, "hits": outcome.hits, "lookups": outcome.lookups,
                         "hit_rate": outcome.hit_rate,
                         "host_us_per_step": outcome.host_us_per_step(keys_per_rowcount, calls_per_rowcount)})  # fmt: skip
        table[bucket_name(bucket)] = rows
    return table


def format_report(report: dict[str, Any]) -> str:
    """The run's distinct row counts and its cache table as plain text."""
    distinct, table, run = report["distinct"], report["cache"], report["run"]
    calls = report["args"]["calls_per_rowcount"] * len(GEMM_PREFIXES)  # a step of as many row counts as layers
    lines = [f"{run['batches']:,} batches of {run['num_nodes']:,} nodes / {run['num_edges']:,} edges "
             f"({run['steps_per_epoch']} steps an epoch); mean nodes per hop {report['mean_nodes']}",  # fmt: skip
             "", "distinct row counts over the run (p<k>: first k hops; gemm: the GEMM row counts together)"]
    names = list(next(iter(distinct.values())))
    lines.append(f"{'':>8}" + "".join(f"{n:>9}" for n in names))
    lines += [f"{b:>8}" + "".join(f"{row[n]:>9,}" for n in names) for b, row in distinct.items()]
    lines += ["", f"LRU over the last half ({report['args']['keys_per_rowcount']} keys per row count): GEMM-call hit rate"
              f" / host µs per step ({calls} calls a step; all hits {calls * HIT_US:.0f}, all misses "
              f"{calls * MISS_US:.0f})"]  # fmt: skip
    lines.append(f"{'keys':>9}" + "".join(f"{b:>18}" for b in table))
    for i, capacity in enumerate(report["args"]["capacities"]):
        cells = (f"{table[b][i]['hit_rate']:>9.1%} {table[b][i]['host_us_per_step']:>6.0f} µs" for b in table)
        lines.append(f"{capacity:>9,}" + "".join(f"{c:>18}" for c in cells))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.parts.shape_recurrence",
                                     description=(__doc__ or "").split("\n\n")[0])  # fmt: skip
    parser.add_argument("--num-nodes", type=int, default=1_000_000, help="SyntheticGraph nodes (benchmarks.scaling "
                        "runs 4,000,000 on the GPU box)")  # fmt: skip
    parser.add_argument("--batches", type=int, default=3000, help="training batches sampled (the last half measured)")
    parser.add_argument("--keys-per-rowcount", type=int, default=6, help="cache keys a distinct row count takes")
    parser.add_argument("--calls-per-rowcount", type=int, default=6, help="GEMM calls per row count per step")
    parser.add_argument("--capacities", default=",".join(map(str, CAPACITIES)), help="LRU capacities in keys")
    parser.add_argument("--seed", type=int, default=0, help="the plan's seed (the DataModule's)")
    parser.add_argument("--threads", type=int, default=None, help="sampler threads (default: torch's)")
    parser.add_argument("--cache-dir", default=None, help="dataset cache root (default: the datasets' default)")
    parser.add_argument("--out", default="results/shape_recurrence.json", help="write the figures here as JSON")
    args = parser.parse_args(argv)
    try:
        capacities = [int(c) for c in args.capacities.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--capacities must be comma-separated integers, got {args.capacities!r}")
    if args.batches < 2 or args.keys_per_rowcount < 1 or args.calls_per_rowcount < 1 or min(capacities, default=-1) < 0:
        parser.error("--batches must be >= 2, --keys/--calls-per-rowcount >= 1 and --capacities >= 0")
    args.capacities = capacities

    run = sample_hop_counts(args.num_nodes, args.batches, args.seed, args.cache_dir, args.threads,
                            progress_every=max(1, args.batches // 10))  # fmt: skip
    hops = len(FANOUTS) + 1
    report: dict[str, Any] = {
        "args": vars(args),
        "model": {"fanouts": list(FANOUTS), "batch_size": BATCH_SIZE, "gemm_prefixes": list(GEMM_PREFIXES),
                  "miss_us": MISS_US, "hit_us": HIT_US},  # fmt: skip
        "run": {"batches": len(run.nodes), "num_nodes": run.num_nodes, "num_edges": run.num_edges,
                "train_nodes": run.train_nodes, "steps_per_epoch": run.steps_per_epoch,
                "graph_s": round(run.graph_s, 2), "sample_s": round(run.sample_s, 2),
                "sample_ms_per_batch": round(run.sample_s / len(run.nodes) * 1e3, 2)},  # fmt: skip
        "mean_nodes": [round(sum(n[k] for n in run.nodes) / len(run.nodes)) for k in range(hops)],
        "distinct": distinct_counts(run.nodes),
        "cache": cache_table(run.nodes, capacities, args.keys_per_rowcount, args.calls_per_rowcount),
        "nodes": run.nodes,
    }
    print(format_report(report), flush=True)
    if args.out:
        from benchmarks.common.results import write_json

        write_json(args.out, report)
        print(f"wrote {args.out}", flush=True)
    return report


if __name__ == "__main__":
    main()
