"""One row of the end-to-end benchmark, run in a process of its own (see ``benchmarks/end_to_end/``).

Every row trains the same ``lightning_zerocopy.models`` model (same seed, so the same initial weights, same
optimizer, same ``trim`` and ``precision``) through Lightning's ``Trainer`` on the same cached ``SyntheticGraph``,
with the same seed nodes per step, its figures going to a ``CSVLogger`` under ``<out>/logs``: our rows through
``ZeroCopyDataModule`` (``drop_last=True``, so every batch has ``batch_size`` seeds), PyG's ``NeighborLoader`` on
the plan's seed order (per-hop counts added where torch-sparse leaves them out), and model-only on batches our
builder made before training. Callbacks measure training wall time without validation (``TrainClock``), the data path
(``DataTelemetry``) and check the first batches against the dataset (``BatchCheck``: seeds, ``x``, ``y``).
"""

from __future__ import annotations

import functools
import inspect
import os
import time
import traceback
from typing import Any, Callable, Iterator, Optional

import torch
from pytorch_lightning.callbacks import Callback

from benchmarks.common.cli import gemm_rows_callbacks
from benchmarks.common.host_load import SteadyHostLoad
from benchmarks.common.measure import BatchCheck, TrainClock, _device_name, _sync, summarize
from benchmarks.common.pyg import fit_on_best_pyg_loader, pyg_sampling_backends
from benchmarks.common.rows import RowUnavailable
from benchmarks.common.step_profile import route_worker_profile, step_profile_callbacks
from benchmarks.end_to_end.pyg_hops import add_hop_counts
from benchmarks.end_to_end.rows import ModelSpec, Row, resolve_precision, worker_share

__all__ = ["StagedBatches", "fit_on_staged_batches", "pipeline_options", "run_row", "share_figures", "stage_batches"]


