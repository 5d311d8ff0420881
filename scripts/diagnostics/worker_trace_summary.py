"""Where a profiled process's GPU time goes, from a torch.profiler Chrome trace (LIGHTNING_ZEROCOPY_WORKER_PROFILE).

Prints, per GPU stream: kernels, copies and memsets (count, summed and busy milliseconds over the window), the kernels
with the most time, and how long each kernel waited on the GPU between the host's launch call and its start (a long
wait with a short kernel means it queued behind other work); per host thread: the CUDA runtime and driver calls with
the most time (synchronizations show how long a thread waited for the GPU).

    python3 scripts/diagnostics/worker_trace_summary.py /tmp/prof/worker_trace_<pid>.json [--top 8]

``--against BASE`` compares instead: for each kernel name in both traces (e.g. a row's trainer beside the worker
against ``model_only``'s, LIGHTNING_ZEROCOPY_TRAINER_PROFILE), its mean duration in each and the time it adds over
the window, the kernels that grew most first; then the kernels only one trace has.

    python3 scripts/diagnostics/worker_trace_summary.py trainer_zc_gpu_mps-heavy_trace_<pid>.json \
        --against trainer_model_only-heavy_trace_<pid>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from typing import Any

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cuda_runtime", "cuda_driver")


def _busy_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (microseconds in, milliseconds out)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1e3


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summarize(events: list[dict[str, Any]], top: int) -> str:
    complete = [e for e in events if e.get("ph") == "X"]
    threads = {(e.get("pid"), e.get("tid")): e["args"].get("name") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name" and "args" in e}  # fmt: skip
    launches = {e["args"]["correlation"]: e for e in complete
                if e.get("cat") in HOST_CATEGORIES and "correlation" in e.get("args", {})}  # fmt: skip
    gpu = [e for e in complete if e.get("cat") in GPU_CATEGORIES]
    if not gpu:
        return "no GPU activity in the trace (was CUDA profiling available?)"
    t0 = min(e["ts"] for e in gpu)
    t1 = max(e["ts"] + e["dur"] for e in gpu)
    lines = [f"window {(t1 - t0) / 1e3:.1f} ms of GPU activity, {len(gpu)} GPU events"]
    by_stream: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in gpu:
        by_stream[e.get("args", {}).get("stream", e.get("tid"))].append(e)
    for stream, evs in sorted(by_stream.items(), key=lambda kv: -sum(e["dur"] for e in kv[1])):
        cats = defaultdict(float)
        for e in evs:
            cats[e["cat"]] += e["dur"] / 1e3
        waits = [e["ts"] - launches[e["args"]["correlation"]]["ts"] for e in evs
                 if e["args"].get("correlation") in launches]  # fmt: skip
        lines.append(f"\nstream {stream}: {len(evs)} events, busy {_busy_ms([(e['ts'], e['ts'] + e['dur']) for e in evs]):.1f} ms; "
                     + ", ".join(f"{c} {ms:.1f} ms" for c, ms in cats.items()))  # fmt: skip
        if waits:
            lines.append(f"  launch call -> start on the GPU: p50 {_pct(waits, 0.5) / 1e3:.3f} ms, p90 "
                         f"{_pct(waits, 0.9) / 1e3:.3f} ms, max {max(waits) / 1e3:.3f} ms ({len(waits)} matched)")
        names: dict[str, list[float]] = defaultdict(list)
        for e in evs:
            names[e["name"]].append(e["dur"])
        for name, durs in sorted(names.items(), key=lambda kv: -sum(kv[1]))[:top]:
            lines.append(f"  {sum(durs) / 1e3:8.2f} ms  {len(durs):5d} x {statistics.mean(durs):8.1f} us  {name[:90]}")
    lines.append("\nhost threads' CUDA calls (runtime and driver):")
    by_thread: dict[Any, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for e in complete:
        if e.get("cat") in HOST_CATEGORIES:
            by_thread[(e.get("pid"), e.get("tid"))][e["name"]].append(e["dur"])
    for key, calls in sorted(by_thread.items(), key=lambda kv: -sum(map(sum, kv[1].values()))):
        lines.append(f"thread {key[1]} ({threads.get(key) or '?'}): {sum(map(sum, calls.values())) / 1e3:.1f} ms in calls")
        for name, durs in sorted(calls.items(), key=lambda kv: -sum(kv[1]))[:top]:
            lines.append(f"  {sum(durs) / 1e3:8.2f} ms  {len(durs):5d} x {statistics.mean(durs):8.1f} us  "
                         f"(max {max(durs) / 1e3:.3f} ms)  {name}")
    return "\n".join(lines)


def _kernels(events: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Durations (us) of each kernel name's launches."""
    names: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            names[e["name"]].append(e["dur"])
    return names


def compare(events: list[dict[str, Any]], base: list[dict[str, Any]], top: int) -> str:
    """Per kernel name in both traces: mean us here and in ``base``, and the ms it adds here over the window (mean
    difference times this trace's count), the most added first; then the kernels only one trace has."""
    here, there = _kernels(events), _kernels(base)
    if not here or not there:
        return "no kernels in one of the traces (was CUDA profiling available?)"
    shared = [(n, here[n], there[n]) for n in here.keys() & there.keys()]
    added = {n: (statistics.mean(a) - statistics.mean(b)) * len(a) / 1e3 for n, a, b in shared}
    lines = [f"kernels: {sum(map(sum, here.values())) / 1e3:.1f} ms here ({sum(map(len, here.values()))} launches) "
             f"against {sum(map(sum, there.values())) / 1e3:.1f} ms in the base ({sum(map(len, there.values()))}); "
             f"{len(shared)} names in both, their added time {sum(added.values()):.2f} ms",
             "   added ms   here us   base us  here x  base x  kernel"]  # fmt: skip
    for name, a, b in sorted(shared, key=lambda t: -added[t[0]])[:top]:
        lines.append(f"  {added[name]:9.2f} {statistics.mean(a):9.1f} {statistics.mean(b):9.1f} {len(a):7d} {len(b):7d}"
                     f"  {name[:80]}")  # fmt: skip
    for label, mine, other in (("only here", here, there), ("only in the base", there, here)):
        alone = sorted(((n, d) for n, d in mine.items() if n not in other), key=lambda t: -sum(t[1]))[:top]
        lines.append(f"{label}: " + ("none" if not alone else ""))
        lines += [f"  {sum(d) / 1e3:8.2f} ms  {len(d):5d} x {statistics.mean(d):8.1f} us  {n[:90]}" for n, d in alone]
    return "\n".join(lines)


def _events(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", help="a Chrome trace JSON written by torch.profiler")
    parser.add_argument("--top", type=int, default=8, help="kernels / calls listed per stream / thread")
    parser.add_argument("--against", metavar="BASE", help="compare each kernel's time with this trace's instead")
    args = parser.parse_args()
    if args.against:
        print(compare(_events(args.trace), _events(args.against), args.top))
    else:
        print(summarize(_events(args.trace), args.top))


if __name__ == "__main__":
    main()
