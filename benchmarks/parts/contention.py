"""What does the pipeline worker contend for? The training step beside one kind of load at a time (issue 40, item 3).

Beside the pipeline worker the heavy model's step grows (7.80 → 9.63 ms on an H100, 4.01 → 5.51 ms for the light
model in bf16 on an H200) although the worker has only its MPS share of the SMs. The worker does three things at
once: kernels on its SMs (sampling), reads of host memory over PCIe by those SMs (the zero-copy gather), and traffic
to device memory (slots, the sampler's buffers). Here each is a separate load, run as an MPS client at the worker's
share in a process of its own, continuously, while a trainer process (an MPS client at the trainer's share) times the
heavy GraphSAGE's training step on one synthetic batch of the heavy shape already in GPU memory:

``none``   nothing beside the trainer (its own step time at its share)
``sm``     a bf16 matmul of 2048² tiles in a loop: tensor cores and L2-resident data, little DRAM or PCIe traffic
``hbm``    a copy between two 2 GiB device buffers in a loop: device-memory bandwidth, L2 evicted
``pcie``   the zero-copy gather (``ops.gather_rows``, rows in address order) of random 400-byte rows of a 4 GiB
           pinned host table: PCIe reads issued by SMs, as the worker's gather
``dma``    a 1 GiB pinned host → device copy in a loop: PCIe by the copy engines, no SMs
``pcie_seq``  the zero-copy gather of as many rows as ``pcie``, but consecutive ones: the same PCIe bytes by SMs over
           about a ninth of the host pages (400-byte rows), which separates the reads from their address translation
``staged`` the product's ``gather_mode: staged`` (:class:`lightning_zerocopy.gather.staged.StagedGather`): the same
           random rows, ids checked on the host, host threads (``--staged-threads``) into a pinned buffer, one
           copy-engine copy: the gather of the copy engines, paid in host cores and memory bandwidth instead
           (commit 78f2c47's ×1.060 ran an earlier form: the same copies without the id check)
``sample`` the GPU sampler (``ops.sample_neighbors``, the worker's sample stage) on a power-law graph in device memory
           (``benchmarks.parts.sampling``'s, 2M nodes, 12 edges a node), batches of the heavy model's 1024 seeds and
           fanouts [15, 10, 5]; its rate is batches/s, reported also as ms a batch
``sample_gather``  ``sample`` while a second host thread of the same process runs ``pcie`` on its own stream without
           pause, as the worker samples batch t+2 while it gathers t+1 on one MPS share; its rate is the sampler's

A load named ``<load>@<GB/s>`` (``pcie@10``) is held to that rate by pausing between its chunks, so that a load can be
compared with another at the bytes the worker really moves (the heavy row's ~13-20 GB/s), not only at its peak.

Reported per load: the step's p50 / mean ms (CUDA events), its slowdown against ``none``, and the load's own rate.
``--alone-s S`` also runs each load for S seconds with no trainer, at the worker's share and on the whole GPU (an MPS
client at 100 %): a load's rate alone at its share against its rate beside the step tells whether its kernels wait
behind the trainer's (issue 40, item 1: sampling beside training took 20× its time on the whole GPU), and the share
against the whole GPU how much of that is the share itself.
The load that slows the step most is what the worker's effect is made of; the one that does not is not worth
reducing. Measured on one H200 (2026-11-29, ``docs/gpu_checks/h200-2026-11-29/contention_dbe46e6``): the step alone
5.29 ms; beside ``sm`` ×1.045, ``hbm`` ×1.145 (933 GB/s), ``pcie`` ×1.262 (40.1 GB/s), ``dma`` ×1.028 (54.5 GB/s).
Needs a GPU and MPS (``nvidia-cuda-mps-control``)::

    python -m benchmarks.parts.contention --loads none,sm,hbm,pcie,dma --worker-percent 10 --steps 200
    python -m benchmarks.parts.contention --loads none,pcie@10,pcie@20,pcie_seq,staged@10,dma@20
    python -m benchmarks.parts.contention --loads none,sample,pcie,sample_gather --alone-s 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from benchmarks.common.heavy_batch import CLASSES, FANOUTS, FEATURES, HIDDEN, SEEDS, heavy_batch, heavy_train_step

LOADS = ("none", "sm", "hbm", "pcie", "dma", "pcie_seq", "staged", "sample", "sample_gather")
BYTE_LOADS = ("hbm", "pcie", "dma", "pcie_seq", "staged")  # the loads a rate (``@GB/s``) can hold


def train_steps(steps: int, warmup: int, precision: str, device: Any = "cuda") -> list[float]:
    """The heavy GraphSAGE's training step (forward, backward, Adam) on one batch, ``steps`` times after ``warmup``;
    each step's ms from CUDA events (wall time on the CPU)."""
    import torch
    from torch_geometric.nn.models import GraphSAGE

    device = torch.device(device)
    torch.manual_seed(0)
    model = GraphSAGE(FEATURES, HIDDEN, len(FANOUTS), CLASSES, dropout=0.5).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch = heavy_batch(0, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        heavy_train_step(model, opt, batch, autocast)
        if device.type == "cuda":
            end.record()
            end.synchronize()
            ms = begin.elapsed_time(end)
        else:
            ms = (time.perf_counter() - start) * 1e3
        if i >= warmup:
            times.append(ms)
    return times


def parse_load(name: str) -> tuple[str, Optional[float]]:
    """``"pcie@10"`` → ``("pcie", 10.0)``, ``"pcie"`` → ``("pcie", None)``; ``ValueError`` naming what is wrong."""
    kind, _, rate = name.partition("@")
    if kind not in LOADS:
        raise ValueError(f"unknown load {kind!r}: one of {', '.join(LOADS)}")
    if not rate:
        return kind, None
    if kind not in BYTE_LOADS:
        raise ValueError(f"load {name!r}: only {', '.join(BYTE_LOADS)} take a rate (@GB/s)")
    try:
        gbps = float(rate)
    except ValueError:
        gbps = 0.0
    if not gbps > 0:
        raise ValueError(f"load {name!r}: the rate after '@' must be a positive number of GB/s")
    return kind, gbps


def _sample_work(num_nodes: int = 2_000_000, avg_degree: float = 12.0) -> tuple[Any, str, float]:
    """The ``sample`` load's unit: one heavy-shaped batch of the GPU sampler, read back as the worker's sampler does."""
    import torch

    from benchmarks.parts.sampling import gpu_mode, power_law_graph

    graph = power_law_graph(num_nodes, avg_degree, alpha=0.6, seed=0)
    sample = gpu_mode(graph, list(FANOUTS), replace=False)
    draw = torch.Generator().manual_seed(1)
    seeds = [torch.randperm(num_nodes, generator=draw)[:SEEDS].cuda() for _ in range(16)]  # unique, as a batch's
    count = [0]

    def one_batch() -> None:
        sample(seeds[count[0] % len(seeds)], count[0])
        count[0] += 1

    return one_batch, "batches/s", 1.0


def _beside_a_gather(unit: Any) -> Any:
    """``unit``, with the ``pcie`` load running without pause on its own stream in a thread of this process (stopped
    and joined at exit)."""
    import atexit
    import threading

    import torch

    gather, _, _ = _load_work("pcie", staged_threads=0)
    stream, stop = torch.cuda.Stream(), threading.Event()

    def gather_forever() -> None:
        with torch.cuda.stream(stream):
            while not stop.is_set():
                gather()
                stream.synchronize()

    thread = threading.Thread(target=gather_forever, name="gather-load", daemon=True)
    thread.start()
    atexit.register(lambda: (stop.set(), thread.join()))
    return unit


def _load_work(kind: str, staged_threads: int, small: bool = False) -> tuple[Any, str, float]:
    """The unit of work of load ``kind``: (a callable that enqueues it, the rate's unit, the unit's amount). ``small``
    (a load held to a rate): units of ~1/8 the size, so that the pauses between them are shorter than a step."""
    import torch

    dev = torch.device("cuda")
    if kind == "sample":
        return _sample_work()
    if kind == "sample_gather":
        unit, rate, amount = _sample_work()
        return _beside_a_gather(unit), rate, amount
    if kind == "sm":
        a = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
        return (lambda: torch.mm(a, a)), "TFLOP/s", 2 * 2048**3 / 1e12
    if kind == "hbm":
        size = (1 << 28) if small else (2 << 30)
        src, dst = (torch.empty(size, dtype=torch.uint8, device=dev) for _ in range(2))
        return (lambda: dst.copy_(src)), "GB/s", 2 * size / 1e9  # read + write
    if kind == "dma":
        size = (1 << 27) if small else (1 << 30)
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(size, dtype=torch.uint8, device=dev)
        return (lambda: dst.copy_(host, non_blocking=True)), "GB/s", size / 1e9
    from lightning_zerocopy import ops

    row_floats, rows = 100, 50_000 if small else 400_000  # 400-byte rows, as the e2e graphs'
    table = torch.empty((4 << 30) // (4 * row_floats), row_floats, pin_memory=True)
    out = torch.empty(rows, row_floats, device=dev)
    nbytes = out.numel() * 4 / 1e9
    if kind == "pcie_seq":
        start = torch.randint(0, table.shape[0] - rows, ()).item()
        ids = torch.arange(start, start + rows, device=dev)
        return (lambda: ops.gather_rows(table, ids, out, sort_ids=True)), "GB/s", nbytes
    ids = torch.randint(0, table.shape[0], (rows,), device=dev)
    if kind == "pcie":
        return (lambda: ops.gather_rows(table, ids, out, sort_ids=True)), "GB/s", nbytes
    if kind == "staged":
        from lightning_zerocopy.gather.staged import StagedGather

        staged = StagedGather(table, threads=staged_threads)
        return (lambda: staged.gather(ids, out)), "GB/s", nbytes
    raise ValueError(f"unknown load {kind!r}: one of {', '.join(LOADS[1:])}")


def run_load(name: str, stop: Any, staged_threads: int = 8) -> dict[str, float]:
    """Run load ``name`` (``kind`` or ``kind@GB/s``) on the GPU until ``stop()``; its rate (GB/s, or TFLOP/s for
    ``sm``). A load with a rate enqueues one unit at a time and pauses while it is ahead of that rate."""
    import torch

    kind, cap = parse_load(name)
    work, unit, step = _load_work(kind, staged_threads, small=cap is not None)
    work()
    torch.cuda.synchronize()
    print("ready", flush=True)
    chunk = 1 if cap else 8
    count, start = 0, time.perf_counter()
    while not stop():
        for _ in range(chunk):
            work()
        torch.cuda.synchronize()
        count += chunk
        if cap:
            ahead = count * step / cap - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)
    return {"rate": count * step / (time.perf_counter() - start), "unit": unit}  # type: ignore[dict-item]


def summarize(times: Sequence[float], alone_p50: Optional[float]) -> dict[str, Optional[float]]:
    """p50 / mean / p90 ms of the steps and the p50's ratio to the step alone (None for the step alone)."""
    p50 = statistics.median(times)
    return {"p50_ms": round(p50, 3), "mean_ms": round(statistics.fmean(times), 3),
            "p90_ms": round(sorted(times)[int(0.9 * (len(times) - 1))], 3),
            "slowdown": None if alone_p50 is None else round(p50 / alone_p50, 3)}  # fmt: skip


def rate_text(rate: Optional[float], unit: str) -> str:
    """A load's rate for the table: ``"40.1 GB/s"``, a sampler's also as ms a batch; ``"–"`` for none."""
    if rate is None:
        return "–"
    per_batch = f" ({1e3 / rate:.2f} ms a batch)" if unit == "batches/s" and rate > 0 else ""
    return f"{rate} {unit}{per_batch}"


def _child(args: argparse.Namespace) -> None:
    if args.child == "trainer":
        print(json.dumps({"times": train_steps(args.steps, args.warmup, args.precision)}), flush=True)
        return
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    print(json.dumps(run_load(args.child, lambda: bool(stopping), args.staged_threads)), flush=True)


def _stop_load(proc: Optional[subprocess.Popen]) -> dict[str, Any]:
    """Stop a load process (SIGTERM) and read its rate: ``{"load_rate", "load_unit"}``, or ``{}``."""
    if proc is None:
        return {}
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    rates = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {"load_rate": round(rates[-1]["rate"], 1), "load_unit": rates[-1]["unit"]} if rates else {}


def _child_argv(args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "benchmarks.parts.contention", "--steps", str(args.steps), "--warmup",
            str(args.warmup), "--precision", args.precision, "--staged-threads", str(args.staged_threads)]  # fmt: skip


def _start_load(daemon: Any, load: str, args: argparse.Namespace, percent: int) -> subprocess.Popen:
    """A load process, an MPS client at ``percent``, returned once its first unit has run."""
    env = {**os.environ, **daemon.client_env(percent)}
    proc = subprocess.Popen(_child_argv(args) + ["--child", load], env=env, stdout=subprocess.PIPE, text=True)
    if proc.stdout is None or proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"load {load!r} did not start (exit {proc.wait()})")
    return proc


