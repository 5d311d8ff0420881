"""The gather benchmark's batches and node orders, which need no GPU: the power-law graph (``power_law_csc_gpu``),
``n_id`` of sampled batches, the node orders compared (``ORDERS``), the 4 KiB pages a batch touches, and the
``--pages-only`` run (``python -m benchmarks.parts.gather --pages-only``). ``gather.py`` measures the GB/s on them."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Optional

import torch

PAGE = 4096


# ---------------------------------------------------------------------------------------------- inputs


def zipf_ids_gpu(
    count: int, num_nodes: int, alpha: float, perm: torch.Tensor, gen: torch.Generator, device: str = "cuda"
) -> torch.Tensor:
    """``count`` node ids with P(rank r) ~ (r + 1)^-alpha, ranks mapped through the shuffled ids ``perm``."""
    cdf = torch.arange(1, num_nodes + 1, dtype=torch.float64, device=device).pow_(-alpha).cumsum_(0)
    cdf /= cdf[-1].clone()
    out = torch.empty(count, dtype=torch.int64, device=device)
    chunk = 1 << 26
    for start in range(0, count, chunk):
        u = torch.rand(min(chunk, count - start), dtype=torch.float64, device=device, generator=gen)
        out[start : start + u.numel()] = perm[torch.searchsorted(cdf, u).clamp_(max=num_nodes - 1)]
    return out


def power_law_csc_gpu(
    num_nodes: int, avg_degree: float, alpha: float, seed: int, device: str = "cuda"
) -> tuple[torch.Tensor, torch.Tensor]:
    """A directed graph with Zipf in- and out-degrees and shuffled ids, as CSC on ``device`` (the GPU by default;
    indptr int64, indices int32). The GPU and the CPU draw different (equally distributed) graphs."""
    gen = torch.Generator(device=device).manual_seed(seed)
    num_edges = int(num_nodes * avg_degree)
    perm_dst = torch.randperm(num_nodes, device=device, generator=gen)
    perm_src = torch.randperm(num_nodes, device=device, generator=gen)
    dst = zipf_ids_gpu(num_edges, num_nodes, alpha, perm_dst, gen, device)
    src = zipf_ids_gpu(num_edges, num_nodes, alpha, perm_src, gen, device)
    dst, order = torch.sort(dst)
    indices = src[order].to(torch.int32)
    del src, order
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    indptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
    return indptr, indices


# ----------------------------------------------------------------------------------------- node orders

#: The node orders compared (besides the generated, shuffled ids); "bfs" and "degree" are the DataModule's
#: ``node_order`` options, "freq" the frequency order of ``gather.frequency_order`` (the same permutation as
#: "degree", computed by the other function; kept so that earlier runs' "freq" figures stay comparable).
ORDERS = ("freq", "bfs", "degree")


def node_order_ranks(
    indptr: torch.Tensor, indices: torch.Tensor, num_nodes: int
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """``rank[old_id] = new_id`` of every order in :data:`ORDERS`, computed on the graph's device, and the
    seconds each took. A batch's ids in an order are ``rank[n_id]``: the same rows, renumbered."""
    from lightning_zerocopy.gather import frequency_order
    from lightning_zerocopy.graph.csc import CSCGraph
    from lightning_zerocopy.graph.reorder import NodeOrder, bfs_order, degree_order

    graph = CSCGraph(indptr, indices, None, num_nodes)
    makers = {
        "freq": lambda: NodeOrder.from_order(frequency_order(indices, num_nodes)),
        "bfs": lambda: bfs_order(graph),
        "degree": lambda: degree_order(graph),
    }
    ranks, seconds = {}, {}
    for name in ORDERS:
        start = time.perf_counter()
        ranks[name] = makers[name]().rank
        if indptr.is_cuda:
            torch.cuda.synchronize()
        seconds[name] = time.perf_counter() - start
    return ranks, seconds


