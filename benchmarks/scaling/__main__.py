"""Multi-GPU scaling of ZeroCopyDDPStrategy: GPUs x cache policy x cache budget, features in host memory.

For every combination of ``--gpus`` (rank counts), ``--policies`` (``replicate``, ``clique``, ``auto``),
``--budgets`` (share of the feature rows one GPU's budget holds, e.g. 0.1 and 0.3; ``0`` = no cache) and
``--pipelines`` (``worker``: the pipeline worker under MPS on every rank, as ``recipes/multi_gpu.yaml`` runs;
``off``: batches built in the trainer), one Lightning ``fit`` runs in a fresh process (Lightning's DDP launcher
starts the other ranks): ``--model heavy`` (3-layer GraphSAGE hidden 256, fanouts [15, 10, 5]) or ``light``
(2-layer, hidden 128, [10, 5]), trimmed per hop, batch 1024 per rank,
``SyntheticGraph`` features in shared pinned host memory, GPU sampler, zero-copy gather through the strategy's
cache, ``--precision`` as the recipe. Every rank runs ``--limit-batches`` steps per epoch, so more GPUs do more work
in an epoch: scaling is measured as throughput. Reported per run (steady state: the first epoch is dropped):

* seeds per second over all ranks (ranks x batch size x steps / epoch time) and the speed-up, the ratio of that
  to the 1-GPU run with the same policy, budget and pipeline; each rank's steps per second; the stall share;
* per rank: the cache's hit rate, rows from the local shard / peers' shards / host memory, host-read GB/s
  (``DataTelemetry``'s ``cache/*`` figures of the last epoch), the policy the strategy chose and why;
* per rank the PSS and RSS of its mappings of the shared host copy (graph, features, labels), and their sum over
  the ranks against the copy's size (``host_pss_over_data``: about 1 when the machine holds one copy for all);

plus ``nvidia-smi topo -m``, the GPU names and, before each run, the share of the host's CPUs at full speed
(``benchmarks.common.cpu_speed``), all in the JSON (``--out``) and a table. ``--repeats N`` runs the sweep in N blocks
of alternating order and takes each speed-up against its own block's 1-GPU run, then the medians (``repeats.py``).

``--graph hetero`` runs the same sweep on the MAG-shaped ``SyntheticHeteroGraph`` of ``benchmarks.end_to_end.hetero``'s
``--preset`` (default ``mag``: ogbn-mag's counts; drawn and cached once before the runs), its ``HeteroNodeClassifier``
(the preset's fanouts for every edge type, its width) and batch size: ours through ``ZeroCopyHeteroDataModule`` (GPU
sampler, zero-copy gather) under ``ZeroCopyDDPStrategy``, whose cache then covers every featured type's rows under one
budget (``--budgets``: a share of the featured types' table bytes), PyG's through its hetero ``NeighborLoader`` under
Lightning's DDP. It adds per featured type and rank the hit rate and local / peer / host rows of the last epoch
(where the trainer gathers; a pipeline worker's are in its totals only). ``--warmup-batches`` and ``--run-budget-s``
bound every run's time (the measured epochs' steps are cut to fit, the same on every rank).

``python -m benchmarks.scaling.diag`` (``diag.py``) runs these fits in phases (data path, then model-only on batches
staged on each GPU) with per-step timelines, host CPU figures and NCCL's transports per rank, for issue 39's question:
why a rank slows when a second GPU joins.

Example::

    python -m benchmarks.scaling --gpus 1,2 --policies replicate,clique --budgets 0.1 --out results/scaling.json
    python -m benchmarks.scaling --gpus 1,2,4,8 --policies replicate,clique,auto --pipelines worker,off
    python -m benchmarks.scaling --device cpu --gpus 1,2 --num-nodes 20000 --epochs 2 --limit-batches 3 \
        --pipelines off --out /tmp/scaling_cpu.json   # plumbing check on a CPU machine (gloo ranks, CPU paths)
    python -m benchmarks.scaling --graph hetero --gpus 1,2 --policies replicate,clique --budgets 0.1 \
        --pipelines worker --epochs 2 --warmup-batches 30 --limit-batches 400 --run-budget-s 12 --timeout 90 \
        --presample-batches 16 --pyg-gpus 2 --pyg-site /tmp/pygsite --out results/hetero_scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import pytorch_lightning as pl  # noqa: E402  (imports no CUDA: the parent process stays without a context)
import torch  # noqa: E402

from benchmarks.common import cpu_speed  # noqa: E402
from benchmarks.common.cli import add_gemm_rows_argument, gemm_rows_callbacks  # noqa: E402
from benchmarks.common.results import write_json  # noqa: E402
from benchmarks.common.sessions import forward_stop_signals, restore_signals, stop_session, tracked  # noqa: E402
from benchmarks.end_to_end.hetero.__main__ import PRESETS as HETERO_PRESETS  # noqa: E402
from benchmarks.scaling.budget import EpochTimer, RunBudget  # noqa: E402
from benchmarks.scaling.diag_run import DiagRun, phase_figures  # noqa: E402
from benchmarks.scaling.knobs import apply_process_knobs, ddp_kwargs  # noqa: E402
from benchmarks.scaling.nccl_log import nccl_debug_env, read_nccl_logs  # noqa: E402
from benchmarks.scaling.repeats import planned_runs, sweep_order  # noqa: E402
from benchmarks.scaling.report import _mean, report as _report, throughput as _throughput, topology  # noqa: E402,F401

#: the two models of the end-to-end benchmark: (fanouts, hidden channels, layers)
MODELS = {"heavy": ([15, 10, 5], 256, 3), "light": ([10, 5], 128, 2)}


def run_one(args: argparse.Namespace, config: dict[str, Any]) -> None:
    """One fit (this process is Lightning's rank 0; the launcher re-runs the script for the other ranks), or, with
    ``config["independent"]``, one single-GPU fit per GPU at once (:func:`~benchmarks.scaling.pair.run_pair`)."""
    cuda = args.device == "cuda"
    knobs = config.get("knobs") or {}
    apply_process_knobs(knobs)  # NCCL variables and thread counts, before the launcher starts the other ranks
    share = int((knobs.get("run") or {}).get("worker_sm_percent", args.worker_sm_percent))
    pyg = config["loader"] == "pyg"
    worker = config["pipeline"] == "worker" and cuda and not pyg
    mps = cuda and not pyg and bool((knobs.get("run") or {}).get("mps", config.get("mps", worker)))
    if config.get("nccl_debug"):
        os.environ.update(nccl_debug_env(config["out_dir"]))
    if config.get("independent"):
        from benchmarks.scaling.pair import run_pair

        run_pair(args, config, os.path.abspath(__file__), cuda, mps, share)
        return
    if pyg and args.pyg_site:
        sys.path.insert(0, os.path.abspath(args.pyg_site))
    if mps:  # before anything initializes CUDA (PyG does): the ranks are MPS clients, as the recipe's are
        from lightning_zerocopy.pipeline.mps_launcher import start_for_trainer

        start_for_trainer(share)

    from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
    from lightning_zerocopy.graph import mapped_footprint
    from lightning_zerocopy.strategies import ZeroCopyDDPStrategy

    class HostFootprint(pl.Callback):
        """PSS and RSS of this rank's mappings of the shared host copy (graph, features, labels), at the end."""

        def __init__(self) -> None:
            self.paths: list[str] = []
            self.data_bytes = 0
            self.footprint: Optional[tuple[int, int]] = None

        def setup(self, trainer, pl_module, stage) -> None:  # after the DataModule's setup: the segments exist
            if pyg:
                return  # PyG's graph is not in our shared segments
            self.paths, self.data_bytes = segments(trainer.datamodule.handles)

        def on_train_end(self, trainer, pl_module) -> None:
            if self.paths:
                self.footprint = mapped_footprint(self.paths)

    sampler_threads = (knobs.get("datamodule") or {}).get("sampler_threads")
    if args.graph == "hetero":
        from benchmarks.scaling.hetero import TypeCacheCounts, hetero_parts, segment_paths

        parts = hetero_parts(args, config, cuda)
        dm, model, budget, batch_size = parts.datamodule, parts.model, parts.budget_bytes, parts.batch_size
        segments = segment_paths
        type_counts: Optional[Any] = TypeCacheCounts()
    else:
        dm, model, budget, batch_size, segments = _homogeneous_parts(args, config, cuda, sampler_threads)
        type_counts = None
    if pyg:  # PyG's NeighborLoader as its users run it under DDP: Lightning's DDP, a share of the seeds per rank
        from pytorch_lightning.strategies import DDPStrategy

        strategy: Any = DDPStrategy()
    else:
        strategy = ZeroCopyDDPStrategy(cache_budget=budget, cache_ranking=args.ranking, cache_policy=config["policy"],
                                       presample_batches=args.presample_batches, **ddp_kwargs(knobs))  # fmt: skip
    pipeline = PipelineCallback(mode="worker", depth=2, mps=True, worker_sm_percent=share) if worker else None
    diag = DiagRun(config, cuda, pipeline) if config.get("phases") else None
    epochs = diag.epochs if diag is not None else args.epochs
    timer, telemetry, host = EpochTimer(cuda), DataTelemetry(prog_bar=False), HostFootprint()
    budgeted = RunBudget(args.warmup_batches, args.run_budget_s, epochs, cuda)
    callbacks: list[Any] = [*(diag.first_callbacks() if diag else []), timer, *(diag.after_clock() if diag else []),
                            telemetry, host, budgeted]  # fmt: skip
    if type_counts is not None:
        callbacks.append(type_counts)
    if pipeline is not None:
        callbacks.append(pipeline)
    callbacks += gemm_rows_callbacks((knobs.get("run") or {}).get("gemm_rows", args.gemm_rows))
    callbacks += diag.last_callbacks() if diag else []
    trainer = pl.Trainer(accelerator="gpu" if cuda else "cpu", devices=config["gpus"], strategy=strategy, max_epochs=epochs,
                         limit_train_batches=args.limit_batches or None, limit_val_batches=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         precision=args.precision if cuda else "32-true", use_distributed_sampler=not pyg,
                         callbacks=callbacks)  # fmt: skip
    broadcast = pyg or bool((knobs.get("run") or {}).get("step_sigterm_broadcast", False))  # PyG's: as Lightning
    if not broadcast:  # ours as the lightning-zerocopy command runs it (preemption.py)
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None
    trainer.fit(model, datamodule=dm)
    decision = getattr(strategy, "cache_decision", None)
    rows = None if decision is None else decision.rows_per_type  # homogeneous: the one type's total, as reports had
    report = {
        "rank": trainer.global_rank,
        "slot": config.get("slot"),
        "epoch_s": timer.seconds,
        "epoch_steps": timer.steps,
        "batch_size": batch_size,
        "cache": telemetry.cache_history[-1] if telemetry.cache_history else None,
        "cache_per_type": None if type_counts is None else type_counts.last,
        "policy": None if decision is None else decision.layout.policy,
        "note": None if decision is None else decision.layout.note,
        "cached_rows": rows if rows is None or args.graph == "hetero" else sum(rows.values()),
        "expected_hit_rate": None if decision is None else decision.expected_hit_rate,
        "steps_per_epoch": trainer.num_training_batches,
        "stall_frac": _mean([h.get("data/stall_frac") for h in telemetry.history[len(telemetry.history) // 2 :]]),
        "host_data_bytes": host.data_bytes,
        "host_pss_bytes": None if host.footprint is None else host.footprint[0],
        "host_rss_bytes": None if host.footprint is None else host.footprint[1],
        "step_sigterm_broadcast": broadcast,
    }
    if diag is not None:
        report["diag"] = diag.report(sampler_threads)
    slot = config.get("slot")
    write_json(os.path.join(config["out_dir"], f"rank{trainer.global_rank if slot is None else slot}.json"), report)


def _homogeneous_parts(args: argparse.Namespace, config: dict[str, Any], cuda: bool,
                       sampler_threads: Optional[int] = None) -> tuple[Any, Any, int, int, Any]:  # fmt: skip
    """The DataModule, model, cache budget (bytes per GPU), batch size and host-segment reader of a run on the
    ``SyntheticGraph`` of ``--num-nodes``: ours through ``ZeroCopyDataModule`` (``sampler_threads``: its
    ``num_threads``; ``config["check_features"]``: its feature scan at set-up, on unless false), or PyG's
    ``NeighborLoader``."""
    from lightning_zerocopy import ZeroCopyDataModule
    from lightning_zerocopy.datasets import SyntheticGraph
    from lightning_zerocopy.models import GraphSAGE

    fanouts, hidden, layers = MODELS[args.model]
    batch_size = args.batch_size or 1024
    dataset = SyntheticGraph(**synthetic_kwargs(args))
    row_bytes = args.features * 4
    budget = _budget_bytes(config, args.num_nodes, row_bytes)
    if config["loader"] == "pyg":
        import functools

        from benchmarks.end_to_end.pyg_hops import add_hop_counts
        from benchmarks.scaling.pyg_ddp import pyg_ddp_datamodule

        data = dataset.load()

        def graph() -> Any:
            from torch_geometric.data import Data

            return Data(x=data.x, edge_index=data.edge_index, y=data.y, num_nodes=data.num_nodes)

        dm: Any = pyg_ddp_datamodule(graph, data.train_idx, args, fanouts, batch_size,
                                     transform_sampler_output=functools.partial(add_hop_counts, num_hops=len(fanouts)),
                                     num_features=data.num_features, num_classes=dataset.num_classes)  # fmt: skip
    else:
        dm = ZeroCopyDataModule(dataset, fanouts=fanouts, batch_size=batch_size,
                                sampler_placement="gpu" if cuda else "cpu", gather="zerocopy" if cuda else "cpu",
                                drop_last=True, seed=args.seed, num_threads=sampler_threads,
                                check_features=bool(config.get("check_features", True)))  # fmt: skip
    compiled = bool(((config.get("knobs") or {}).get("run") or {}).get("compile"))  # the diagnostic's knob
    model = GraphSAGE(dm.num_features, dm.num_classes, hidden_channels=hidden, num_layers=layers, dropout=0.5,
                      compile=compiled)  # fmt: skip

    def segments(handles: Any) -> tuple[list[str], int]:
        parts = [handles.graph.indptr, handles.graph.indices, handles.features.data, handles.labels]
        return [p.path for p in parts], sum(p.nbytes for p in parts)

    return dm, model, budget, batch_size, segments


def synthetic_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``SyntheticGraph`` of a homogeneous run (``--num-nodes``, ``--avg-degree``, ``--features``, 32 classes,
    drawn on ``--device``, cached under ``--cache-dir``)."""
    return {"num_nodes": args.num_nodes, "avg_degree": args.avg_degree, "num_features": args.features,
            "num_classes": 32, "cache_dir": args.cache_dir, "device": args.device}  # fmt: skip


def _budget_bytes(config: dict[str, Any], num_nodes: int, row_bytes: int) -> int:
    """A GPU's ``cache_budget`` for ``config["budget"]`` of the rows: their bytes and the row lookup every GPU builds
    beside them (charged to the budget first; a clique's, over the run's GPUs, bounds replicate's), so the share is
    the rows cached. ``0`` without a share."""
    from lightning_zerocopy.cache.plan import lookup_bytes

    rows = int(config["budget"] * num_nodes)
    shards = 1 if config["policy"] == "replicate" else max(int(config["gpus"]), 1)
    return rows * row_bytes + lookup_bytes(num_nodes, shards) if rows else 0


def launch(args: argparse.Namespace, gpus: int, policy: str, budget: float, pipeline: str,
           loader: str = "ours", extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:  # fmt: skip
    """One run in a session of its own (stopped whole after ``args.timeout``); its figures, or ``error`` with the
    output's tail. ``extra``: more of the run's configuration (``benchmarks.scaling.diag``'s ``phases``, ``knobs``,
    ``mps``, ``independent``, ...); with ``phases`` the figures are per phase (``phases``) and per rank
    (``per_rank_diag``)."""
    out_dir = tempfile.mkdtemp(prefix="lzc-scaling-")
    config = {"gpus": gpus, "policy": policy, "budget": budget, "pipeline": pipeline, "loader": loader,
              **(extra or {}), "out_dir": out_dir}  # fmt: skip
    cmd = [sys.executable, os.path.abspath(__file__), *args.argv, "--child", json.dumps(config)]
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE"):
        env.pop(key, None)
    host_cpus = cpu_speed.summarise(cpu_speed.probe())  # the machine this run meets (benchmarks.common.cpu_speed)
    started = time.perf_counter()
    # A session of its own, so that a timeout stops the run with the ranks Lightning's launcher started from it
    # (killing only this child would leave them holding the GPUs); a signal to this process stops it too.
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    timed_out = False
    with tracked(proc):
        try:
            stdout, stderr = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_session(proc)
            try:
                stdout, stderr = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a descendant outside the session still holds the pipes
                stdout, stderr = "", ""
        except BaseException:  # a stop signal (benchmarks.common.sessions): nothing of this run to keep
            shutil.rmtree(out_dir, ignore_errors=True)
            raise
    result: dict[str, Any] = {"gpus": gpus, "policy": policy, "budget_fraction": budget, "pipeline": pipeline,
                              "loader": loader, "returncode": proc.returncode, "wall_s": time.perf_counter() - started,
                              "host_cpus": host_cpus}  # fmt: skip
    warned = dict.fromkeys(line.strip()[-400:] for line in (stderr or "").splitlines() if "Warning" in line)
    result["warnings"] = list(warned)[:20]
    try:
        if config.get("nccl_debug"):
            result["nccl"] = read_nccl_logs(out_dir)
        ranks = [json.load(open(os.path.join(out_dir, f"rank{r}.json"), encoding="utf-8")) for r in range(gpus)]
    except OSError:
        note = f"timed out after {args.timeout:.0f} s (--timeout)\n" if timed_out else ""
        result["error"] = note + ((stdout or "")[-3000:] + (stderr or "")[-5000:]).strip()
        return result
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    if config.get("phases"):
        result.update(phase_figures(ranks, config["phases"]))
        result["per_rank_diag"] = [r.get("diag") for r in ranks]
    else:
        result.update(_throughput(ranks[0], gpus))
    result.update(
        stall_frac=[r.get("stall_frac") for r in ranks],
        chosen_policy=ranks[0]["policy"],
        note=ranks[0]["note"],
        cached_rows=ranks[0]["cached_rows"],
        expected_hit_rate=ranks[0]["expected_hit_rate"],
        step_sigterm_broadcast=ranks[0].get("step_sigterm_broadcast"),
        per_rank=[{"rank": r["rank"], **(r["cache"] or {}), "host_pss_bytes": r.get("host_pss_bytes"),
                   "host_rss_bytes": r.get("host_rss_bytes")} for r in ranks],  # fmt: skip
    )
    if any(r.get("cache_per_type") for r in ranks):  # a cache over typed rows: each featured type's epoch figures
        result["cache_per_type"] = [r.get("cache_per_type") for r in ranks]
    # One host copy per machine: the ranks' PSS of it adds up to about one copy (RSS counts it in every rank).
    pss = [r.get("host_pss_bytes") for r in ranks]
    data = ranks[0].get("host_data_bytes") or 0
    if data and all(p is not None for p in pss):
        result.update(host_data_GB=data / 1e9, host_pss_total_GB=sum(pss) / 1e9, host_pss_over_data=sum(pss) / data)
    return result


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", default="1", help="comma-separated rank counts, e.g. 1,2,4,8")
    parser.add_argument("--policies", default="replicate,clique,auto")
    parser.add_argument("--budgets", default="0.1,0.3", help="share of the rows one GPU's budget holds (0 = none)")
    parser.add_argument("--pipelines", default="worker", help="comma-separated of worker (the worker under MPS on "
                        "every rank, as recipes/multi_gpu.yaml) and off (batches built in the trainer)")
    parser.add_argument("--worker-sm-percent", type=int, default=10, help="the pipeline worker's MPS share")
    parser.add_argument("--pyg-gpus", default="", help="comma-separated rank counts to run PyG's NeighborLoader under "
                        "Lightning's DDP on, as the baseline (needs pyg-lib or torch-sparse: --pyg-site)")
    parser.add_argument("--pyg-workers", type=int, default=8, help="NeighborLoader worker processes per rank")
    parser.add_argument("--pyg-site", default=None, help="a folder with torch-sparse/pyg-lib, put first on the path")
    parser.add_argument("--precision", default="bf16-mixed", help="the trainer's precision on a GPU (the recipe's)")
    parser.add_argument("--model", default="heavy", choices=sorted(MODELS),
                        help="heavy: 3-layer SAGE h256 [15, 10, 5]; light: 2-layer SAGE h128 [10, 5]")
    parser.add_argument("--ranking", default="presample", choices=("degree", "presample"))
    add_gemm_rows_argument(parser, default=64)  # recipes/multi_gpu.yaml's
    parser.add_argument("--presample-batches", type=int, default=64)
    parser.add_argument("--num-nodes", type=int, default=16_000_000)
    parser.add_argument("--avg-degree", type=int, default=16)
    parser.add_argument("--features", type=int, default=128, help="fp32 features per node (128 -> 512-byte rows)")
    parser.add_argument("--batch-size", type=int, default=None, help="seeds per batch per rank (default: 1024; "
                        "--graph hetero: the preset's)")
    parser.add_argument("--epochs", type=int, default=3, help="the first is dropped (warm-up)")
    parser.add_argument("--limit-batches", type=int, default=0, help="batches per epoch (0 = the whole split)")
    parser.add_argument("--warmup-batches", type=int, default=0, help="batches of the first epoch, the dropped "
                        "warm-up (0 = as many as the others)")
    parser.add_argument("--run-budget-s", type=float, default=0.0, help="seconds the epochs after the warm-up may take "
                        "together in a run: their steps are cut to fit at the warm-up's step time, the same on every "
                        "rank (0 = no cap; --timeout still kills a run)")
    parser.add_argument("--graph", default="homogeneous", choices=("homogeneous", "hetero"),
                        help="hetero: the MAG-shaped SyntheticHeteroGraph of benchmarks.end_to_end.hetero's --preset, its "
                        "HeteroNodeClassifier, ZeroCopyHeteroDataModule and the Strategy's cache over typed rows; "
                        "PyG rows: the hetero NeighborLoader")
    parser.add_argument("--preset", default=None, choices=sorted(HETERO_PRESETS),
                        help="--graph hetero: the graph and model preset of benchmarks.end_to_end.hetero (default: mag, "
                        "ogbn-mag's counts); --num-nodes, --avg-degree, --features and --model do not apply")
    parser.add_argument("--prepare-timeout", type=float, default=900.0, help="--graph hetero: seconds to draw and "
                        "cache the graph before the runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None, help="dataset cache root (default: the datasets' default)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--repeats", type=int, default=1, help="run the sweep in this many blocks of alternating "
                        "order; speed-ups against each block's own 1-GPU run, and their medians (benchmarks.scaling."
                        "repeats)")
    parser.add_argument("--out", default="results/scaling.json")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a plumbing check (gloo ranks, CPU sampler and gather); it measures nothing")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.graph == "hetero":
        args.preset = args.preset or "mag"
    elif args.preset is not None:
        parser.error("--preset applies to --graph hetero only")
    raw = list(sys.argv[1:] if argv is None else argv)
    if "--child" in raw:
        raw = raw[: raw.index("--child")]
    args.argv = raw
    return args


def main(argv: Optional[list[str]] = None) -> Optional[dict[str, Any]]:
    args = parse_args(argv)
    if args.child is not None:
        run_one(args, json.loads(args.child))
        return None
    import torch

    available = torch.cuda.device_count() if args.device == "cuda" else os.cpu_count() or 1
    if args.device == "cpu" and args.pipelines != "off":
        print("--device cpu: batches are built in the trainer (--pipelines off)", flush=True)
        args.pipelines = "off"
    previous = forward_stop_signals()
    runs: list[dict[str, Any]] = []
    graph: Optional[dict[str, Any]] = None
    try:
        if args.graph == "hetero":  # drawn and cached once, so that no run's --timeout pays for it
            from benchmarks.scaling.hetero import prepare_graph

            print(f"hetero: preparing the {args.preset!r} graph", flush=True)
            graph = prepare_graph(args, REPO_ROOT, args.prepare_timeout)
            print(f"hetero: {sum(graph['num_nodes'].values()):,} nodes, {sum(graph['num_edges'].values()):,} edges, "
                  f"{graph['feature_GB']:.2f} GB of features, ready in {graph['wall_s']:.0f} s", flush=True)
        for gpus in sorted({int(g) for g in f"{args.gpus},{args.pyg_gpus}".split(",") if g.strip()}):
            if gpus > available:
                print(f"skipping {gpus} GPUs: this machine has {available}", flush=True)
        plan = planned_runs(args.gpus, args.pipelines, args.budgets, args.policies, args.pyg_gpus, available)
        for block, p in sweep_order(plan, args.repeats):
            r = launch(args, p.gpus, p.policy, p.budget, p.pipeline, loader=p.loader)
            r["repeat"] = block
            runs.append(r)
            what = (f"{p.gpus} GPU(s) {p.policy} {p.budget:.0%} pipeline {p.pipeline}" if p.loader == "ours"
                    else f"PyG NeighborLoader {p.gpus} GPU(s)") + (f" [block {block + 1}]" if args.repeats > 1 else "")
            if "error" in r:
                print(f"{what}: failed (rc {r['returncode']})\n{r['error']}", flush=True)
            elif p.loader == "ours":
                hit = [q.get("cache/hit_rate") for q in r["per_rank"]]
                print(f"{what}: {r['seeds_per_s']:.0f} seeds/s, {r['rank_steps_per_s']:.1f} steps/s a rank, "
                      f"chose {r['chosen_policy']} ({r['note']}), hit rate {hit}", flush=True)  # fmt: skip
            else:
                print(f"{what}: {r['seeds_per_s']:.0f} seeds/s, {r['rank_steps_per_s']:.1f} steps/s a rank", flush=True)
    finally:  # also when a signal stopped the sweep: the runs finished so far are written
        restore_signals(previous)
        report = _report(args, runs, available, torch.__version__, graph)
    return report




if __name__ == "__main__":
    main()
