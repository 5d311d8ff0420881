"""How fast is multi-hop neighbor sampling? SEPS of our sampler vs PyG's sampler backend, side by side.

Generates a power-law graph (Zipf-distributed in- and out-degrees, shuffled ids), then for every mode and
thread count samples fresh random seed batches (fanouts [15, 10, 5], batch 1024 by default) and reports
SEPS (sampled edges per second) and per-batch latency (median after warm-up). Every mode's first timed
batch is checked against the graph (each sampled edge must exist, seeds first).

Modes are factories in ``MODES`` (name -> function building a ``SampleFn`` for a graph), so more placements
(``uva``, ``gpu``) can be added as one function each. PyG's mode runs when ``pyg-lib`` or ``torch-sparse`` is
importable (``--pyg-site DIR`` puts ``DIR`` first on ``sys.path`` for that).

Example::

    python -m benchmarks.parts.sampling                                  # 2M nodes, 50M edges
    python -m benchmarks.parts.sampling --nodes 200000 --avg-degree 20 --batches 10 --out results/sampling_small.json
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:  # run from a checkout without installing the package
    sys.path.append(REPO_ROOT)

from benchmarks.common.meta import cpu_model  # noqa: E402
from benchmarks.common.results import write_json  # noqa: E402

# (seeds, batch seed) -> sampled subgraph in global ids: (n_id, row, col, edge_pos or e_id).
SampleFn = Callable[[torch.Tensor, int], "Sample"]


@dataclass
class Sample:
    """A mode's output in one common form, for the correctness check and the edge count."""

    n_id: torch.Tensor  # global ids, seeds first
    row: torch.Tensor  # local id of each sampled neighbor
    col: torch.Tensor  # local id of each target
    edge_pos: Optional[torch.Tensor]  # position of each edge in `indices`, when the mode reports it


@dataclass
class Graph:
    indptr: torch.Tensor  # int64 [num_nodes + 1]
    indices: torch.Tensor  # int32 source ids grouped by target (CSC)
    num_nodes: int

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())


@dataclass
class Result:
    mode: str
    threads: int
    batches: int
    seps: float  # total sampled edges / total time of the timed batches
    seps_median: float  # median over batches of edges / latency
    latency_ms_median: float
    latency_ms_p90: float
    edges_per_batch_mean: float
    nodes_per_batch_mean: float


# ------------------------------------------------------------------------------------------------ graph


def zipf_ids(count: int, num_nodes: int, alpha: float, generator: torch.Generator) -> torch.Tensor:
    """``count`` node ids drawn with P(rank r) ~ (r + 1)^-alpha, ranks mapped to shuffled ids."""
    weights = torch.arange(1, num_nodes + 1, dtype=torch.float64).pow_(-alpha)
    cdf = torch.cumsum(weights, 0)
    cdf /= cdf[-1].clone()
    ranks = torch.empty(count, dtype=torch.int64)
    chunk = 1 << 24
    for start in range(0, count, chunk):
        u = torch.rand(min(chunk, count - start), dtype=torch.float64, generator=generator)
        ranks[start : start + u.numel()] = torch.searchsorted(cdf, u).clamp_(max=num_nodes - 1)
    return torch.randperm(num_nodes, generator=generator)[ranks]


def power_law_graph(num_nodes: int, avg_degree: float, alpha: float, seed: int) -> Graph:
    """A directed graph with Zipf(alpha) in- and out-degrees (independently shuffled ids), as CSC."""
    from lightning_zerocopy import ops

    generator = torch.Generator().manual_seed(seed)
    num_edges = int(num_nodes * avg_degree)
    dst = zipf_ids(num_edges, num_nodes, alpha, generator)
    src = zipf_ids(num_edges, num_nodes, alpha, generator)
    csc = ops.build_csc(src, dst, num_nodes)
    del src, dst
    return Graph(csc.indptr, csc.indices, num_nodes)


# ------------------------------------------------------------------------------------------------ modes


def cpu_mode(graph: Graph, fanouts: list[int], replace: bool) -> SampleFn:
    """Our compiled CPU sampler (``zerocopy::sample_neighbors``), called directly."""
    from lightning_zerocopy import ops

    def sample(seeds: torch.Tensor, seed: int) -> Sample:
        out = ops.sample_neighbors(graph.indptr, graph.indices, seeds, fanouts, replace, seed)
        return Sample(out.n_id, out.row, out.col, out.edge_pos)

    return sample


