"""Per-batch latency of the CUDA sampler: the lean path (bounded fanouts, one read-back per batch) replayed from a
CUDA graph per batch shape, the same launches issued directly, and the per-hop path (a read-back per hop), alone
on the GPU and as a 10 % MPS client (the pipeline worker's share).

Every condition runs in a fresh process (an MPS client's share is fixed when its CUDA context is made):

* ``idle``        no MPS, nothing else on the GPU
* ``mps10``       an MPS client limited to ``--share`` % of the SMs, nothing else on the GPU
* ``mps10_busy``  the same while another MPS client (the remaining SMs) runs bf16 matmuls, as training does

In each, the same batches (``--batch-size`` random seeds, ``--fanouts``, a Zipf power-law graph in GPU memory)
are sampled by each path (``graph``: the default; ``lean``: ``ops.set_sampler_graphs(False)``; ``per_hop``:
``ops.set_lean_sampler(False)``), checked bitwise equal, and timed per call (wall time: each call ends with its
own read-back). Per path it also counts, with the torch profiler over a few batches, the launches (kernels and
graphs), copies, and host synchronizations (stream/device syncs and device-to-host copies) per batch. Issue 15's
aim: the lean path at half the per-hop latency under the 10 % share.

    python -m benchmarks.parts.lean_sampler --out results/lean_sampler.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (REPO_ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

from benchmarks.common.results import write_json  # noqa: E402

CONDITIONS = ("idle", "mps10", "mps10_busy")
_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2_000_000)
    p.add_argument("--avg-degree", type=float, default=25.0)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--fanouts", type=int, nargs="+", default=[15, 10, 5])
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--batches", type=int, default=50, help="timed batches per path")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--share", type=int, default=10, help="SM percentage of the sampler's MPS client")
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def count_calls(sample, seeds: list) -> dict[str, float]:
    """Kernel launches and host synchronizations per batch, from the profiler's CUDA runtime events."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for s in seeds:
            sample(s)
        torch.cuda.synchronize()
    launches = graphs = copies = syncs = 0
    kernel_us = 0.0
    for event in prof.events():
        name = event.name
        if event.device_type == torch.autograd.DeviceType.CUDA:  # a kernel or copy as the GPU ran it
            kernel_us += getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0)
            continue
        if "LaunchKernel" in name or name.startswith("cuLaunch"):
            launches += 1
        elif name.startswith("cudaGraphLaunch"):
            graphs += 1
        elif name.startswith(_SYNC_CALLS) and ("DtoH" in name or "Synchronize" in name or name == "cudaMemcpy"):
            syncs += 1
        elif name.startswith(("cudaMemcpyAsync", "cudaMemsetAsync")):
            copies += 1  # the read-back's wait is counted as its synchronization
    n = len(seeds)
    return {"launches_per_batch": (launches + graphs) / n, "kernel_launches_per_batch": launches / n,
            "graph_launches_per_batch": graphs / n, "copies_per_batch": copies / n, "syncs_per_batch": syncs / n,
            "gpu_busy_ms_per_batch": kernel_us / n / 1e3}


def measure(args: argparse.Namespace) -> dict:
    """This process's figures (the parent chose its MPS share through the environment)."""
    import torch

    from lightning_zerocopy import ops
    from sampling import power_law_graph

    graph = power_law_graph(args.nodes, args.avg_degree, args.alpha, args.seed)
    indptr, indices = graph.indptr.cuda(), graph.indices.cuda()
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    seeds = [torch.randperm(args.nodes, device="cuda", generator=gen)[: args.batch_size]
             for _ in range(args.warmup + args.batches)]  # fmt: skip

    def sample(s: torch.Tensor):
        return ops.sample_neighbors(indptr, indices, s, args.fanouts, False, args.seed)

    result: dict = {"device": torch.cuda.get_device_name(), "sms_visible": torch.cuda.get_device_properties(0).multi_processor_count}
    outputs = {}
    for path, lean, graphs in (("graph", True, True), ("lean", True, False), ("per_hop", False, False)):
        ops.set_lean_sampler(lean)
        ops.set_sampler_graphs(graphs)
        times = []
        for i, s in enumerate(seeds):
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = sample(s)
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append((time.perf_counter() - start) * 1e3)
        outputs[path] = out
        result[path] = {
            "ms_median": statistics.median(times),
            "ms_p90": sorted(times)[int(0.9 * (len(times) - 1))],
            "sampled_edges": int(out.row.numel()),
            **count_calls(sample, seeds[:5]),
        }
    ops.set_lean_sampler(True)
    ops.set_sampler_graphs(True)
    ref = outputs["per_hop"]
    result["bitwise_equal"] = all(
        torch.equal(getattr(out, f), getattr(ref, f)) for out in outputs.values() for f in ("n_id", "row", "col", "edge_pos")
    )
    result["graph_stats"] = ops.sampler_graph_stats()
    per_hop = result["per_hop"]["ms_median"]
    result["lean_over_per_hop"] = result["lean"]["ms_median"] / per_hop
    result["graph_over_per_hop"] = result["graph"]["ms_median"] / per_hop
    return result