# ---------------------------------------------------------------------------------------------- one row
def run_row(row: Row, models: list[ModelSpec], args: Any, graph_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """Train every model on ``row``; a result dict per model (``status`` ok | skipped | error)."""
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    os.environ.update(row.env)  # before the pipeline's worker starts: it inherits them
    route_worker_profile(row.name)  # LIGHTNING_ZEROCOPY_WORKER_PROFILE's traces into a folder of the row's name
    results = []
    for model in models:
        base = {"row": row.name, "model": model.name, "kind": row.kind, "doc": row.doc}
        try:
            results.append({**base, "status": "ok", **_run_model(row, model, args, graph_kwargs)})
        except RowUnavailable as exc:
            results.append({**base, "status": "skipped", "reason": str(exc)})
        except Exception as exc:  # noqa: BLE001 - one broken row must not lose the others' results
            results.append({**base, "status": "error", "reason": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc()[-4000:]})  # fmt: skip
    return results


def _run_model(row: Row, spec: ModelSpec, args: Any, graph_kwargs: dict[str, Any]) -> dict[str, Any]:
    import pytorch_lightning as pl

    from lightning_zerocopy import SyntheticGraph, ZeroCopyDataModule
    from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
    from lightning_zerocopy.data.plan import BatchPlan
    from lightning_zerocopy import models

    cuda = torch.cuda.device_count() > 0 and torch.version.cuda is not None
    if row.needs_cuda and not cuda:
        raise RowUnavailable("needs a CUDA GPU (none here)")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)

    pipeline = None
    if row.pipeline is not None:  # first: with mps it joins the launcher's daemon before CUDA is touched
        pipeline = PipelineCallback(**pipeline_options(row, args))
        if row.mps and pipeline.join_mps() is None:  # the launcher's daemon (the callback would run without it)
            raise RowUnavailable("MPS is unavailable here (nvidia-cuda-mps-control missing or failed; see the row's log)")
    require_trainer_mps(row)

    dataset = SyntheticGraph(**graph_kwargs)
    data = dataset.load()
    plan = BatchPlan(data.train_idx, args.batch_size, shuffle=True, drop_last=True, seed=args.seed, stream=0)

    def expected_seeds(step: int) -> torch.Tensor:
        epoch, s = divmod(step, len(plan))
        if row.kind == "model_only":
            epoch, s = divmod(step % min(args.stage_batches, args.steps), len(plan))
        return plan.item(epoch, s).seed_ids

    if row.kind == "stages":
        return _stages(dataset, spec, args, device)
    if row.kind == "sample_alone":
        return _sample_alone(dataset, spec, args, device)
    feature_dtype = getattr(args, "feature_dtype", None) if row.kind == "ours" else None
    clock = TrainClock(args.warmup, args.row_budget_s, sync, stop_at=args.target_acc if args.stop_at_target else None)
    telemetry = DataTelemetry(prog_bar=False)
    stored = None if feature_dtype is None else getattr(torch, feature_dtype)
    check = BatchCheck(expected_seeds, data.x, data.y, count=min(3, max(1, args.warmup)), stored_dtype=stored,
                       every=getattr(args, "check_every", 0) or 0)
    host_load = SteadyHostLoad(args.warmup)  # before the clock: its opening /proc reading stays out of the window
    callbacks: list[Callback] = [host_load, clock, telemetry, check]
    gemm_rows = int(getattr(args, "gemm_rows", 0) or 0)
    callbacks += gemm_rows_callbacks(gemm_rows)  # every row, model-only and PyG's included: the same model on each
    callbacks += step_profile_callbacks(f"{row.name}-{spec.name}")  # LIGHTNING_ZEROCOPY_TRAINER_PROFILE
    if pipeline is not None:
        callbacks.append(pipeline)
    strategy = row_strategy(row, args)

    pl.seed_everything(args.seed, workers=True, verbose=False)
    model_class = getattr(models, spec.arch)
    model_kwargs: dict[str, Any] = dict(hidden_channels=spec.hidden, num_layers=spec.layers,
                                        optimizer=functools.partial(torch.optim.Adam, lr=args.lr))  # fmt: skip
    if "trim" in inspect.signature(model_class).parameters:
        model_kwargs["trim"] = args.trim
    elif args.trim:
        raise RowUnavailable(f"--trim: this build's models.{spec.arch} has no trim argument (run with --no-trim)")
    if getattr(args, "compile", False):  # every row, model-only included: the same compiled net on each
        model_kwargs["compile"] = True
    model = model_class(data.num_features, dataset.num_classes, **model_kwargs)
    precision = resolve_precision(args.precision, cuda)
    out_dir = getattr(args, "out", None)
    logger: Any = False
    if out_dir:  # the figures reach a logger, as in a user's run (DataTelemetry's and the model's)
        from pytorch_lightning.loggers import CSVLogger

        logger = CSVLogger(os.path.join(out_dir, "logs"), name=f"{row.name}-{spec.name}", version="")
    trainer = pl.Trainer(
        accelerator="gpu" if cuda else "cpu", devices=1, strategy=strategy, max_steps=args.steps,
        val_check_interval=args.val_every, check_val_every_n_epoch=None, limit_val_batches=args.val_batches,
        num_sanity_val_steps=0, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=callbacks, precision=precision,
    )  # fmt: skip
    extra: dict[str, Any] = {"precision": precision, "trim": bool(getattr(model, "trim", False)),
                             "compile": bool(getattr(args, "compile", False)),
                             "gemm_rows": gemm_rows,
                             "features_in_host_memory": row.features_in_host_memory,
                             "metrics_csv": os.path.join(logger.log_dir, "metrics.csv") if logger else None}  # fmt: skip
    common = dict(fanouts=list(spec.fanouts), batch_size=args.batch_size, drop_last=True, seed=args.seed)
    if getattr(args, "x_dtype", None) and row.kind in ("ours", "model_only"):  # batch.x alike in both
        common["x_dtype"] = args.x_dtype
        extra["x_dtype"] = args.x_dtype
    if row.kind == "ours":
        kwargs = dict(row.data)
        if feature_dtype is not None:
            kwargs["feature_dtype"] = feature_dtype
        extra.update(sampler_placement=kwargs.get("sampler_placement"), feature_dtype=feature_dtype or "float32")
        fraction = kwargs.pop("hot_fraction", None)
        if fraction is not None:
            fraction = getattr(args, fraction) if isinstance(fraction, str) else fraction
            kwargs["hot_rows"] = max(1, int(round(float(fraction) * data.num_nodes)))
            extra["hot_rows"] = kwargs["hot_rows"]
        try:
            dm = ZeroCopyDataModule(dataset, **common, **kwargs)
        except ValueError as exc:  # an option this build does not have (e.g. a sampler placement)
            raise RowUnavailable(f"ZeroCopyDataModule rejects {kwargs}: {exc}") from exc
        t0 = time.perf_counter()
        trainer.fit(model, datamodule=dm)
        extra.update(fit_s=time.perf_counter() - t0, fit_t0=t0)
    elif row.kind == "pyg":
        extra.update(_fit_pyg(trainer, model, data, plan, spec, args, device))
    elif row.kind == "model_only":
        extra.update(_fit_model_only(trainer, model, dataset, common, args, device))
    else:
        raise ValueError(f"row {row.name}: unknown kind {row.kind!r}")
    if trainer.interrupted:
        raise RuntimeError("training was interrupted (see the row's log)")
    if clock.train_started is not None:  # Trainer setup: DataModule host memory, CSC, pipeline start, model to device
        extra["setup_s"] = clock.train_started - extra["fit_t0"]
    del extra["fit_t0"]
    if pipeline is not None and row.mps:
        extra.update(share_figures(pipeline))
    return {**summarize(clock, telemetry, args.warmup), "batch_check": check.result, "device": _device_name(cuda),
            "threads": torch.get_num_threads(), "host_load": host_load.figures, **extra}  # fmt: skip


