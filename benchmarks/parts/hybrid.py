"""Does hybrid CPU/GPU sampling beat the better single device while the GPU trains a model?

Training steps/s of a 3-layer GraphSAGE over a power-law graph (features in registered host memory, gathered
zero-copy), with each batch's sampling placed by :class:`~lightning_zerocopy.sampling.HybridDispatcher`, on a
workload mix. Every configuration runs the same code (the dispatcher, ``--depth`` batches sampled ahead on
per-device threads, results taken in batch order); only its lanes differ:

* ``cpu``     C++ sampler threads only (the structure goes to the GPU in one pinned copy)
* ``gpu``     the CUDA sampler over a GPU copy of the topology only
* ``uva``     the CUDA sampler reading the topology from registered host memory only
* ``hybrid``  CPU threads and the GPU sampler concurrently, each batch where it is expected to finish first
* ``hybrid_prefer``  the same, but a batch goes to the CPU whenever the CPU is expected to finish it before the
              trainer needs it (its deadline: batches ahead x the measured step interval), keeping the GPU's SMs
              for training
* ``hybrid_uva``  CPU threads and the UVA sampler
* ``auto``    the ``auto`` policy over cpu + gpu (hybrid if measurably faster, else the better device)

Workloads: every batch size of ``--batch-sizes`` (64 to 4096) with seeds skewed to high-degree nodes (the top
``--hot-frac`` by in-degree) or low-degree ones (the bottom half), each with a light and a heavy model, plus one
``mixed`` workload per model that cycles through all sizes and both skews. Per run: steps/s over ``--steps``
steps after ``--warmup`` (or until ``--max-seconds``), the share of batches per lane, and the median predicted and
measured sampling ms per lane. The ratio hybrid / max(cpu, gpu) per workload is the figure of merit (aims in
issue 15: >= 1 on every workload, >= 1.2 on the mixed one).

``--gather-split`` also measures where a hybrid batch's feature gather should run: the fraction ``f`` of its rows
gathered by CPU threads into pinned memory and copied (concurrently with the GPU reading the other rows zero-copy),
for f in 0 (all zero-copy), 0.25, 0.5, 0.75, 1 (all CPU), in GB/s of feature bytes delivered, for each row width of
``--split-features`` over a ``--split-gib`` table (the batches' ids spread over it), once with the GPU idle and
once while it trains the heavy model on another thread (the gather then competes with training as in the aims).

Example (on the GPU machine)::

    python -m benchmarks.parts.hybrid --out results/hybrid.json
    python -m benchmarks.parts.hybrid --nodes 20000 --avg-degree 10 --steps 5 --warmup 2 --device cpu   # plumbing check
    (on the CPU the "gpu"/"uva" lanes are a one-thread CPU sampler: it checks the code, it measures nothing)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (REPO_ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

from benchmarks.common.results import write_json  # noqa: E402

from sampling import power_law_graph  # noqa: E402  (benchmarks/parts/sampling.py)

from lightning_zerocopy import ops  # noqa: E402
from lightning_zerocopy.sampling import HybridDispatcher, HybridPolicy, NeighborSampler, SampleSizeEstimator  # noqa: E402

LANES = {"cpu": ("cpu",), "gpu": ("gpu",), "uva": ("uva",), "hybrid": ("cpu", "gpu"), "hybrid_uva": ("cpu", "uva"),
         "hybrid_prefer": ("cpu", "gpu"), "auto": ("cpu", "gpu")}  # fmt: skip
MODELS = {"light": 32, "heavy": 1024}  # hidden channels of the 3-layer GraphSAGE


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=2_000_000)
    p.add_argument("--avg-degree", type=float, default=25.0)
    p.add_argument("--alpha", type=float, default=0.6, help="Zipf exponent of the degrees (as benchmarks/parts/sampling.py)")
    p.add_argument("--features", type=int, default=128, help="fp32 features per node")
    p.add_argument("--classes", type=int, default=16)
    p.add_argument("--fanouts", type=int, nargs="+", default=[15, 10, 5])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    p.add_argument("--hot-frac", type=float, default=0.05, help="high-degree seeds: the top fraction by in-degree")
    p.add_argument("--configs", default="cpu,gpu,uva,hybrid,hybrid_prefer,auto", help="also: hybrid_uva")
    p.add_argument("--models", default="light,heavy")
    p.add_argument("--cpu-threads", type=int, default=None, help="sampler threads (default: torch's)")
    p.add_argument("--depth", type=int, default=4, help="batches sampled ahead")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--max-seconds", type=float, default=2.0, help="cap on a run's timed part")
    p.add_argument("--gather-split", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--split-features", type=int, nargs="+", default=[32, 128, 512], help="fp32 row widths")
    p.add_argument("--split-gib", type=float, default=4.0, help="table size of the gather split, GiB")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: plumbing check of the cpu lane")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results JSON here")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ workloads
def seed_pools(indptr: torch.Tensor, hot_frac: float) -> dict[str, torch.Tensor]:
    """Node ids to draw seeds from: the highest in-degree ``hot_frac`` (``high``) and the lower half (``low``)."""
    order = torch.argsort(indptr.diff(), descending=True)
    n = order.numel()
    return {"high": order[: max(int(n * hot_frac), 1)], "low": order[n // 2 :]}


def workloads(batch_sizes: list[int]) -> dict[str, list[tuple[int, str]]]:
    """Workload name -> the (batch size, skew) cycle its batches follow."""
    out = {f"bs{bs}_{skew}": [(bs, skew)] for bs in batch_sizes for skew in ("high", "low")}
    out["mixed"] = [(bs, skew) for bs in batch_sizes for skew in ("high", "low")]
    return out


def batch_seeds(pools: dict[str, torch.Tensor], cycle: list[tuple[int, str]], count: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    seeds = []
    for step in range(count):
        bs, skew = cycle[step % len(cycle)]
        pool = pools[skew]
        seeds.append(pool[torch.randperm(pool.numel(), generator=gen)[: min(bs, pool.numel())]])
    return seeds


# ------------------------------------------------------------------------------------------------ pieces
def make_model(hidden: int, in_channels: int, classes: int, layers: int, device: torch.device) -> torch.nn.Module:
    from torch_geometric.nn import GraphSAGE

    return GraphSAGE(in_channels, hidden, num_layers=layers, out_channels=classes).to(device)


def make_samplers(graph: Any, fanouts: list[int], threads: Optional[int], device: torch.device) -> dict[str, Callable]:
    """Lane name -> ``sample(seeds, batch_seed)`` returning ``(n_id, edge_index)`` on ``device``."""
    cpu = NeighborSampler(graph.indptr, graph.indices, fanouts=fanouts, num_threads=threads)

    def on_cpu(seeds: torch.Tensor, seed: int):
        s = cpu.sample(seeds, seed)
        if device.type != "cuda":
            return s.n_id, s.edge_index
        packed = torch.cat([s.n_id, s.edge_index.reshape(-1)]).pin_memory().to(device, non_blocking=True)
        return packed[: s.n_id.numel()], packed[s.n_id.numel() :].view(2, -1)

    samplers: dict[str, Callable] = {"cpu": on_cpu}
    if device.type != "cuda":  # plumbing check: the "GPU" lanes are a one-thread CPU sampler
        one = NeighborSampler(graph.indptr, graph.indices, fanouts=fanouts, num_threads=1)
        samplers["gpu"] = samplers["uva"] = lambda seeds, seed: (lambda s: (s.n_id, s.edge_index))(one.sample(seeds, seed))
    else:
        for placement in ("gpu", "uva"):
            gs = NeighborSampler(graph.indptr, graph.indices, fanouts=fanouts, placement=placement, device=device)
            samplers[placement] = lambda seeds, seed, gs=gs: (lambda s: (s.n_id, s.edge_index))(gs.sample(seeds, seed))
    return samplers


def run(args, config, model_name, cycle, pools, samplers, estimator, table, labels, device) -> dict:
    """Train ``--warmup`` + ``--steps`` steps with the configuration's lanes; steps/s and per-lane figures."""
    torch.manual_seed(args.seed)
    model = make_model(MODELS[model_name], args.features, args.classes, len(args.fanouts), device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    lanes = LANES[config]
    policy = HybridPolicy(lanes, mode="auto" if config == "auto" else "hybrid", auto_after=32,
                          prefer="cpu" if config == "hybrid_prefer" else None)  # fmt: skip
    on_cuda = device.type == "cuda"
    dispatcher = HybridDispatcher(policy, make_stream=(lambda lane: torch.cuda.Stream(device)) if on_cuda else None)
    total = args.warmup + args.steps
    seeds = batch_seeds(pools, cycle, total, args.seed)
    sizes = [estimator.size(s) for s in seeds]

    interval: list[Optional[float]] = [None, None]  # EWMA of the seconds between takes, time of the last take

    def submit(step: int, ahead: int) -> None:
        if step < total:
            deadline = None if interval[0] is None else ahead * interval[0]
            dispatcher.submit(step, sizes[step], lambda lane, s=step: samplers[lane](seeds[s], s), deadline)

    records, losses, t0, timed, edges = [], [], 0.0, 0, 0
    try:
        for step in range(args.depth):
            submit(step, step + 1)
        for step in range(total):
            if step == args.warmup:
                torch.cuda.synchronize(device) if on_cuda else None
                t0 = time.perf_counter()
            (n_id, edge_index), record = dispatcher.take(step)
            now = time.perf_counter()
            if interval[1] is not None:
                interval[0] = now - interval[1] if interval[0] is None else 0.8 * interval[0] + 0.2 * (now - interval[1])
            interval[1] = now
            submit(step + args.depth, args.depth)
            x = ops.gather_rows(table, n_id) if on_cuda else table[n_id]
            y = labels[n_id[: seeds[step].numel()]]
            out = model(x, edge_index)[: seeds[step].numel()]
            loss = torch.nn.functional.cross_entropy(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))  # one host read per step, as Lightning's logging does
            if step >= args.warmup:
                timed += 1
                edges += int(edge_index.shape[1])
                records.append(record)
                if time.perf_counter() - t0 > args.max_seconds:
                    break
        torch.cuda.synchronize(device) if on_cuda else None
        seconds = time.perf_counter() - t0
    finally:
        dispatcher.close()
    per_lane = {}
    for lane in lanes:
        mine = [r for r in records if r is not None and r.lane == lane]
        per_lane[lane] = {
            "share": len(mine) / max(len(records), 1),
            "predicted_ms_median": 1e3 * statistics.median([r.predicted_s for r in mine]) if mine else None,
            "measured_ms_median": 1e3 * statistics.median([r.measured_s for r in mine]) if mine else None,
            "abs_error_ms_median": 1e3 * statistics.median([abs(r.predicted_s - r.measured_s) for r in mine]) if mine else None,
        }  # fmt: skip
    return {"config": config, "model": model_name, "steps": timed, "seconds": seconds,
            "steps_per_s": timed / seconds if seconds > 0 else 0.0, "seps": edges / seconds if seconds > 0 else 0.0,
            "lanes": per_lane, "auto_choice": policy.stats.auto_choice, "last_loss": losses[-1] if losses else None}  # fmt: skip


