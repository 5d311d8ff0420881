"""What a new matrix shape costs the host: cuBLAS's per-shape setup against the data phase's extra forward time.

On 2 x H200 (2026-11-29, stage ``scaling_profile``) the trainer's host time in ``aten::mm`` was 1.8-2.3 ms a step in the
data phase and 0.44-0.62 ms in the model-only phase (``aten::addmm`` 0.86-0.99 against ~0.25), with the same module,
the same kernel launches (``cudaLaunchKernel`` alike) and no synchronizing call. The difference between the phases:
the model-only phase replays a ring of 16 batches, whose shapes repeat, while every sampled batch has row counts of its
own. cuBLAS picks an algorithm per problem shape and keeps its picks in a heuristics cache
(``CUBLASLT_HEURISTICS_CACHE_CAPACITY``, 8192 entries by default); a shape it has not seen pays the pick on the host.

This measures that cost directly, each variant in a fresh process (the cache variables are read when cuBLAS starts):

``gemm``  the host time of one bf16 ``mm`` ([M, 256] x [256, 256]) and ``addmm`` (with a bias), the GPU idle before
          each call, for a shape seen before (``repeat``), a shape never seen (``fresh``: M grows by one each call)
          and shapes drawn from a pool of 4,096 row counts (``pool``: as a long run's batches, whose row counts
          recur), under the default heuristics cache, under none (capacity 0) and under a large one (1,048,576)
``step``  the heavy GraphSAGE's training step (bf16 autocast, Adam) on batches of the heavy shape
          (:mod:`benchmarks.common.heavy_batch`) with fixed row counts (``repeat``) and with every hop's row count
          drawn anew each step (``fresh``, 0.75-0.85 x its picks as sampled batches vary), and the same fresh
          batches with the linear layers' row counts bucketed to 64 (``fresh_rows64``,
          :class:`lightning_zerocopy.callbacks.GemmRowBuckets`): the host ms until ``opt.step()`` returns with the GPU
          idle at its start, and the GPU ms (CUDA events)

Needs a GPU::

    python -m benchmarks.parts.gemm_shapes --out gemm_shapes.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from benchmarks.common.heavy_batch import CLASSES, FANOUTS, FEATURES, HIDDEN, SEEDS, heavy_train_step

#: heuristics cache variants: name -> CUBLASLT_HEURISTICS_CACHE_CAPACITY (None: cuBLAS's default)
CACHES: dict[str, Optional[str]] = {"default": None, "none": "0", "large": "1048576"}
POOL = 4096
#: the training step's batch modes: fixed row counts, new ones each step, new ones bucketed by GemmRowBuckets(64)
STEP_MODES = ("repeat", "fresh", "fresh_rows64")


def _timed(call: Any, sync: Any) -> float:
    sync()
    start = time.perf_counter()
    call()
    took = time.perf_counter() - start
    return took * 1e6


def gemm_host_us(calls: int, device: Any) -> dict[str, dict[str, float]]:
    """p50 host microseconds of one ``mm`` / ``addmm`` call per shape mode (the GPU idle before each)."""
    import torch

    sync = torch.cuda.synchronize
    w = torch.randn(HIDDEN, HIDDEN, device=device, dtype=torch.bfloat16)
    bias = torch.randn(HIDDEN, device=device, dtype=torch.bfloat16)
    top = 60_000 + calls + POOL
    x = torch.randn(top, HIDDEN, device=device, dtype=torch.bfloat16)
    rows = torch.Generator().manual_seed(0)
    pool = (50_000 + torch.randperm(POOL * 2, generator=rows)[:POOL]).tolist()
    for m in pool:  # the pool's shapes seen once, as a long run has seen its row counts (the cache permitting)
        torch.mm(x[:m], w), torch.addmm(bias, x[:m], w)
    sync()
    result: dict[str, dict[str, float]] = {}
    for op in ("mm", "addmm"):
        run = (lambda m: torch.mm(x[:m], w)) if op == "mm" else (lambda m: torch.addmm(bias, x[:m], w))
        run(40_000)
        modes = {
            "repeat": [40_000] * calls,
            "fresh": [60_000 + i + (0 if op == "mm" else calls) for i in range(calls)],
            "pool": [pool[int(i)] for i in torch.randint(0, POOL, (calls,), generator=rows)],
        }
        result[op] = {
            mode: statistics.median(_timed(lambda m=m: run(m), sync) for m in shapes) for mode, shapes in modes.items()
        }
    return result


def _jittered_batch(seed: int, device: Any, jitter: bool) -> dict[str, Any]:
    """A batch of the heavy shape drawn on ``device``; with ``jitter`` each hop's new nodes are 0.75-0.85 x its picks
    (fixed 0.8 otherwise), so the row counts differ from batch to batch."""
    import torch

    g = torch.Generator().manual_seed(seed)
    nodes = [SEEDS]
    for f in FANOUTS:
        share = 0.75 + 0.1 * float(torch.rand((), generator=g)) if jitter else 0.8
        nodes.append(int(nodes[-1] * f * share))
    starts = [sum(nodes[:k]) for k in range(len(nodes) + 1)]
    edges = []
    for k, f in enumerate(FANOUTS, start=1):
        dst = torch.arange(starts[k - 1], starts[k], device=device).repeat_interleave(f)
        src = torch.randint(0, starts[k + 1], (dst.numel(),), device=device)
        edges.append(torch.stack([src, dst]))
    return {"x": torch.randn(starts[-1], FEATURES, device=device), "edge_index": torch.cat(edges, dim=1),
            "y": torch.randint(0, CLASSES, (SEEDS,), device=device), "nodes": nodes,
            "edges": [e.shape[1] for e in edges]}  # fmt: skip


def step_ms(steps: int, warmup: int, device: Any) -> dict[str, dict[str, float]]:
    """p50 host ms (until ``opt.step()`` returns, the GPU idle at the start) and GPU ms of the heavy training step
    per :data:`STEP_MODES`."""
    import torch
    from torch_geometric.nn.models import GraphSAGE

    from lightning_zerocopy.callbacks.gemm_rows import pad_linear_rows

    result: dict[str, dict[str, float]] = {}
    for mode in STEP_MODES:
        torch.manual_seed(0)
        model = GraphSAGE(FEATURES, HIDDEN, len(FANOUTS), CLASSES, dropout=0.5).to(device)
        if mode == "fresh_rows64":
            pad_linear_rows(model, 64)  # GemmRowBuckets(multiple=64)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        fixed = _jittered_batch(0, device, jitter=False)
        host, gpu = [], []
        for i in range(warmup + steps):
            batch = fixed if mode == "repeat" else _jittered_batch(1000 + i, device, jitter=True)  # same draws
            torch.cuda.synchronize()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start = time.perf_counter()
            begin.record()
            heavy_train_step(model, opt, batch, torch.autocast("cuda", dtype=torch.bfloat16))
            end.record()
            took = (time.perf_counter() - start) * 1e3
            end.synchronize()
            if i >= warmup:
                host.append(took)
                gpu.append(begin.elapsed_time(end))
        result[mode] = {"host_ms": statistics.median(host), "gpu_ms": statistics.median(gpu)}
    return result


def _child(args: argparse.Namespace) -> None:
    import torch

    device = torch.device("cuda")
    out = {"gemm_host_us": gemm_host_us(args.calls, device), "step": step_ms(args.steps, args.warmup, device)}
    print(json.dumps(out), flush=True)


def run(caches: Sequence[str], calls: int, steps: int, warmup: int, timeout: float) -> dict[str, Any]:
    """Each heuristics cache variant in a process of its own; its figures, or the error it ended with."""
    results: dict[str, Any] = {}
    for name in caches:
        env = dict(os.environ)
        env.pop("CUBLASLT_HEURISTICS_CACHE_CAPACITY", None)
        if CACHES[name] is not None:
            env["CUBLASLT_HEURISTICS_CACHE_CAPACITY"] = CACHES[name]
        cmd = [sys.executable, "-m", "benchmarks.parts.gemm_shapes", "--child", "--calls", str(calls),
               "--steps", str(steps), "--warmup", str(warmup)]  # fmt: skip
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            results[name] = {"error": f"timed out after {timeout:.0f} s"}
            continue
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        results[name] = json.loads(lines[-1]) if done.returncode == 0 and lines else {"error": done.stderr[-2000:]}
        print(f"{name}: {json.dumps(results[name])[:600]}", flush=True)
    return results


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--caches", default=",".join(CACHES), help=f"heuristics cache variants ({', '.join(CACHES)})")
    parser.add_argument("--calls", type=int, default=300, help="timed calls per GEMM shape mode")
    parser.add_argument("--steps", type=int, default=100, help="timed training steps per batch mode")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per variant's process")
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return
    caches = [c.strip() for c in args.caches.split(",") if c.strip()]
    unknown = sorted(set(caches) - set(CACHES))
    if unknown:
        parser.error(f"unknown --caches {', '.join(unknown)}: choose from {', '.join(CACHES)}")
    results = run(caches, args.calls, args.steps, args.warmup, args.timeout)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
