"""End-to-end training steps/s: no pipeline vs the pipeline's variants vs everything in GPU memory.

3-layer GraphSAGE (hidden 256), fanouts [15, 10, 5], batch 1024, fp32 features (``--dim`` wide, ``--gib`` GiB)
in shared host memory, a power-law graph with shuffled ids. The data path is the DataModule's own contract:
``BatchPlan`` + ``BatchBuilder`` (by default CPU sampler threads + CPU gather; ``--sampler-placement uva|gpu|hybrid|auto``
and ``--gather zerocopy`` select its GPU paths). Configurations, each in a fresh process
(so that each creates its CUDA context under the MPS setting it needs):

* ``none``         the plain loader: build the batch in the trainer, then ``Data.to(cuda, non_blocking)``
* ``in_process``   PipelineCallback's in-process mode: a producer thread builds into GPU slots on side streams
                   (samples batch t + 2 on a thread of its own while it gathers t + 1; the trainer trains t)
* ``in_process_green_X``  the same with the producer's kernels on green-context streams of X % of the SMs
* ``worker``       PipelineCallback's worker mode: a worker process, GPU slots shared over CUDA IPC, ping-pong
* ``worker_mps_X`` the same with a private MPS daemon, worker at X % of the SMs and the trainer at 100 - X
                   (the configuration's process is started through the MPS launcher, so both are clients)
* ``..._2stage``   any pipelined configuration without the lookahead (sample and gather of a batch in one call)
* ``gpu_resident`` the bound: graph and features in GPU memory, GPU sampler, ``x = features[n_id]`` on the GPU
* ``model_only``   the step alone: ``--prestaged`` batches built once and kept on the GPU, trained on in turn
                   (the step time the producer must keep pace with)
* ``breakdown``    not a training run: median ms of one batch's CPU sampling, CPU gather into pinned memory,
                   copy to the GPU, and the builder's whole ``build_batch`` (what bounds the producer)

Levers of issue 20 ("the data path keeps pace"): the worker's MPS share (``worker_mps_10,20,30``; the report then
prints the share :func:`~lightning_zerocopy.pipeline.share_choice.choose_share` picks from those rows' build times
and ``model_only``'s step), batches in flight (``--depth``), the GPU cache of hot rows (``--cache-gib``: the
highest-degree rows in GPU memory, what the Strategy's degree-ranked cache does on one GPU), the read order of the
zero-copy gather (``--gather-mode``), and the step itself (``--step fast``: bf16 autocast and each layer trimmed to
the hops it still needs, PyG's ``num_sampled_nodes_per_hop``; ``--sync-every 0``: no ``loss.item()`` per step).

Each reports steps/s over ``--steps`` steps after ``--warmup`` (host timer between two device syncs; a
``loss.item()`` per step, as Lightning's logging does) and the stall fraction: the share of wall time the
training loop spent waiting for its next batch (fetch + transfer). Results: JSON (``--out``) and a table.

Example (on the GPU machine)::

    python -m benchmarks.parts.pipeline --gib 8 --steps 300 --warmup 30 --out results/pipeline.json
    # the levers against a fast step, features in host memory, zero-copy gather:
    python -m benchmarks.parts.pipeline --gib 8 --sampler-placement gpu --gather zerocopy --step fast --sync-every 0 \
        --configs model_only,worker_mps_10,worker_mps_20,worker_mps_30 --depth 3 --cache-gib 1 --out results/levers.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks.common.results import write_json  # noqa: E402
from benchmarks.common.sessions import forward_stop_signals, stop_session, tracked  # noqa: E402
from benchmarks.parts.pipeline_data import fill_features, prepare  # noqa: E402

FANOUTS = [15, 10, 5]
DEFAULT_CONFIGS = "gpu_resident,none,in_process,in_process_green_10,worker,worker_mps_10,worker_mps_20,worker_mps_30"


# ---------------------------------------------------------------------------------------------- one configuration
def run_config(args: argparse.Namespace, config: str, handles_path: str) -> dict:
    """Train ``args.steps`` steps after ``args.warmup`` in this process; return steps/s and the stall fraction."""
    daemon = None
    name, lookahead = _parse(config)
    if name.startswith("worker_mps_"):
        from lightning_zerocopy.pipeline import mps

        # this process was started through the MPS launcher (see main), so it is a client with 100 - X % of the
        # SMs; here it only joins the daemon, whose variables the worker gets at spawn with its own X %
        daemon = mps.start_mps()
        if daemon is None:
            return {"config": config, "error": "MPS unavailable (see warnings)"}

    from torch_geometric.nn.models import GraphSAGE

    from lightning_zerocopy.data.batch import BatchBuilder
    from lightning_zerocopy.data.plan import BatchPlan
    from lightning_zerocopy.pipeline import start_pipeline
    from lightning_zerocopy.pipeline.source import PlanSource

    with open(handles_path, "rb") as f:
        handles = pickle.load(f)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")  # CPU: smoke runs only
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.set_device(device)
    hot_rows = int(args.cache_gib * 2**30) // (args.dim * 4) if args.cache_gib > 0 else 0
    builder = BatchBuilder(handles, FANOUTS, sampler_placement=args.sampler_placement, gather=args.gather,
                           gather_mode=args.gather_mode, hot_rows=hot_rows)  # fmt: skip
    plan = BatchPlan(handles.splits["train"].open(), args.batch_size, shuffle=True, seed=1)
    model = GraphSAGE(args.dim, args.hidden, num_layers=3, out_channels=args.classes).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    total = args.warmup + args.steps
    train_step = _train_step(args, model, opt, device)

    client = None
    if config == "breakdown":  # where a producer's batch time goes: sample, gather, copy to the GPU
        from lightning_zerocopy.sampling.neighbor_sampler import NeighborSampler

        sampler = NeighborSampler(handles.graph.open(), fanouts=FANOUTS)
        table = handles.features.open()
        pinned = table.pinned_buffer(int(builder.max_nodes(args.batch_size)))
        gpu = torch.empty_like(pinned, device=device)
        times: dict[str, list[float]] = {"sample_ms": [], "gather_ms": [], "h2d_ms": [], "build_batch_ms": []}
        nodes, edges = [], []
        builder.open()
        for step in range(args.warmup + 20):
            item = plan.item(0, step)
            t0 = time.perf_counter()
            s = sampler.sample(item.seed_ids, seed=item.batch_seed)
            t1 = time.perf_counter()
            n = s.n_id.numel()
            table.gather(s.n_id, out=pinned[:n])
            t2 = time.perf_counter()
            gpu[:n].copy_(pinned[:n], non_blocking=True)
            sync()
            t3 = time.perf_counter()
            builder.build_batch(item)
            t4 = time.perf_counter()
            if step >= args.warmup:
                for key, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                    times[key].append(1e3 * dt)
                nodes.append(n)
                edges.append(s.edge_index.size(1))
        import statistics

        out = {k: statistics.median(v) for k, v in times.items()}
        out.update(config=config, nodes_per_batch=statistics.mean(nodes), edges_per_batch=statistics.mean(edges),
                   feature_mb_per_batch=statistics.mean(nodes) * args.dim * 4 / 1e6,
                   threads=torch.get_num_threads())  # fmt: skip
        return out

    if config == "model_only":
        builder.open()
        staged = [builder.build_batch(plan.item(0, step)).to(device) for step in range(args.prestaged)]

        def batches():
            for step in range(total):
                yield staged[step % len(staged)]

    elif config == "none":
        builder.open()

        def batches():
            for step in range(total):
                yield builder.build_batch(plan.item(0, step)).to(device, non_blocking=True)

    elif config == "gpu_resident":
        from lightning_zerocopy.sampling.neighbor_sampler import NeighborSampler

        builder.open()
        graph = handles.graph.open()
        sampler = NeighborSampler(graph, fanouts=FANOUTS, placement="gpu", device=device)
        features = handles.features.open().data.to(device)
        labels = handles.labels.open().to(device)

        def batches():
            from torch_geometric.data import Data

            for step in range(total):
                item = plan.item(0, step)
                s = sampler.sample(item.seed_ids.to(device, non_blocking=True), seed=item.batch_seed)
                yield Data(x=features[s.n_id], y=labels[s.n_id], edge_index=s.edge_index, n_id=s.n_id,
                           batch_size=s.batch_size)  # fmt: skip

    else:
        mode = "in_process" if name.startswith("in_process") else "worker"
        env = daemon.client_env(_percent(name)) if daemon is not None else None
        green = _percent(name) if name.startswith("in_process_green_") else None
        if green is not None:
            import warnings

            from lightning_zerocopy.pipeline.sm_share import SMShareWarning

            warnings.simplefilter("error", SMShareWarning)  # no share: report it, do not measure a plain run
        client = start_pipeline(mode, depth=args.depth, device=device, worker_env=env, timeout=300,
                                lookahead=lookahead, green_context_percent=green)  # fmt: skip
        client.register("train", PlanSource(plan, builder))

        def batches():
            yield from client.iterate("train", 0, 0, total)

    wait_s = 0.0
    t_start = None
    it = batches()
    for step in range(total):
        if step == args.warmup:
            sync()
            t_start = time.perf_counter()
            wait_s = 0.0
        t0 = time.perf_counter()
        batch = next(it)
        wait_s += time.perf_counter() - t0
        loss = train_step(batch)
        if args.sync_every and step % args.sync_every == 0:
            loss.item()  # what per-step logging of a Python float costs (a host-device sync)
    sync()
    elapsed = time.perf_counter() - t_start
    it.close()
    result = {
        "config": config,
        "steps_per_s": args.steps / elapsed,
        "step_ms": 1e3 * elapsed / args.steps,
        "stall_frac": wait_s / elapsed,
        "seconds": elapsed,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "depth": args.depth,
        "cache_rows": hot_rows,
        "gather_mode": args.gather_mode,
        "step": args.step,
    }
    if client is not None:
        stats = client.stats
        result["producer_build_ms"] = 1e3 * stats.build_s / max(1, stats.batches)
        result["slot_gib"] = stats.slot_bytes / 2**30
        result["lookahead"] = lookahead
        share = getattr(client.transport, "sm_share", None)
        if share is not None:
            result["sm_share"] = repr(share)
        client.close()
    return result


def _train_step(args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer, device: torch.device):
    """One training step on a batch (returns the loss, unsynchronized): PyG's GraphSAGE as is (``--step pyg``), or
    under bf16 autocast with each layer trimmed to the hops it still needs (``--step fast``)."""
    import torch.nn.functional as F

    fast = args.step == "fast"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=fast and device.type == "cuda")

    def step(batch):
        bs = batch.batch_size
        trim = {}
        if fast:
            trim = dict(num_sampled_nodes_per_hop=list(batch.num_sampled_nodes),
                        num_sampled_edges_per_hop=list(batch.num_sampled_edges))  # fmt: skip
        with autocast:
            out = model(batch.x, batch.edge_index, **trim)[:bs]
            loss = F.cross_entropy(out.float(), batch.y[:bs])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def _parse(config: str) -> tuple[str, bool]:
    """A configuration's base name and whether its producer samples one batch ahead (not ``..._2stage``)."""
    if config.endswith("_2stage"):
        return config[: -len("_2stage")], False
    return config, True