def pages_touched(ids: torch.Tensor, row_bytes: int) -> int:
    """Distinct 4 KiB pages spanned by rows ``ids`` of a page-aligned table with ``row_bytes``-byte rows."""
    first = ids * row_bytes // PAGE
    if PAGE % row_bytes == 0:  # rows never straddle a page
        return int(torch.unique(first).numel())
    last = (ids * row_bytes + row_bytes - 1) // PAGE
    span = -(-row_bytes // PAGE) + 1  # the most pages one row can touch
    return int(torch.unique(torch.cat([torch.minimum(first + k, last) for k in range(span)])).numel())




def sample_batches(
    indptr: torch.Tensor, indices: torch.Tensor, seed_pool: Optional[torch.Tensor], args: argparse.Namespace
) -> list[torch.Tensor]:
    """``n_id`` of ``--warmup + --batches`` sampled batches (``--fanouts``, ``--batch-size`` random seeds drawn from
    ``seed_pool``, default every node), sampled on the graph's device."""
    from lightning_zerocopy import ops

    device = indptr.device
    num_nodes = indptr.numel() - 1
    gen = torch.Generator(device=device.type).manual_seed(args.seed)
    batches = []
    for b in range(args.warmup + args.batches):
        if seed_pool is None:
            seeds = torch.randperm(num_nodes, device=device, generator=gen)[: args.batch_size]
        else:
            seeds = seed_pool[torch.randperm(seed_pool.numel(), device=device, generator=gen)[: args.batch_size]]
        batches.append(ops.sample_neighbors(indptr, indices, seeds, args.fanouts, False, args.seed + b).n_id)
    return batches


def run_pages_only(args: argparse.Namespace, widths: list[int]) -> dict:
    """Pages touched per batch (mean over ``--warmup + --batches`` batches) with shuffled ids and in each node
    order, per row width; no feature table, no timing, any device."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    shared = None  # --graph synthetic: one graph, its batches and orders serve every row width
    rows_out = []
    for width in widths:
        if shared is None:
            t0 = time.perf_counter()
            if args.graph == "synthetic":
                from lightning_zerocopy.datasets import SyntheticGraph
                from lightning_zerocopy.graph.csc import CSCGraph

                data = SyntheticGraph(num_nodes=args.synthetic_nodes, avg_degree=args.avg_degree, num_features=8,
                                      num_classes=32, seed=args.seed, cache_dir=args.cache_dir).load()  # fmt: skip
                csc = CSCGraph.from_edge_index(data.edge_index, data.num_nodes)
                indptr, indices, pool = csc.indptr.to(device), csc.indices.to(device), data.train_idx.to(device)
            else:
                num_rows = int(args.table_gib * 2**30) // width
                indptr, indices = power_law_csc_gpu(num_rows, args.avg_degree, args.alpha, args.seed + width, device)
                pool = None
            graph_s = time.perf_counter() - t0
            batches = sample_batches(indptr, indices, pool, args)
            ranks, order_s = node_order_ranks(indptr, indices, indptr.numel() - 1)
            current = (indptr.numel() - 1, int(indices.numel()), graph_s, batches, ranks, order_s)
            if args.graph == "synthetic":
                shared = current
        num_rows, num_edges, graph_s, batches, ranks, order_s = shared or current
        rows = [int(b.numel()) for b in batches]
        pages = {"shuffled": [pages_touched(b, width) for b in batches]}
        for name, rank in ranks.items():
            pages[name] = [pages_touched(rank[b], width) for b in batches]
        r = {
            "row_bytes": width,
            "num_rows": num_rows,
            "num_edges": num_edges,
            "graph_build_s": round(graph_s, 2),
            "order_s": {k: round(v, 2) for k, v in order_s.items()},
            "rows_per_batch_mean": statistics.fmean(rows),
            "pages_per_batch_mean": {k: statistics.fmean(v) for k, v in pages.items()},
            "rows_per_touched_page": {k: statistics.fmean(n / p for n, p in zip(rows, v)) for k, v in pages.items()},
        }
        rows_out.append(r)
        print(f"  {width} B rows, {num_rows:,} nodes: {r['rows_per_batch_mean']:.0f} rows/batch; pages/batch "
              + ", ".join(f"{k} {v:.0f}" for k, v in r["pages_per_batch_mean"].items()), flush=True)  # fmt: skip
    names = ["shuffled", *ORDERS]
    print(f"\npages (4 KiB) touched per batch, {args.graph} graph, fanouts {args.fanouts}, batch {args.batch_size}, "
          f"mean of {args.warmup + args.batches} batches (rows per touched page in parentheses)")  # fmt: skip
    print(f"{'row B':>6}{'nodes':>12}{'rows/batch':>12}" + "".join(f"{n:>20}" for n in names))
    for r in rows_out:
        print(f"{r['row_bytes']:>6}{r['num_rows']:>12,}{r['rows_per_batch_mean']:>12.0f}" + "".join(
            f"{r['pages_per_batch_mean'][n]:>12.0f} ({r['rows_per_touched_page'][n]:>5.2f})" for n in names))  # fmt: skip
    return {"benchmark": "gather_pages", "config": vars(args), "device": device, "torch": torch.__version__,
            "results": rows_out}  # fmt: skip
