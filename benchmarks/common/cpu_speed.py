"""How fast each CPU this process may use runs host-bound Python right now: a benchmark condition beside the GPU's.

A rank's step with a small model is bound by its host-side forward (launches, autograd, Python), so its step rate
follows the speed of the CPU its main thread runs on. On the lent 2 x H200 VM (KVM, 32 vCPUs shown as one thread a
core, 2026-11-30) that speed is not one figure: pinned to each vCPU in turn, 12 passes, a pure-Python loop took 8.5 ms
(median) in 37 % of the samples and 15.0 ms (1.76x) in 59 %, and 2,000 tiny CUDA launches 8.0 against 10.9 us each
(1.36x). Every vCPU changed between the two within seconds: the host's other load on the physical core under it,
which the guest does not see (no steal, no throttling recorded). DDP steps in lockstep, so two ranks wait for the
slower of two draws where one GPU takes one: a per-rank loss of ~6-11 % from the machine alone.

:func:`probe` times the loop on each allowed CPU (about 20 ms each) and :func:`summarise` tells the fast samples from
the slow; benchmarks record both before each run, so a row's figure can be read against the machine it met. Run as a
command it prints one line per CPU and writes the JSON::

    python -m benchmarks.common.cpu_speed --passes 12 --out /tmp/cpu_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from statistics import median
from typing import Any, Callable, Optional

__all__ = ["cuda_launch_timer", "describe", "measure", "probe", "summarise"]

LOOP_ITERS = 200_000
#: A sample within this factor of the probe's fastest counts as a CPU at full speed.
FAST_WITHIN = 1.25


def python_loop_ms(iters: int = LOOP_ITERS) -> float:
    """Milliseconds of a pure-Python loop of ``iters`` integer additions on the calling thread."""
    start = time.perf_counter()
    acc = 0
    for i in range(iters):
        acc += i & 7
    return (time.perf_counter() - start) * 1e3


def cuda_launch_timer() -> Optional[Callable[[int], float]]:
    """A timer for :func:`probe`: microseconds a launch of ``n`` back-to-back tiny CUDA kernels (``x.add_(1)`` on 16
    floats) took, its context and kernel warmed up; ``None`` without torch or a CUDA device."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    x = torch.zeros(16, device="cuda")

    def launch_us(launches: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(launches):
            x.add_(1)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / launches * 1e6

    launch_us(100)
    return launch_us


def probe(passes: int = 1, iters: int = LOOP_ITERS, timer: Callable[[int], float] = python_loop_ms) -> dict[str, Any]:
    """Each allowed CPU's loop time in ``passes`` passes (the calling thread pinned to it in turn, once warmed up),
    then the thread's own CPU set restored. ``{"cpus": {cpu: [ms per pass]}, "seconds": wall}``; without
    ``sched_setaffinity`` (not Linux) ``{"cpus": {}, "unavailable": why}``."""
    if not hasattr(os, "sched_setaffinity"):
        return {"cpus": {}, "unavailable": "os.sched_setaffinity is missing on this platform"}
    allowed = sorted(os.sched_getaffinity(0))
    start = time.perf_counter()
    times: dict[int, list[float]] = {cpu: [] for cpu in allowed}
    try:
        for _ in range(passes):
            for cpu in allowed:
                os.sched_setaffinity(0, {cpu})
                timer(iters // 10)  # the first instructions after a migration
                times[cpu].append(round(timer(iters), 3))
    finally:
        os.sched_setaffinity(0, set(allowed))
    return {"cpus": times, "seconds": round(time.perf_counter() - start, 3)}


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """The samples of :func:`probe` split at :data:`FAST_WITHIN` of the fastest: how many CPUs, the share of samples
    at full speed, the median fast time and the median slow one over it (``None`` where there were none)."""
    samples = [ms for per_cpu in result.get("cpus", {}).values() for ms in per_cpu]
    if not samples:
        return {"cpus": 0, "samples": 0, "fast_share": None, "fast_ms": None, "slow_over_fast": None}
    edge = min(samples) * FAST_WITHIN
    fast = [ms for ms in samples if ms <= edge]
    slow = [ms for ms in samples if ms > edge]
    return {
        "cpus": len(result["cpus"]),
        "samples": len(samples),
        "fast_share": round(len(fast) / len(samples), 3),
        "fast_ms": round(median(fast), 3),
        "slow_over_fast": round(median(slow) / median(fast), 3) if slow else None,
    }


def describe(summary: dict[str, Any], unit: str = "ms") -> str:
    """One line for a report: e.g. ``host CPUs: 37 % of 384 samples at full speed (8.5 ms), the rest 1.76x slower``
    (``unit``: what the timed samples are in)."""
    if not summary.get("samples"):
        return "host CPUs: not probed"
    line = (f"host CPUs: {summary['fast_share']:.0%} of {summary['samples']} samples over {summary['cpus']} CPUs at "
            f"full speed ({summary['fast_ms']:.1f} {unit})")
    ratio: Optional[float] = summary.get("slow_over_fast")
    return line + (f", the rest {ratio:.2f}x slower" if ratio else ", none slower")


def measure(passes: int = 1) -> dict[str, Any]:
    """:func:`probe` and its :func:`summarise`, as benchmarks record them (``{"summary": ..., "cpus": ...}``)."""
    result = probe(passes)
    return {**result, "summary": summarise(result)}


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=3, help="passes over every allowed CPU (default 3)")
    parser.add_argument("--cuda", action="store_true", help="also time 2,000 tiny CUDA launches on each CPU")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    result = measure(args.passes)
    for cpu, per_pass in result["cpus"].items():
        print(f"cpu {cpu:4d}  loop ms {per_pass}")
    print(describe(result["summary"]), f"({result.get('seconds', 0):.1f} s)")
    timer = cuda_launch_timer() if args.cuda else None
    if args.cuda and timer is None:
        result["launch_us"] = {"cpus": {}, "unavailable": "no CUDA device"}
        print("CUDA launches: not timed (no CUDA device)")
    elif timer is not None:
        launches = probe(args.passes, iters=2_000, timer=timer)
        result["launch_us"] = {**launches, "summary": summarise(launches)}
        print("CUDA launches:", describe(result["launch_us"]["summary"], unit="us"))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