def _percent(name: str) -> int:
    """The SM share at the end of a configuration's base name (``worker_mps_10`` -> 10)."""
    return int(name.rsplit("_", 1)[1])


# ---------------------------------------------------------------------------------------------- orchestration
def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=8.0, help="feature table size (GiB of fp32)")
    p.add_argument("--dim", type=int, default=128, help="feature width")
    p.add_argument("--avg-degree", type=float, default=10.0)
    p.add_argument("--alpha", type=float, default=0.6, help="power-law exponent of edge sources (< 1)")
    p.add_argument("--classes", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--depth", type=int, default=2, help="pipeline slots (2 = ping-pong)")
    p.add_argument("--sampler-placement", choices=("cpu", "uva", "gpu", "hybrid", "auto"), default="cpu",
                   help="the DataModule builder's sampler (BatchBuilder(sampler_placement=...))")
    p.add_argument("--gather", choices=("cpu", "zerocopy"), default="cpu",
                   help="the DataModule builder's feature gather (BatchBuilder(gather=...))")  # fmt: skip
    p.add_argument("--gather-mode", choices=("auto", "direct", "sorted"), default="auto",
                   help="read order of the zero-copy gather (auto: time both on the first batches)")
    p.add_argument("--cache-gib", type=float, default=0.0,
                   help="GiB of the highest-degree feature rows kept in GPU memory (zero-copy gather only)")
    p.add_argument("--step", choices=("pyg", "fast"), default="pyg",
                   help="fast: bf16 autocast and per-hop trimmed layers (issue 20's fast step)")
    p.add_argument("--sync-every", type=int, default=1, help="loss.item() every N steps (0: never in the loop)")
    p.add_argument("--prestaged", type=int, default=16, help="batches model_only keeps on the GPU")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--configs", default=DEFAULT_CONFIGS)
    p.add_argument("--out", default=None, help="JSON file for the results")
    p.add_argument("--config-timeout", type=float, default=300.0)
    p.add_argument("--_prepare", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_run", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_fill", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_handles", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _child(args_list: list[str], timeout: float, prefix: Optional[list[str]] = None) -> dict:
    """Run one configuration in a session of its own: on ``timeout`` the whole session is stopped (the MPS
    launcher, the configuration's process and its pipeline worker), not only the process started here."""
    proc = subprocess.Popen([*(prefix or []), sys.executable, os.path.abspath(__file__), *args_list],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    with tracked(proc):
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_session(proc)
            for pipe in (proc.stdout, proc.stderr):
                pipe.close()
            raise
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"error": f"exit {proc.returncode}: {stderr.strip()[-1500:]}"}


def _share_choice(runs: list[dict]):
    """What ``choose_share`` picks from this run's ``worker_mps_X`` build times and ``model_only`` step time."""
    from lightning_zerocopy.pipeline.share_choice import choose_share

    step = next((r["step_ms"] for r in runs if r["config"] == "model_only" and "step_ms" in r), None)
    build = {_percent(_parse(r["config"])[0]): r["producer_build_ms"] for r in runs
             if _parse(r["config"])[0].startswith("worker_mps_") and "producer_build_ms" in r}  # fmt: skip
    if step is None or not build:
        return None
    return choose_share(build, step)


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    if args._fill:
        fill_features(args._fill)
        return {}
    if args._prepare:  # owns the shared segments: stays until the orchestrator closes our stdin, then unlinks
        info = prepare(args, args._prepare, os.path.abspath(__file__))
        for sig in (signal.SIGTERM, signal.SIGINT):  # a `timeout` around the benchmark signals this process too:
            signal.signal(sig, signal.SIG_IGN)  # it stays until the orchestrator's exit closes our stdin, then unlinks
        print(json.dumps(info), flush=True)
        sys.stdin.read()
        with open(args._prepare, "rb") as f:
            pickle.load(f).unlink()
        return {}
    if args._run:
        print(json.dumps(run_config(args, args._run, args._handles)), flush=True)
        return {}

    passthrough = [f"--gib={args.gib}", f"--dim={args.dim}", f"--avg-degree={args.avg_degree}", f"--alpha={args.alpha}",
                   f"--classes={args.classes}", f"--hidden={args.hidden}", f"--batch-size={args.batch_size}",
                   f"--depth={args.depth}", f"--steps={args.steps}", f"--warmup={args.warmup}",
                   f"--sampler-placement={args.sampler_placement}", f"--gather={args.gather}",
                   f"--gather-mode={args.gather_mode}", f"--cache-gib={args.cache_gib}", f"--step={args.step}",
                   f"--sync-every={args.sync_every}", f"--prestaged={args.prestaged}"]  # fmt: skip
    forward_stop_signals()  # the running configuration's session is stopped, then main's cleanup runs
    fd, handles_path = tempfile.mkstemp(prefix="lzc-bench-handles-")
    os.close(fd)
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if not k.startswith("_")}}
    owner = subprocess.Popen([sys.executable, os.path.abspath(__file__), *passthrough, f"--_prepare={handles_path}"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = owner.stdout.readline()
        if not line.startswith("{"):
            results["data"] = {"error": f"data preparation failed (exit {owner.wait()})"}
            print(results["data"], flush=True)
            return results
        data = results["data"] = json.loads(line)
        print("data:", json.dumps(data), flush=True)
        runs = results["runs"] = []  # in the JSON also when a signal ends the sweep early
        for config in [c.strip() for c in args.configs.split(",") if c.strip()]:
            try:
                prefix = None
                if _parse(config)[0].startswith("worker_mps_"):  # the trainer must be an MPS client: use the launcher
                    from lightning_zerocopy.pipeline import mps

                    deadline = time.monotonic() + 60  # the previous configuration's daemon may still be quitting
                    while mps.mps_processes() and time.monotonic() < deadline:
                        time.sleep(0.2)
                    mps_py = os.path.join(REPO_ROOT, "lightning_zerocopy", "pipeline", "mps.py")
                    prefix = [sys.executable, mps_py, "--worker-sm-percent", str(_percent(_parse(config)[0])), "--"]
                r = _child([*passthrough, f"--_run={config}", f"--_handles={handles_path}"], args.config_timeout, prefix)
            except subprocess.TimeoutExpired:
                r = {"error": f"timed out after {args.config_timeout:.0f} s"}
            r.setdefault("config", config)
            runs.append(r)
            print(json.dumps(r), flush=True)
        results["runs"] = runs
        bound = next((r.get("steps_per_s") for r in runs if r["config"] == "gpu_resident" and "steps_per_s" in r), None)
        print(f"\n{'config':<22}{'steps/s':>10}{'stall':>8}{'vs GPU-resident':>18}")
        for r in runs:
            if r["config"] == "breakdown" and "error" not in r:
                print(f"{'breakdown':<22}" + ", ".join(f"{k}={v:.1f}" for k, v in r.items() if isinstance(v, float)))
            elif "steps_per_s" in r:
                ratio = f"{r['steps_per_s'] / bound:.2f}x" if bound else "-"
                print(f"{r['config']:<22}{r['steps_per_s']:>10.2f}{r['stall_frac']:>8.1%}{ratio:>18}")
            else:
                print(f"{r['config']:<22}  error: {r['error'][:200]}")
        choice = _share_choice(runs)
        if choice is not None:
            results["share_choice"] = {"percent": choice.percent, "build_ms": choice.build_ms,
                                       "step_ms": choice.step_ms, "keeps_pace": choice.keeps_pace}  # fmt: skip
            print(f"\nauto: {choice.summary()}")
    finally:
        owner.stdin.close()  # the owner unlinks the segments and exits
        try:
            owner.wait(timeout=60)
        except subprocess.TimeoutExpired:
            owner.kill()
        os.unlink(handles_path)
        if args.out:
            write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