def require_trainer_mps(row: Row) -> None:
    """A row whose trainer must be an MPS client with no worker (``trainer_mps``): ``RowUnavailable`` unless the
    launcher's daemon set this process's share (without MPS the launcher warns and runs the row anyway)."""
    if row.trainer_mps and not os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        raise RowUnavailable("MPS is unavailable here (the launcher started no daemon; see the row's log)")


def pipeline_options(row: Row, args: Any) -> dict[str, Any]:
    """``PipelineCallback`` keyword arguments of ``row``: its pipeline dict, with an MPS row's worker share (the row's
    own, else ``--worker-sm-percent``)."""
    options = dict(row.pipeline or {})
    if row.mps:
        options["worker_sm_percent"] = worker_share(row, args.worker_sm_percent)
    return options


def share_figures(pipeline: Any) -> dict[str, Any]:
    """An MPS row's results on the worker's share: as configured (a number or ``auto``), the share it ran with
    (``auto``: the calibration's choice, None if it did not decide within the run) and the calibration's figures."""
    import dataclasses

    choice = pipeline.share_choice  # a ShareChoice: percent, build_ms, step_ms, keeps_pace
    return {"worker_sm_percent": pipeline.worker_sm_percent, "chosen_worker_sm_percent": pipeline.chosen_worker_sm_percent,
            "share_choice": None if choice is None else dataclasses.asdict(choice)}  # fmt: skip