def pyg_mode(graph: Graph, fanouts: list[int], replace: bool) -> SampleFn:
    """PyG's own ``NeighborSampler`` (pyg-lib or torch-sparse backend) on the same CSC graph."""
    import torch_geometric.typing as pyg_typing
    from torch_geometric.data import Data
    from torch_geometric.sampler import NeighborSampler, NodeSamplerInput

    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
        raise ModeUnavailable("neither pyg-lib nor torch-sparse is importable (see --pyg-site)")
    # Our CSC is sorted by target, so PyG can take it as is (`is_sorted=True` skips its own sort).
    col = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.indptr.diff())
    data = Data(edge_index=torch.stack([graph.indices.long(), col]), num_nodes=graph.num_nodes)
    sampler = NeighborSampler(data, num_neighbors=fanouts, replace=replace, is_sorted=True)
    backend = "pyg-lib" if pyg_typing.WITH_PYG_LIB else "torch-sparse"
    print(f"  pyg mode: torch_geometric.sampler.NeighborSampler with {backend}", flush=True)

    def sample(seeds: torch.Tensor, seed: int) -> Sample:
        torch.manual_seed(seed)  # PyG's backends draw from torch's global generator
        out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds))
        return Sample(out.node, out.row, out.col, out.edge)  # `edge` = positions in the sorted CSC

    return sample


class ModeUnavailable(RuntimeError):
    """The mode cannot run here (missing backend or hardware); the benchmark skips it with this reason."""


def _cuda_sample_fn(indptr: torch.Tensor, indices: torch.Tensor, fanouts: list[int], replace: bool) -> SampleFn:
    from lightning_zerocopy import ops

    def sample(seeds: torch.Tensor, seed: int) -> Sample:
        out = ops.sample_neighbors(indptr, indices, seeds.to("cuda", non_blocking=True), fanouts, replace, seed)
        torch.cuda.current_stream().synchronize()  # the batch is usable when this returns
        return Sample(out.n_id, out.row, out.col, out.edge_pos)

    return sample


def _require_cuda() -> None:
    import lightning_zerocopy

    if not torch.cuda.is_available():
        raise ModeUnavailable("no CUDA GPU")
    if not lightning_zerocopy.WITH_CUDA:
        raise ModeUnavailable("lightning_zerocopy._C was built without CUDA kernels")


def gpu_mode(graph: Graph, fanouts: list[int], replace: bool) -> SampleFn:
    """Our CUDA sampler with the topology (indptr, indices) copied to GPU memory."""
    _require_cuda()
    return _cuda_sample_fn(graph.indptr.cuda(), graph.indices.cuda(), fanouts, replace)


_REGISTRATIONS: list = []  # host registrations of the uva mode, kept for the process lifetime


def uva_mode(graph: Graph, fanouts: list[int], replace: bool) -> SampleFn:
    """Our CUDA sampler with indptr on the GPU and indices left in registered host memory (read over PCIe)."""
    _require_cuda()
    from lightning_zerocopy.graph import register_host_tensor

    _REGISTRATIONS.append(register_host_tensor(graph.indices, name="indices"))
    return _cuda_sample_fn(graph.indptr.cuda(), graph.indices, fanouts, replace)


MODES: dict[str, Callable[[Graph, list[int], bool], SampleFn]] = {
    "cpu": cpu_mode,
    "pyg": pyg_mode,
    "gpu": gpu_mode,
    "uva": uva_mode,
}


# ---------------------------------------------------------------------------------------------- measure


def check_sample(graph: Graph, seeds: torch.Tensor, sample: Sample, mode: str) -> None:
    """Seeds first, and every sampled edge (neighbor -> target) is an incoming edge of the target."""
    sample = Sample(*(None if t is None else t.cpu() for t in (sample.n_id, sample.row, sample.col, sample.edge_pos)))
    if not torch.equal(sample.n_id[: seeds.numel()], seeds):
        raise AssertionError(f"{mode}: n_id does not start with the seeds")
    if sample.row.numel() == 0:
        raise AssertionError(f"{mode}: sampled no edges")
    src, dst = sample.n_id[sample.row], sample.n_id[sample.col]
    if sample.edge_pos is not None:
        pos = sample.edge_pos
        inside = (graph.indptr[dst] <= pos) & (pos < graph.indptr[dst + 1])
        if not (bool(inside.all()) and torch.equal(graph.indices[pos].long(), src)):
            raise AssertionError(f"{mode}: a sampled edge is not an incoming edge of its target")


