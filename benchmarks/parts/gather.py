"""How fast do a mini-batch's feature rows reach the GPU? Zero-copy gather vs the usual ways, side by side.

A host feature table of ``--table-gib`` GiB (random bytes, registered for zero-copy access) is viewed with each
row width in ``--row-bytes``. For every width a power-law graph with one node per table row and shuffled ids
is generated on the GPU, and real multi-hop samples ([15, 10, 5], batch 1024 by default, our GPU sampler) give
the ids: ``n_id`` of each batch. For those ids, in one run and after warm-up, each method moves the rows to
GPU memory and the median GB/s (feature bytes delivered / wall time from a synchronized start to the rows
being usable on the GPU) is reported:

* ``contiguous_h2d``   the same number of bytes as one contiguous pinned host->device copy (the PCIe ceiling)
* ``index_to_cuda``    ``table[ids].to('cuda')`` (CPU indexing into pageable memory, then a copy)
* ``cpu_gather_pinned``  our multi-threaded CPU gather into a pinned buffer, then an async copy
* ``index_select_uva`` ``torch.index_select`` on a CUDA tensor aliasing the mapped host table
* ``ours_direct``      the zero-copy kernel, rows read in batch order
* ``ours_sorted``      the zero-copy kernel, rows read in address order (ids sorted on the GPU)
* ``ours_cached``      ``ours_sorted`` with the ``--cache-fraction`` most frequent neighbors in a GPU cache
* ``ours_cached_big``  the same with ``--big-cache-fraction`` of the rows cached
* ``ours_sorted_freq_order``  ``ours_sorted`` on the table renumbered by ``frequency_order`` (frequent
  neighbors first): the node-order lever, same batches
* ``ours_sorted_bfs_order``  the same on the table renumbered by ``graph.reorder.bfs_order`` (breadth-first
  over in-edges, computed on the GPU): what ``ZeroCopyDataModule(node_order="bfs")`` stores
* ``gpu_resident``     ``index_select`` on a GPU copy of the table (what GPU memory would give)
* ``ours_budget_degree`` / ``ours_budget_presample`` (with ``--cache-budget-fraction F``): the strategy's cache
  (``ZeroCopyDDPStrategy``'s one-launch segmented gather, replicate, one shard) holding ``F`` of the rows, ranked
  by in-neighbor count or by presampling ``--presample-batches`` batches drawn with another seed than the measured
  ones; the expected (from the ranking's counts) and measured (the cache's own counters) hit rates are reported
  with the speed-up over the uncached gather (``ours_direct``/``ours_sorted``, the better one)

plus the pages (4 KiB) each batch touches, with shuffled ids and in each node order (frequency, BFS, in-degree
as ``node_order="degree"``). Every method's output is checked bitwise against ``table[ids]``.

``--pages-only`` needs no GPU: it samples the same kind of batches with the CPU kernel (``--device cpu``) and
reports only the pages touched per batch in each node order, on the benchmark's power-law graph or on the
recipes' ``SyntheticGraph`` (``--graph synthetic``).

Example::

    python -m benchmarks.parts.gather --table-gib 8 --row-bytes 128,512,2048 --out results/gather.json
    python -m benchmarks.parts.gather --table-gib 8 --row-bytes 128 --cache-budget-fraction 0.2 --out results/gather_budget.json
    python -m benchmarks.parts.gather --pages-only --device cpu --graph synthetic --synthetic-nodes 2000000 \
        --avg-degree 16 --row-bytes 128,512 --out results/gather_pages.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, Optional

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.append(REPO_ROOT)

from benchmarks.common.results import write_json  # noqa: E402
from benchmarks.parts.gather_pages import ORDERS, node_order_ranks, pages_touched, power_law_csc_gpu  # noqa: E402, F401
from benchmarks.parts.gather_pages import run_pages_only, sample_batches  # noqa: E402


# ---------------------------------------------------------------------------------------------- inputs


def fill_random_(host: torch.Tensor, chunk: int = 1 << 28) -> None:
    """Random bytes into a pinned/registered uint8 host tensor, generated on the GPU and copied over."""
    gen = torch.Generator(device="cuda").manual_seed(1234)
    for start in range(0, host.numel(), chunk):
        n = min(chunk, host.numel() - start)
        block = torch.randint(-(2**31), 2**31 - 1, ((n + 3) // 4,), dtype=torch.int32, device="cuda", generator=gen)
        host[start : start + n].copy_(block.view(torch.uint8)[:n])
    torch.cuda.synchronize()


def mapped_cuda_view(table: torch.Tensor) -> Optional[torch.Tensor]:
    """A CUDA tensor aliasing the registered host table (its device address from cudaPointerGetAttributes, via
    CuPy), built through ``__cuda_array_interface__``. None when CuPy is missing or torch refuses it."""
    try:
        import cupy

        runtime = cupy.cuda.runtime
        if hasattr(runtime, "hostGetDevicePointer"):
            device_ptr = int(runtime.hostGetDevicePointer(table.data_ptr(), 0))
        else:  # CuPy 14 has no hostGetDevicePointer binding; the pointer attributes carry the same address
            device_ptr = int(runtime.pointerGetAttributes(table.data_ptr()).devicePointer)
        if device_ptr == 0:
            raise RuntimeError("the table is not registered/mapped memory")

        class _Alias:
            __cuda_array_interface__ = {
                "shape": tuple(table.shape),
                "typestr": "<f4" if table.dtype == torch.float32 else "|u1",
                "data": (device_ptr, False),  # torch accepts only read_only=False
                "version": 3,
                "strides": None,
            }

        return torch.as_tensor(_Alias(), device="cuda")
    except Exception as exc:  # pragma: no cover - depends on the machine
        print(f"  index_select_uva unavailable: {type(exc).__name__}: {exc}", flush=True)
        return None


# --------------------------------------------------------------------------------------------- timing


def timed(fn: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.uint8).cpu(), b.view(torch.uint8).cpu())


def host_rows_only_gbps(
    table: torch.Tensor, batches: list[torch.Tensor], location: torch.Tensor, out: torch.Tensor, warmup: int
) -> float:
    """Median GB/s of the whole batch (all its rows' bytes) when only its host rows (``location < 0``) are read,
    in address order, by ``gather_rows``: the time a cache that served its rows for free would take."""
    from lightning_zerocopy import ops

    row_bytes = table.shape[1] * table.element_size()
    rates = []
    for b, ids in enumerate(batches):
        host_ids = ids[location[ids] < 0]
        seconds, _ = timed(lambda: ops.gather_rows(table, host_ids, out[: host_ids.numel()], sort_ids=True))
        if b >= warmup:
            rates.append(ids.numel() * row_bytes / seconds / 1e9)
    return statistics.median(rates)


def run_width(args, host_bytes: torch.Tensor, gpu_bytes: Optional[torch.Tensor], row_bytes: int) -> dict:
    from lightning_zerocopy import ops
    from lightning_zerocopy.gather import CudaFeatureTable, most_frequent_neighbors

    num_rows = host_bytes.numel() // row_bytes
    table = host_bytes[: num_rows * row_bytes].view(torch.float32).view(num_rows, row_bytes // 4)
    t0 = time.perf_counter()
    indptr, indices = power_law_csc_gpu(num_rows, args.avg_degree, args.alpha, args.seed + row_bytes)
    graph_s = time.perf_counter() - t0
    batches = sample_batches(indptr, indices, None, args)
    hot = most_frequent_neighbors(indices, num_rows, int(args.cache_fraction * num_rows))
    hot_big = most_frequent_neighbors(indices, num_rows, int(args.big_cache_fraction * num_rows))
    # The node-order lever: the same batches with rows renumbered (frequency, BFS and degree orders).
    ranks, order_s = node_order_ranks(indptr, indices, num_rows)
    reordered = {name: [rank[b] for b in batches] for name, rank in ranks.items()}
    budget_caches = budget_caches_for(args, table, indptr, indices, num_rows)
    del indptr, indices, ranks
    torch.cuda.empty_cache()

    max_n = max(int(b.numel()) for b in batches)
    out = torch.empty((max_n, table.shape[1]), dtype=table.dtype, device="cuda")
    pinned = torch.empty((max_n, table.shape[1]), dtype=table.dtype, pin_memory=True)
    flat_host = host_bytes.view(-1)
    flat_out = out.view(torch.uint8).view(-1)
    uva = mapped_cuda_view(table)
    resident = None if gpu_bytes is None else gpu_bytes[: num_rows * row_bytes].view(torch.float32).view(table.shape)
    cached = CudaFeatureTable(table, mode="sorted", hot_rows=hot, register=False)
    cached_big = CudaFeatureTable(table, mode="sorted", hot_rows=hot_big, register=False)
    auto = CudaFeatureTable(table, mode="auto", trial_calls=2, register=False)

    methods: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "contiguous_h2d": lambda ids, ids_cpu: flat_out[: ids.numel() * row_bytes].copy_(
            flat_host[: ids.numel() * row_bytes], non_blocking=True),
        "index_to_cuda": lambda ids, ids_cpu: table[ids_cpu].to("cuda"),
        "cpu_gather_pinned": lambda ids, ids_cpu: out[: ids.numel()].copy_(
            ops.gather_rows(table, ids_cpu, pinned[: ids.numel()]), non_blocking=True),
        "ours_direct": lambda ids, ids_cpu: ops.gather_rows(table, ids, out[: ids.numel()], sort_ids=False),
        "ours_sorted": lambda ids, ids_cpu: ops.gather_rows(table, ids, out[: ids.numel()], sort_ids=True),
        "ours_cached": lambda ids, ids_cpu: cached.gather(ids, out[: ids.numel()]),
        "ours_cached_big": lambda ids, ids_cpu: cached_big.gather(ids, out[: ids.numel()]),
        "ours_auto": lambda ids, ids_cpu: auto.gather(ids, out[: ids.numel()]),
        # ids of the frequency-/BFS-ordered table (see below): same batches, rows renumbered
        "ours_sorted_freq_order": lambda ids, ids_cpu: ops.gather_rows(table, ids, out[: ids.numel()],
                                                                          sort_ids=True),
        "ours_sorted_bfs_order": lambda ids, ids_cpu: ops.gather_rows(table, ids, out[: ids.numel()],
                                                                         sort_ids=True),
    }  # fmt: skip
    ids_of = {"ours_sorted_freq_order": reordered["freq"], "ours_sorted_bfs_order": reordered["bfs"]}
    for ranking, (cache, _, _) in budget_caches.items():
        methods[f"ours_budget_{ranking}"] = lambda ids, ids_cpu, c=cache: c.gather(ids, out[: ids.numel()])
    if resident is not None:
        methods["gpu_resident"] = lambda ids, ids_cpu: torch.index_select(resident, 0, ids, out=out[: ids.numel()])
    if uva is not None:  # last: a baseline reading host memory through a foreign alias
        methods["index_select_uva"] = lambda ids, ids_cpu: torch.index_select(uva, 0, ids, out=out[: ids.numel()])

    pages = [pages_touched(b, row_bytes) for b in batches]
    pages_in = {name: [pages_touched(b, row_bytes) for b in ids] for name, ids in reordered.items()}
    rows = [int(b.numel()) for b in batches]
    result = {
        "row_bytes": row_bytes,
        "num_rows": num_rows,
        "graph_build_s": round(graph_s, 2),
        "rows_per_batch_mean": statistics.fmean(rows),
        "bytes_per_batch_mean": statistics.fmean(rows) * row_bytes,
        "pages_touched_per_batch_mean": statistics.fmean(pages),
        "rows_per_touched_page": statistics.fmean(r / p for r, p in zip(rows, pages)),
        **{f"pages_touched_per_batch_{name}_order": statistics.fmean(p) for name, p in pages_in.items()},
        "order_s": {name: round(t, 2) for name, t in order_s.items()},
        "hot_rows": int(hot.numel()),
        "hot_rows_big": int(hot_big.numel()),
        "gbps": {},
        "checked": {},
    }
    for name, fn in methods.items():
        times = []
        try:
            for b, ids in enumerate(ids_of.get(name, batches)):
                ids_cpu = ids.cpu()
                seconds, got = timed(lambda: fn(ids, ids_cpu))
                if b == args.warmup and name != "contiguous_h2d":
                    result["checked"][name] = bitwise_equal(got, table[ids_cpu])
                    if not result["checked"][name]:
                        raise AssertionError(f"{name} returned wrong rows at row width {row_bytes}")
                if b >= args.warmup:
                    times.append(ids.numel() * row_bytes / seconds / 1e9)
        except Exception as exc:
            if name.startswith("ours"):
                raise
            print(f"  baseline {name} failed at {row_bytes} B rows: {type(exc).__name__}: {exc}", flush=True)
            result.setdefault("failed", {})[name] = f"{type(exc).__name__}: {exc}"
            continue
        result["gbps"][name] = statistics.median(times)
    result["auto_chose"] = auto.chosen_mode
    if budget_caches:
        uncached = max(result["gbps"]["ours_direct"], result["gbps"]["ours_sorted"])
        result["budget_cache"] = {}
        for ranking, (cache, report, _) in budget_caches.items():
            counts = cache.counts()
            result["budget_cache"][ranking] = {
                "rows": cache.num_cached,
                **report,  # expected_hit_rate and expected_basis (what that is), presample's prior weight
                "measured_hit_rate": counts.hit_rate,
                "gbps": result["gbps"][f"ours_budget_{ranking}"],
                "speedup_vs_no_cache": result["gbps"][f"ours_budget_{ranking}"] / uncached,
                # the bound: only the batch's uncached rows, read from host memory by the plain gather
                "host_rows_only_gbps": host_rows_only_gbps(table, batches, cache.location, out, args.warmup),
            }
            cache.close()
    ceiling = result["gbps"]["contiguous_h2d"]
    result["fraction_of_contiguous"] = {k: v / ceiling for k, v in result["gbps"].items()}
    return result


def budget_caches_for(
    args: argparse.Namespace, table: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor, num_rows: int
) -> dict:
    """``{ranking: (SegmentedFeatureCache, report, shard)}`` for ``--cache-budget-fraction`` of the rows, ranked as
    ZeroCopyDDPStrategy ranks them (``{}`` without the option); keep the shard (its owner's tensor) alive while the
    cache is open. ``report`` holds ``expected_hit_rate`` and ``expected_basis``, which says what it is: presample's
    held-out rate (its ranking fitted on half the presampled batches, judged on the other half), degree's share of
    all presampled accesses (batches its ranking never saw); presample's also the chosen prior weight, the
    held-out rate of every candidate weight and the in-sample rate."""
    if args.cache_budget_fraction <= 0:
        return {}
    from lightning_zerocopy.cache import CachePlan, SegmentedCacheSpec, fill_shard, open_feature_cache
    from lightning_zerocopy.cache.cached_rows import rank_rows
    from lightning_zerocopy.cache.plan import lookup_bytes
    from lightning_zerocopy.cache.ranking import CacheScores, degree_scores, expected_hit_rate
    from lightning_zerocopy.graph.schema import NODE

    rows = int(args.cache_budget_fraction * num_rows)
    presample_args = argparse.Namespace(**{**vars(args), "seed": args.seed + 7919, "warmup": 0,
                                          "batches": args.presample_batches})  # fmt: skip
    halves = torch.zeros(2, num_rows, dtype=torch.int64, device=indices.device)
    for k, n_id in enumerate(sample_batches(indptr, indices, None, presample_args)):  # other seeds than measured
        halves[k % 2] += torch.bincount(n_id, minlength=num_rows)
    degree = degree_scores(indices, num_rows)
    caches = {}
    for ranking, scores in {"degree": CacheScores(degree), "presample": CacheScores(degree, halves)}.items():
        # `rows` 1-byte rows beside the lookup: a budget of exactly `rows` cached rows
        ranked = rank_rows({NODE: scores}, {NODE: 1}, lookup_bytes(num_rows, 1) + rows)
        plan = CachePlan.from_ranking(ranked.rows[NODE], num_rows, 1)
        shard, handle = fill_shard(plan, 0, table, torch.device("cuda", torch.cuda.current_device()))
        cache = open_feature_cache(SegmentedCacheSpec(plan, (handle,), "replicate"), table, shard.device, register=False)
        if ranked.choice is None:  # degree: judged on all presampled accesses, which its ranking did not use
            report = {"expected_hit_rate": expected_hit_rate(halves.sum(0), plan.rows),
                      "expected_basis": "share of all presampled accesses (not used by the degree ranking)"}
        else:
            report = {"expected_hit_rate": ranked.expected_hit_rate,
                      "expected_basis": "held-out: ranked on half the presampled batches, hits on the other half",
                      "in_sample_hit_rate": ranked.in_sample_hit_rate, "prior_weight": ranked.choice.final_weight,
                      "prior_weight_on_half": ranked.choice.weight,
                      "heldout_hit_rate_by_weight": dict(zip(map(str, ranked.choice.weights),
                                                             ranked.choice.heldout_hit_rates))}  # fmt: skip
        caches[ranking] = (cache, report, shard)
    return caches


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table-gib", type=float, default=8.0, help="host table size in GiB")
    parser.add_argument("--row-bytes", default="128,256,512,1024,2048", help="comma-separated row widths (bytes)")
    parser.add_argument("--avg-degree", type=float, default=10.0)
    parser.add_argument("--alpha", type=float, default=0.6, help="Zipf exponent of the degree distributions")
    parser.add_argument("--fanouts", type=int, nargs="+", default=[15, 10, 5])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--cache-fraction", type=float, default=0.02, help="share of rows in the GPU hot cache")
    parser.add_argument("--big-cache-fraction", type=float, default=0.10,
                        help="share of rows in the larger hot cache of `ours_cached_big`")  # fmt: skip
    parser.add_argument("--no-gpu-resident", action="store_true", help="skip the GPU copy of the table")
    parser.add_argument("--cache-budget-fraction", type=float, default=0.0,
                        help="share of rows in the strategy's GPU cache (degree vs presample ranking); 0 = skip")
    parser.add_argument("--presample-batches", type=int, default=64, help="batches sampled for presample ranking")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pages-only", action="store_true",
                        help="no table and no timing: only the pages each batch touches in each node order "
                             "(runs without a GPU with --device cpu)")
    parser.add_argument("--device", default=None, help="--pages-only: where to build and sample (default: cuda if "
                                                       "available, else cpu)")
    parser.add_argument("--graph", choices=("power_law", "synthetic"), default="power_law",
                        help="--pages-only: the benchmark's power-law graph (one node per row of a --table-gib "
                             "table) or the recipes' SyntheticGraph (--synthetic-nodes nodes, seeds from its "
                             "training split)")
    parser.add_argument("--synthetic-nodes", type=int, default=2_000_000)
    parser.add_argument("--cache-dir", default=None, help="--graph synthetic: dataset cache root")
    parser.add_argument("--out", default="results/gather.json")  # fmt: skip
    return parser.parse_args(argv)


def _write(report: dict, path: str) -> None:
    if path:
        write_json(path, report)
        print(f"wrote {path}")


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    widths = [int(w) for w in args.row_bytes.split(",")]
    if any(w % 4 for w in widths):
        raise SystemExit("--row-bytes: widths must be multiples of 4 bytes (float32 rows)")
    if args.pages_only:
        report = run_pages_only(args, widths)
        _write(report, args.out)
        return report
    from lightning_zerocopy.graph import register_host_tensor

    nbytes = int(args.table_gib * 2**30)
    print(f"host table: {nbytes / 2**30:.1f} GiB; GPU {torch.cuda.get_device_name()}; threads "
          f"{torch.get_num_threads()}", flush=True)  # fmt: skip
    t0 = time.perf_counter()
    host = torch.empty(nbytes, dtype=torch.uint8)
    registration = register_host_tensor(host, name="table")
    register_s = time.perf_counter() - t0
    fill_random_(host)
    print(f"  allocated + registered in {register_s:.1f} s, filled in {time.perf_counter() - t0 - register_s:.1f} s",
          flush=True)  # fmt: skip
    gpu_copy = None
    if not args.no_gpu_resident:
        gpu_copy = host.to("cuda")
    results = []
    try:
        for width in widths:
            r = run_width(args, host, gpu_copy, width)
            results.append(r)
            print(f"  {width} B rows: {r['rows_per_batch_mean']:.0f} rows/batch, {r['pages_touched_per_batch_mean']:.0f} "
                  f"pages touched ({r['rows_per_touched_page']:.2f} rows/page); "
                  + ", ".join(f"{k} {v:.1f}" for k, v in r["gbps"].items()) + " GB/s", flush=True)  # fmt: skip
    finally:
        del gpu_copy
        registration.close()

    names = list(dict.fromkeys(n for r in results for n in r["gbps"]))
    header = f"{'row B':>6}{'pages/batch':>12}{'rows/page':>10}" + "".join(f"{n:>18}" for n in names)
    print("\nGB/s of feature bytes delivered to the GPU (median); ours / contiguous in the last columns")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['row_bytes']:>6}{r['pages_touched_per_batch_mean']:>12.0f}{r['rows_per_touched_page']:>10.2f}"
              + "".join(f"{r['gbps'].get(n, float('nan')):>18.2f}" for n in names))  # fmt: skip
    for r in results:
        for ranking, c in r.get("budget_cache", {}).items():
            print(f"{r['row_bytes']:>6} B, {args.cache_budget_fraction:.0%} of rows cached, {ranking} ranking: "
                  f"{c['gbps']:.1f} GB/s = {c['speedup_vs_no_cache']:.2f}x the uncached gather (aim >= 2x); hit rate "
                  f"{c['measured_hit_rate']:.1%} measured, {c['expected_hit_rate']:.1%} expected; reading only the "
                  f"host rows: {c['host_rows_only_gbps']:.1f} GB/s")  # fmt: skip
    for r in results:
        f = r["fraction_of_contiguous"]
        best = max(("ours_direct", "ours_sorted", "ours_cached", "ours_cached_big", "ours_sorted_freq_order",
                    "ours_sorted_bfs_order"), key=lambda k: f[k])  # fmt: skip
        target = 0.8 if r["row_bytes"] >= 512 else 0.5
        print(f"{r['row_bytes']:>6} B: best ours = {best} at {f[best]:.0%} of contiguous (target {target:.0%}); "
              f"direct {f['ours_direct']:.0%}, sorted {f['ours_sorted']:.0%}, auto chose {r['auto_chose']}; "
              f"frequency order: {r['pages_touched_per_batch_freq_order']:.0f} pages/batch, "
              f"{f['ours_sorted_freq_order']:.0%}; BFS order: {r['pages_touched_per_batch_bfs_order']:.0f} pages/batch, "
              f"{f['ours_sorted_bfs_order']:.0%} (computed in {r['order_s']['bfs']:.1f} s); degree order: "
              f"{r['pages_touched_per_batch_degree_order']:.0f} pages/batch")
    report = {
        "benchmark": "gather",
        "config": vars(args),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "register_s": register_s,
        "results": results,
    }
    _write(report, args.out)
    return report


if __name__ == "__main__":
    main()