def _rates_alone(daemon: Any, load: str, args: argparse.Namespace) -> dict[str, Any]:
    """``load``'s rate with no trainer, ``args.alone_s`` seconds at the worker's share and as many at 100 %."""
    rates: dict[str, Any] = {}
    for key, percent in (("alone_rate", args.worker_percent), ("whole_gpu_rate", 100)):
        proc = _start_load(daemon, load, args, percent)
        time.sleep(args.alone_s)
        rates[key] = _stop_load(proc).get("load_rate")
    return rates


def _run_one(daemon: Any, load: str, args: argparse.Namespace) -> dict[str, Any]:
    """The trainer's steps beside ``load`` (started first, at the worker's share, stopped after); with
    ``--alone-s``, the load's rates alone before that."""
    me = _child_argv(args)
    alone = _rates_alone(daemon, load, args) if load != "none" and args.alone_s > 0 else {}
    load_proc = None if load == "none" else _start_load(daemon, load, args, args.worker_percent)
    try:
        env = {**os.environ, **daemon.client_env(args.trainer_percent)}
        done = subprocess.run(me + ["--child", "trainer"], env=env, capture_output=True, text=True, timeout=args.timeout)
    finally:
        rate = _stop_load(load_proc)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the trainer beside {load!r} failed:\n{done.stderr[-2000:]}")
    return {"load": load, "times": json.loads(lines[-1])["times"], **rate, **alone}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", default=",".join(LOADS[:5]),
                        help=f"comma-separated, of {', '.join(LOADS)}; <load>@<GB/s> holds {', '.join(BYTE_LOADS)} to a rate")
    parser.add_argument("--staged-threads", type=int, default=8, help="host threads of the staged load's gather")
    parser.add_argument("--worker-percent", type=int, default=10, help="the load's MPS share (the worker's)")
    parser.add_argument("--trainer-percent", type=int, default=None, help="the trainer's (default: 100 - the worker's)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--precision", choices=("bf16-mixed", "32-true"), default="bf16-mixed")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for one trainer process")
    parser.add_argument("--alone-s", type=float, default=0.0,
                        help="also run each load this long with no trainer, at the worker's share and at 100 %%")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    loads = [load.strip() for load in args.loads.split(",") if load.strip()]
    for load in loads:
        try:
            parse_load(load)
        except ValueError as err:
            parser.error(f"--loads: {err}")
    if args.staged_threads < 1:
        parser.error(f"--staged-threads must be >= 1, got {args.staged_threads}")
    if args.alone_s < 0:
        parser.error(f"--alone-s must be >= 0, got {args.alone_s}")
    if not 1 <= args.worker_percent <= 99:
        parser.error(f"--worker-percent must be in [1, 99], got {args.worker_percent}")
    args.trainer_percent = args.trainer_percent or 100 - args.worker_percent
    from lightning_zerocopy.pipeline import mps

    daemon = mps.start_mps()
    if daemon is None:
        print("no MPS daemon could be started (see the warning above)", file=sys.stderr)
        return 1
    rows = []
    try:
        for load in ["none"] + [load for load in loads if load != "none"]:
            rows.append(_run_one(daemon, load, args))
            rate = f", load {rows[-1]['load_rate']} {rows[-1]['load_unit']}" if "load_rate" in rows[-1] else ""
            print(f"{load}: step p50 {statistics.median(rows[-1]['times']):.3f} ms{rate}", flush=True)  # a cut run keeps it
    finally:
        daemon.stop()
    alone = statistics.median(rows[0]["times"])
    print(f"trainer {args.trainer_percent} %, loads at {args.worker_percent} %, {args.precision}, {args.steps} steps")
    print("| load | step p50 ms | mean ms | p90 ms | × alone | load's rate beside the step | load alone at its share "
          "| load alone, whole GPU |\n|---|---|---|---|---|---|---|---|")
    for row in rows:
        row.update(summarize(row.pop("times"), None if row["load"] == "none" else alone))
        unit = row.get("load_unit", "")
        rates = " | ".join(rate_text(row.get(key), unit) for key in ("load_rate", "alone_rate", "whole_gpu_rate"))
        slow = "–" if row["slowdown"] is None else f"{row['slowdown']:.3f}"
        print(f"| {row['load']} | {row['p50_ms']} | {row['mean_ms']} | {row['p90_ms']} | {slow} | {rates} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "child"}, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