def fresh_seed_batches(num_nodes: int, batch_size: int, count: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randperm(num_nodes, generator=generator)[:batch_size] for _ in range(count)]


def measure(
    name: str, sample: SampleFn, graph: Graph, threads: int, batch_size: int, warmup: int, batches: int, seed: int
) -> Result:
    torch.set_num_threads(threads)
    seed_batches = fresh_seed_batches(graph.num_nodes, batch_size, warmup + batches, seed + threads)
    for i in range(warmup):
        sample(seed_batches[i], seed + i)
    latencies, edges, nodes = [], [], []
    for i in range(warmup, warmup + batches):
        start = time.perf_counter()
        out = sample(seed_batches[i], seed + i)
        latencies.append(time.perf_counter() - start)
        edges.append(out.row.numel())
        nodes.append(out.n_id.numel())
        if i == warmup:
            check_sample(graph, seed_batches[i], out, name)
    latencies_sorted = sorted(latencies)
    return Result(
        mode=name,
        threads=threads,
        batches=batches,
        seps=sum(edges) / sum(latencies),
        seps_median=statistics.median(e / t for e, t in zip(edges, latencies)),
        latency_ms_median=1e3 * statistics.median(latencies),
        latency_ms_p90=1e3 * latencies_sorted[min(len(latencies) - 1, int(0.9 * len(latencies)))],
        edges_per_batch_mean=statistics.fmean(edges),
        nodes_per_batch_mean=statistics.fmean(nodes),
    )


def measure_concurrent(
    name: str, make: Callable[[], SampleFn], graph: Graph, streams: int, batch_size: int, warmup: int, batches: int,
    seed: int,
) -> Result:
    """Throughput of ``streams`` batches in flight at once: one host thread and one CUDA stream per batch
    stream (the CUDA op releases the GIL while it waits, so the GPU works on several batches together)."""
    from concurrent.futures import ThreadPoolExecutor

    seed_batches = fresh_seed_batches(graph.num_nodes, batch_size, streams * (warmup + batches), seed + 7)
    fns = [make() for _ in range(streams)]
    cuda_streams = [torch.cuda.Stream() for _ in range(streams)]

    def worker(k: int, first: int, count: int) -> tuple[list[float], list[int], list[int]]:
        lat, edges, nodes = [], [], []
        with torch.cuda.stream(cuda_streams[k]):
            for i in range(first, first + count):
                t = time.perf_counter()
                out = fns[k](seed_batches[k * (warmup + batches) + i], seed + 1000 * k + i)
                lat.append(time.perf_counter() - t)
                edges.append(out.row.numel())
                nodes.append(out.n_id.numel())
        return lat, edges, nodes

    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(lambda k: worker(k, 0, warmup), range(streams)))
        torch.cuda.synchronize()
        start = time.perf_counter()
        parts = list(pool.map(lambda k: worker(k, warmup, batches), range(streams)))
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    unsorted = [t for p in parts for t in p[0]]
    latencies = sorted(unsorted)
    edges = [e for p in parts for e in p[1]]
    nodes = [n for p in parts for n in p[2]]
    return Result(
        mode=f"{name}x{streams}",
        threads=streams,
        batches=len(edges),
        seps=sum(edges) / wall,
        seps_median=statistics.median(e / t for e, t in zip(edges, unsorted)),  # per batch, not the aggregate
        latency_ms_median=1e3 * statistics.median(latencies),
        latency_ms_p90=1e3 * latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))],
        edges_per_batch_mean=statistics.fmean(edges),
        nodes_per_batch_mean=statistics.fmean(nodes),
    )


# ------------------------------------------------------------------------------------------------- main