def row_strategy(row: Row, args: Any) -> Any:
    """The row's Strategy (its keyword arguments naming ``args`` attributes take their values), or ``"auto"``.

    Raises:
        RowUnavailable: this build has no such Strategy, or it rejects the arguments.
    """
    import importlib

    if row.strategy is None:
        return "auto"
    path, raw = row.strategy
    module, _, cls_name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except (ImportError, AttributeError) as exc:
        raise RowUnavailable(f"{path} is not in this build ({exc})") from exc
    kwargs = {k: (getattr(args, v) if isinstance(v, str) and hasattr(args, v) else v) for k, v in raw.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise RowUnavailable(f"{path}({kwargs}) is rejected by this build: {exc}") from exc


# ---------------------------------------------------------------------------------------------- PyG and model-only
def _fit_pyg(trainer: Any, model: Any, data: Any, plan: Any, spec: ModelSpec, args: Any, device: torch.device) -> dict:
    """PyG's NeighborLoader as users run it, on the plan's seed order; worker count: best of a short sweep."""
    backends = pyg_sampling_backends("NeighborLoader")
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from torch_geometric.sampler import NeighborSampler

    if "sampler" not in _PYG_CACHE:  # one PyG CSC of the graph (shared memory) for every loader of this process
        graph = Data(x=data.x, edge_index=data.edge_index, y=data.y, num_nodes=data.num_nodes)
        t0 = time.perf_counter()
        _PYG_CACHE.update(graph=graph, sampler=NeighborSampler(graph, num_neighbors=list(spec.fanouts), share_memory=True),
                          build_s=time.perf_counter() - t0)  # fmt: skip
    graph, sampler, sampler_s = _PYG_CACHE["graph"], _PYG_CACHE["sampler"], _PYG_CACHE["build_s"]
    sampler.num_neighbors = list(spec.fanouts)  # this model's fanouts (no loader of the previous model is alive)
    epochs = -(-(args.steps + 1) // len(plan))
    order = torch.cat([plan.input_nodes[plan.share(e)[: len(plan) * plan.batch_size]] for e in range(epochs)])
    val_nodes = data.val_idx[: args.val_batches * args.batch_size]

    # torch-sparse leaves the per-hop counts out: the same module trims PyG's batches as it trims ours
    with_counts = functools.partial(add_hop_counts, num_hops=len(spec.fanouts))

    def loader(nodes: torch.Tensor, workers: int) -> Any:
        return NeighborLoader(graph, num_neighbors=list(spec.fanouts), input_nodes=nodes, batch_size=args.batch_size,
                              shuffle=False, drop_last=True, num_workers=workers, pin_memory=device.type == "cuda",
                              persistent_workers=workers > 0, neighbor_sampler=sampler,
                              transform_sampler_output=with_counts)  # fmt: skip

    return fit_on_best_pyg_loader(trainer, model, lambda w: loader(order, w), lambda w: loader(val_nodes, w), args, device,
                                  backends=backends, pyg_sampler_build_s=sampler_s)  # fmt: skip


_PYG_CACHE: dict[str, Any] = {}


def stage_batches(dm: Any, count: int, device: torch.device) -> list[Any]:
    """The plan's first ``count`` training batches, built by a set-up DataModule's own loader (its builder, in this
    process), moved to ``device`` (synchronized: they are there when this returns)."""
    loader = dm.train_dataloader()
    staged: list[Any] = []
    for epoch in range(-(-count // len(loader))):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        staged += [batch.to(device) for _, batch in zip(range(count - len(staged)), loader)]
    _sync(device)
    return staged


class StagedBatches:
    """A training loader over pre-staged batches: ``steps`` batches, cycling through ``staged``."""

    def __init__(self, staged: list[Any], steps: int) -> None:
        self.staged, self.steps = staged, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Any]:
        return (self.staged[i % len(self.staged)] for i in range(self.steps))


def fit_on_staged_batches(trainer: Any, model: Any, dm: Any, args: Any, device: torch.device) -> dict[str, Any]:
    """Model-only: set up ``dm`` (our CPU builder), stage its first ``args.stage_batches`` training batches on
    ``device`` (at most ``args.steps``), train ``args.steps`` steps on them, validating with ``dm``'s loader.

    Returns:
        ``fit_s``, ``fit_t0`` (the fit's start, ``time.perf_counter()``), ``staged_batches`` and ``stage_s``.
    """
    dm.prepare_data()
    dm.setup("fit")
    try:
        count = min(args.stage_batches, args.steps)
        t0 = time.perf_counter()
        staged = stage_batches(dm, count, device)
        stage_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        trainer.fit(model, train_dataloaders=StagedBatches(staged, args.steps), val_dataloaders=dm.val_dataloader())
        return {"fit_s": time.perf_counter() - t0, "fit_t0": t0, "staged_batches": count, "stage_s": stage_s}
    finally:
        dm.teardown("fit")


def _fit_model_only(trainer: Any, model: Any, dataset: Any, common: dict, args: Any, device: torch.device) -> dict:
    """The plan's first ``stage_batches`` batches, built by our CPU builder and moved to the device before training."""
    from lightning_zerocopy import ZeroCopyDataModule

    dm = ZeroCopyDataModule(dataset, **common, sampler_placement="cpu", gather="cpu")
    return fit_on_staged_batches(trainer, model, dm, args, device)


_STAGE_PATHS = (("cpu", "cpu"), ("cpu", "zerocopy"), ("uva", "zerocopy"), ("gpu", "zerocopy"))
_SAMPLE_PLACEMENTS = ("cpu", "uva", "gpu", "hybrid")


def _sample_alone(dataset: Any, spec: ModelSpec, args: Any, device: torch.device) -> dict[str, Any]:
    """Ms per batch of ``sample_batch`` alone per sampler placement, back to back on an otherwise idle GPU
    (``time_sampling``: CUDA events around ``--stage-steps`` batches after 5 untimed; the CPU placement's host time):
    the bound of the producer's sample stage. The CPU placement only, without a GPU. ``gather='cpu'``: sampling needs
    no feature table on the GPU, so none is pinned."""
    from lightning_zerocopy import ZeroCopyDataModule
    from lightning_zerocopy.data.stage_bounds import time_sampling

    timed: dict[str, Optional[float]] = {}
    reasons: dict[str, str] = {}
    for placement in _SAMPLE_PLACEMENTS:
        if device.type != "cuda" and placement != "cpu":
            continue
        dm = ZeroCopyDataModule(dataset, fanouts=list(spec.fanouts), batch_size=args.batch_size, drop_last=True,
                                seed=args.seed, sampler_placement=placement, gather="cpu")  # fmt: skip
        try:
            dm.prepare_data()
            dm.setup("fit")
            builder = dm.train_dataloader().builder
            timed[placement] = time_sampling(builder, dm.plan("train"), batches=args.stage_steps, warmup=5)
        except Exception as exc:  # noqa: BLE001 - a placement this build or machine lacks: the others still count
            timed[placement], reasons[placement] = None, f"{type(exc).__name__}: {exc}"[:300]
        finally:
            dm.teardown("fit")
    return {"sample_alone_ms": timed, "sample_alone_errors": reasons, "batches": args.stage_steps,
            "device": _device_name(device.type == "cuda"), "threads": torch.get_num_threads()}  # fmt: skip


def _stages(dataset: Any, spec: ModelSpec, args: Any, device: torch.device) -> dict[str, Any]:
    """Median ms per batch of each build stage, per (sampler placement, gather), with no training running:
    ``sample_batch``, ``gather_batch`` and, for CPU-built batches, the copy to the device."""
    import statistics

    from lightning_zerocopy import ZeroCopyDataModule

    stages: dict[str, dict[str, float]] = {}
    sizes: dict[str, float] = {}
    for placement, gather in _STAGE_PATHS:
        if device.type != "cuda" and (placement, gather) != ("cpu", "cpu"):
            continue
        dm = ZeroCopyDataModule(dataset, fanouts=list(spec.fanouts), batch_size=args.batch_size, drop_last=True,
                                seed=args.seed, sampler_placement=placement, gather=gather)  # fmt: skip
        dm.prepare_data()
        dm.setup("fit")
        try:
            loader, plan = dm.train_dataloader(), dm.plan("train")
            builder = loader.builder
            times: dict[str, list[float]] = {"sample_ms": [], "gather_ms": [], "copy_ms": []}
            nodes, edges, x_bytes = [], [], []
            for step in range(5 + args.stage_steps):
                item = plan.item(*divmod(step, len(plan)))
                _sync(device)
                t0 = time.perf_counter()
                sampled = builder.sample_batch(item)
                _sync(device)
                t1 = time.perf_counter()
                batch = builder.gather_batch(sampled)
                _sync(device)
                t2 = time.perf_counter()
                batch = batch.to(device, non_blocking=True)
                _sync(device)
                t3 = time.perf_counter()
                if step >= 5:
                    for key, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                        times[key].append(1e3 * dt)
                    nodes.append(batch.n_id.numel())
                    edges.append(batch.edge_index.size(1))
                    x_bytes.append(batch.x.numel() * batch.x.element_size())
            med = {k: statistics.median(v) for k, v in times.items()}
            med["total_ms"] = sum(med.values())
            stages[f"{placement}+{gather}"] = med
            sizes = {"nodes_per_batch": statistics.mean(nodes), "edges_per_batch": statistics.mean(edges),
                     "feature_MB_per_batch": statistics.mean(x_bytes) / 1e6}  # fmt: skip
        finally:
            dm.teardown("fit")
    return {"stages": stages, **sizes, "device": _device_name(device.type == "cuda"), "threads": torch.get_num_threads()}