def gather_split(table: torch.Tensor, batches: list[torch.Tensor], device: torch.device, repeats: int = 5) -> list[dict]:
    """GB/s delivered when CPU threads gather a fraction ``f`` of each batch's rows (pinned + copy) while the GPU
    reads the rest zero-copy on another thread and stream, in address order (``sort_ids``: the order the DataModule's
    zero-copy gather chose at every row width measured; batch order is 2-3x slower for rows of 512 B and less)."""
    pool = ThreadPoolExecutor(max_workers=1)
    stream = torch.cuda.Stream(device)
    main_stream = torch.cuda.current_stream(device)
    results = []

    def sync() -> None:  # the gather's two streams only: a device-wide sync would also wait for the training thread
        stream.synchronize()
        main_stream.synchronize()

    def gpu_part(ids: torch.Tensor, out: torch.Tensor) -> None:
        with torch.cuda.stream(stream):
            ops.gather_rows(table, ids.to(device, non_blocking=True), out, sort_ids=True)  # returns once written

    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        times, nbytes = [], 0
        for rep in range(repeats + 1):
            t = 0.0
            for ids in batches:
                k = int(round(frac * ids.numel()))  # rows [0, k) by the CPU, [k, n) by the GPU
                out = torch.empty((ids.numel(), table.shape[1]), dtype=table.dtype, device=device)
                staged = torch.empty((k, table.shape[1]), dtype=table.dtype, pin_memory=True)
                sync()
                t0 = time.perf_counter()
                future = pool.submit(gpu_part, ids[k:], out[k:]) if k < ids.numel() else None
                if k:
                    ops.gather_rows(table, ids[:k], staged)
                    out[:k].copy_(staged, non_blocking=True)
                if future is not None:
                    future.result()
                sync()
                t += time.perf_counter() - t0
                if rep == 0:
                    probe = torch.randperm(ids.numel())[:256]
                    if not torch.equal(out[probe.to(device)].cpu(), table[ids[probe]]):
                        raise AssertionError(f"gather split f={frac}: wrong rows")
                elif rep:
                    nbytes += ids.numel() * table.shape[1] * table.element_size()
            if rep:
                times.append(t)
        results.append({"cpu_fraction": frac, "GBps": nbytes / repeats / 1e9 / statistics.median(times),
                        "gpu_read_order": "sorted"})  # fmt: skip
    pool.shutdown()
    return results


