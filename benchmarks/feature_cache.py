"""What does the segmented feature cache deliver? GB/s of feature rows per gather, cache policies side by side.

A host feature table of ``--table-gib`` GiB (random bytes, registered for zero-copy reads) with ``--row-bytes``
rows; a power-law graph with one node per row gives real sampled batches ([15, 10, 5], batch 1024: each batch's
``n_id``), as in ``benchmarks/gather.py`` (whose generators this script reuses). The hot rows are the most frequent
in-neighbors (``degree`` ranking), ``--fractions`` of the table. For every fraction, after warm-up, the median
GB/s (feature bytes delivered / wall time between synchronizations) of:

* ``no_cache``          ``gather_rows``, batch order, every row from host memory (the baseline)
* ``hot_rows``          ``gather_rows`` with the existing one-GPU hot-row cache (``cache_slot``/``cache``)
* ``replicate``         ``SegmentedFeatureCache``, one shard on this GPU (``fill_shard`` + ``open_feature_cache``)
* ``shards_k``          the same rows in ``k`` shards, all on this GPU (the clique lookup, without a peer)
* ``clique_2gpu``       with ``--devices 2``: two shards on ``cuda:0`` and ``cuda:1`` (peer reads over NVLink),
  gathering on ``cuda:0``; the rows cached are twice the fraction (each GPU holds the fraction)

with the measured hit rate (local / peer / host rows from the cache's own counters). Every output is checked
bitwise against ``no_cache``. Writes JSON to ``--out``.

Example::

    python benchmarks/feature_cache.py --table-gib 4 --row-bytes 128 --fractions 0.1,0.2,0.3 \
        --out results/feature_cache.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Callable

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.append(REPO_ROOT)

from benchmarks.gather import bitwise_equal, fill_random_, power_law_csc_gpu, sample_batches, timed  # noqa: E402
from benchmarks.results import write_json  # noqa: E402


def measure(fn: Callable[[torch.Tensor], torch.Tensor], batches: list[torch.Tensor], warmup: int,
            reference: list[torch.Tensor], row_bytes: int) -> dict:  # fmt: skip
    rates, ok = [], True
    for i, ids in enumerate(batches):
        seconds, out = timed(lambda: fn(ids))
        ok = ok and bitwise_equal(out, reference[i])
        if i >= warmup:
            rates.append(ids.numel() * row_bytes / seconds / 1e9)
    return {"gbps": statistics.median(rates), "bitwise_equal": ok}


def run(args: argparse.Namespace) -> dict:
    from lightning_zerocopy import ops
    from lightning_zerocopy.gather import CachePlan, FeatureCacheSpec, fill_shard, open_feature_cache
    from lightning_zerocopy.graph.host_registration import register_host_tensor
    from lightning_zerocopy.graph.reorder import most_frequent_neighbors

    row_bytes = args.row_bytes
    num_rows = int(args.table_gib * 2**30) // row_bytes
    host = torch.empty(num_rows * row_bytes, dtype=torch.uint8)
    registration = register_host_tensor(host, name="table")
    fill_random_(host)
    table = host.view(torch.float32).view(num_rows, row_bytes // 4)
    indptr, indices = power_law_csc_gpu(num_rows, args.avg_degree, args.alpha, args.seed)
    batches = sample_batches(indptr, indices, None, args)
    ranking = most_frequent_neighbors(indices, num_rows, int(max(args.fractions) * num_rows * args.devices))
    del indptr, indices
    torch.cuda.empty_cache()

    reference = [ops.gather_rows(table, ids) for ids in batches]
    results: dict = {"no_cache": measure(lambda ids: ops.gather_rows(table, ids), batches, args.warmup,
                                         reference, row_bytes)}  # fmt: skip
    for fraction in args.fractions:
        count = int(fraction * num_rows)
        entry: dict = {"rows": count}
        hot = ranking[:count].cuda()
        slot = torch.full((num_rows,), -1, dtype=torch.int32, device="cuda")
        slot[hot] = torch.arange(count, dtype=torch.int32, device="cuda")
        rows = table[hot.cpu()].cuda()
        entry["hot_rows"] = measure(lambda ids: ops.gather_rows(table, ids, cache_slot=slot, cache=rows),
                                    batches, args.warmup, reference, row_bytes)  # fmt: skip
        del slot, rows
        layouts = [("replicate", [0])] + [(f"shards_{k}", [0] * k) for k in args.shards]
        if args.devices >= 2:
            layouts.append(("clique_2gpu", [0, 1]))
        for name, devices in layouts:
            cached = count * (len(devices) if name == "clique_2gpu" else 1)
            plan = CachePlan.from_ranking(ranking, num_rows, len(devices), num_rows=cached)
            shards = [fill_shard(plan, s, table, torch.device("cuda", d)) for s, d in enumerate(devices)]
            spec = FeatureCacheSpec(plan, tuple(h for _, h in shards), policy=name)
            with open_feature_cache(spec, table, "cuda:0", register=False) as cache:
                entry[name] = measure(cache.gather, batches, args.warmup, reference, row_bytes)
                counts = cache.counts()
                entry[name].update(hit_rate=counts.hit_rate, local=counts.local, peer=counts.peer, host=counts.host,
                                   lookup_bytes=cache.location.numel() * cache.location.element_size())  # fmt: skip
            del shards
            torch.cuda.empty_cache()
        results[f"fraction_{fraction}"] = entry
        print(json.dumps({f"fraction_{fraction}": entry}), flush=True)
    registration.close()
    return {"device": torch.cuda.get_device_name(0), "num_rows": num_rows, "row_bytes": row_bytes,
            "args": vars(args), "results": results}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table-gib", type=float, default=4.0)
    parser.add_argument("--row-bytes", type=int, default=128)
    parser.add_argument("--fractions", type=lambda s: [float(x) for x in s.split(",")], default=[0.1, 0.2, 0.3])
    parser.add_argument("--shards", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4])
    parser.add_argument("--devices", type=int, default=1, choices=(1, 2))
    parser.add_argument("--avg-degree", type=float, default=10.0)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--fanouts", type=int, nargs="+", default=[15, 10, 5])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/feature_cache.json")
    args = parser.parse_args()
    report = run(args)
    write_json(args.out, report)
    print(json.dumps(report["results"]["no_cache"]), "->", args.out)


if __name__ == "__main__":
    main()