def parse_threads(text: str) -> list[int]:
    available = os.cpu_count() or 1
    values = [available if part == "all" else int(part) for part in text.split(",")]
    return sorted(set(values), key=values.index)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2_000_000, help="number of nodes")
    parser.add_argument("--avg-degree", type=float, default=25.0, help="edges per node (50M edges by default)")
    parser.add_argument("--alpha", type=float, default=0.6, help="Zipf exponent of the degree distributions")
    parser.add_argument("--fanouts", type=int, nargs="+", default=[15, 10, 5])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--replace", action="store_true", help="sample with replacement")
    parser.add_argument("--threads", type=parse_threads, default=parse_threads("1,all"),
                        help="comma-separated thread counts, 'all' = every core (default 1,all)")  # fmt: skip
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {sorted(MODES)}")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20, help="timed batches per mode and thread count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pyg-site", default=None, help="directory with pyg-lib/torch-sparse to import from")
    parser.add_argument("--cuda-streams", type=int, default=4,
                        help="gpu/uva modes are also timed with this many batches in flight (0 = skip)")  # fmt: skip
    parser.add_argument("--out", default="results/sampling.json")
    args = parser.parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"--modes: unknown {sorted(unknown)}; choose from {sorted(MODES)}")
    return args


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def print_table(results: list[Result]) -> None:
    header = f"{'mode':<8}{'threads':>8}{'SEPS (M/s)':>12}{'median ms':>11}{'p90 ms':>9}{'edges/batch':>13}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r.mode:<8}{r.threads:>8}{r.seps / 1e6:>12.2f}{r.latency_ms_median:>11.2f}{r.latency_ms_p90:>9.2f}"
              f"{r.edges_per_batch_mean:>13.0f}")  # fmt: skip
    by_key = {(r.mode, r.threads): r for r in results}
    for (mode, threads), r in by_key.items():
        base = by_key.get(("pyg", threads))
        if mode != "pyg" and base is not None:
            print(f"{mode} / pyg at {threads} threads: {r.seps / base.seps:.2f}x SEPS")


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    if args.pyg_site:
        sys.path.insert(0, os.path.abspath(args.pyg_site))
    print(f"graph: {args.nodes:,} nodes, avg degree {args.avg_degree}, Zipf alpha {args.alpha} ...", flush=True)
    start = time.perf_counter()
    graph = power_law_graph(args.nodes, args.avg_degree, args.alpha, args.seed)
    degrees = graph.indptr.diff()
    print(f"  {graph.num_edges:,} edges in {time.perf_counter() - start:.1f} s; max in-degree "
          f"{int(degrees.max()):,}, median {float(degrees.median()):.0f}", flush=True)  # fmt: skip

    results, skipped = [], {}
    for name in args.modes.split(","):
        try:
            sample = MODES[name](graph, args.fanouts, args.replace)
        except (ModeUnavailable, ImportError) as exc:
            skipped[name] = str(exc)
            print(f"  skipping mode {name}: {exc}", flush=True)
            continue
        for threads in args.threads:
            result = measure(name, sample, graph, threads, args.batch_size, args.warmup, args.batches, args.seed)
            print(f"  {name} @ {threads} threads: {result.seps / 1e6:.2f} M SEPS, "
                  f"{result.latency_ms_median:.1f} ms/batch", flush=True)  # fmt: skip
            results.append(result)
        if name in ("gpu", "uva") and args.cuda_streams > 1:
            result = measure_concurrent(name, lambda: sample, graph, args.cuda_streams, args.batch_size, args.warmup,
                                        args.batches, args.seed)  # fmt: skip
            print(f"  {result.mode}: {args.cuda_streams} batches in flight: {result.seps / 1e6:.2f} M SEPS, "
                  f"{result.latency_ms_median:.1f} ms/batch", flush=True)  # fmt: skip
            results.append(result)

    print_table(results)
    report = {
        "benchmark": "sampling",
        "config": {k: v for k, v in vars(args).items() if k != "pyg_site"},
        "graph": {"num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                  "max_in_degree": int(degrees.max())},  # fmt: skip
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
                    "peak_rss_gib": round(peak_rss_gib(), 2)},  # fmt: skip
        "results": [asdict(r) for r in results],
        "skipped": skipped,
    }
    if args.out:
        write_json(args.out, report)
        print(f"wrote {args.out} (peak RSS {peak_rss_gib():.1f} GiB)")
    return report


if __name__ == "__main__":
    main()