def busy_loop(stop_file: str) -> None:
    """A training stand-in: bf16 matmuls until ``stop_file`` exists."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    open(stop_file + ".ready", "w").close()
    while not os.path.exists(stop_file):
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def run_condition(args: argparse.Namespace, condition: str) -> dict:
    from benchmarks.parts.mps_clients import load_mps_module

    argv = [sys.executable, os.path.abspath(__file__), "--child", "measure", *_workload_argv(args)]
    env = dict(os.environ)
    daemon = busy = None
    stop_file = f"/tmp/lzc-lean-busy-{os.getpid()}"
    try:
        if condition != "idle":
            daemon = load_mps_module().start_mps()
            if daemon is None:
                return {"skipped": "CUDA MPS could not be started here"}
            env.update(daemon.client_env(args.share))
        if condition == "mps10_busy":
            busy_env = dict(env, **daemon.client_env(100 - args.share))
            busy = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", "busy", "--out", stop_file], env=busy_env)
            deadline = time.monotonic() + 60
            while not os.path.exists(stop_file + ".ready") and time.monotonic() < deadline and busy.poll() is None:
                time.sleep(0.1)
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        lines = [line[len("RESULT "):] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            return {"error": proc.stderr[-3000:]}
        return json.loads(lines[0])
    finally:
        open(stop_file, "w").close()
        if busy is not None:
            try:
                busy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                busy.kill()
        for path in (stop_file, stop_file + ".ready"):
            if os.path.exists(path):
                os.unlink(path)
        if daemon is not None:
            daemon.stop()


def _workload_argv(args: argparse.Namespace) -> list[str]:
    """The flags that fix the workload, for a child process."""
    return ["--nodes", str(args.nodes), "--avg-degree", str(args.avg_degree), "--alpha", str(args.alpha),
            "--fanouts", *map(str, args.fanouts), "--batch-size", str(args.batch_size), "--batches", str(args.batches),
            "--warmup", str(args.warmup), "--seed", str(args.seed)]  # fmt: skip


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    if args.child == "measure":
        print("RESULT " + json.dumps(measure(args)), flush=True)
        return {}
    if args.child == "busy":
        busy_loop(args.out)
        return {}
    report = {"args": vars(args), "conditions": {}}
    for condition in [c for c in args.conditions.split(",") if c]:
        if condition not in CONDITIONS:
            raise SystemExit(f"--conditions: unknown {condition!r}; known: {', '.join(CONDITIONS)}")
        r = run_condition(args, condition)
        report["conditions"][condition] = r
        if "lean" in r:
            paths = ", ".join(f"{p} {r[p]['ms_median']:.2f} ms ({r[p]['launches_per_batch']:.1f} launches, "
                              f"{r[p]['syncs_per_batch']:.1f} syncs, GPU busy {r[p]['gpu_busy_ms_per_batch']:.2f} ms)"
                              for p in ("graph", "lean", "per_hop"))  # fmt: skip
            print(f"{condition:>11}: {paths}; graph/per-hop {r['graph_over_per_hop']:.2f}, lean/per-hop "
                  f"{r['lean_over_per_hop']:.2f} (aim <= 0.5 under MPS), bitwise equal {r['bitwise_equal']}", flush=True)
        else:
            print(f"{condition:>11}: {r}", flush=True)
    if args.out:
        write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