def gather_split_study(args, n_ids: list[torch.Tensor], device: torch.device) -> list[dict]:
    """:func:`gather_split` per row width, GPU idle and GPU training the heavy model on another thread."""
    import threading

    out = []
    for width in args.split_features:
        rows = max(int(args.split_gib * 2**30 // (4 * width)), args.nodes)
        gen = torch.Generator().manual_seed(args.seed)
        table = torch.randn((rows, width), generator=gen)
        spread = torch.randperm(rows, generator=gen)  # graph ids -> rows all over the table
        batches = [spread[n_id.cpu() * (rows // args.nodes)] for n_id in n_ids]
        from lightning_zerocopy.graph.host_registration import register_host_tensor

        with register_host_tensor(table, name="split table"):
            for busy in (False, True):
                stop = threading.Event()
                trainer = threading.Thread(target=_train_forever, args=(stop, device), daemon=True) if busy else None
                if trainer is not None:
                    trainer.start()
                try:
                    for r in gather_split(table, batches, device):
                        r.update(row_bytes=4 * width, gpu_training=busy)
                        out.append(r)
                        print(f"  gather split {4 * width:5d} B rows, training={busy!s:5}: f={r['cpu_fraction']:.2f} "
                              f"{r['GBps']:.1f} GB/s", flush=True)  # fmt: skip
                finally:
                    stop.set()
                    if trainer is not None:
                        trainer.join()
        del table
    return out


def _train_forever(stop, device: torch.device) -> None:
    """A heavy MLP training loop on its own stream (the GPU load of the gather study)."""
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(8192, 1024, device=device)
    with torch.cuda.stream(torch.cuda.Stream(device)):
        while not stop.is_set():
            loss = model(x).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.current_stream(device).synchronize()


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: run with --device cpu for the plumbing check")
    configs = [c for c in args.configs.split(",") if c]
    t0 = time.perf_counter()
    graph = power_law_graph(args.nodes, args.avg_degree, args.alpha, args.seed)
    estimator = SampleSizeEstimator.from_graph(graph.indptr, graph.indices, args.fanouts)
    estimate_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(args.seed)
    table = torch.randn((args.nodes, args.features), generator=gen)
    labels = torch.randint(0, args.classes, (args.nodes,), generator=gen).to(device)
    registration = None
    if device.type == "cuda":
        from lightning_zerocopy.graph.host_registration import register_host_tensor

        registration = register_host_tensor(table, name="features")
    results: dict[str, Any] = {"args": vars(args), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                               "graph_and_estimate_s": estimate_s, "runs": [], "summary": {}}  # fmt: skip
    samplers = make_samplers(graph, args.fanouts, args.cpu_threads, device)
    pools = seed_pools(graph.indptr, args.hot_frac)
    for model_name, (name, cycle) in itertools.product(args.models.split(","), workloads(args.batch_sizes).items()):
        row = {}
        for config in configs:
            r = run(args, config, model_name, cycle, pools, samplers, estimator, table, labels, device)
            r["workload"] = name
            results["runs"].append(r)
            row[config] = r["steps_per_s"]
            shares = {lane: round(v["share"], 2) for lane, v in r["lanes"].items()}
            print(f"{model_name:5s} {name:14s} {config:10s} {r['steps_per_s']:8.1f} steps/s  shares {shares}", flush=True)
        singles = [row[c] for c in ("cpu", "gpu") if c in row]
        if singles:
            best = max(singles)
            ratios = {f"{c}_over_best_single": row[c] / best for c in ("hybrid", "hybrid_prefer", "auto") if c in row}
            results["summary"][f"{model_name}/{name}"] = {**ratios, **row}
    if args.gather_split and device.type == "cuda":
        cpu = samplers["cpu"]
        n_ids = [cpu(s, i)[0] for i, s in enumerate(batch_seeds(pools, [(1024, "low")], 4, args.seed))]
        results["gather_split"] = gather_split_study(args, n_ids, device)
    if registration is not None:
        registration.close()
    if args.out:
        write_json(args.out, results, default=str)
    print(json.dumps(results["summary"], indent=1))
    return results


if __name__ == "__main__":
    main()
