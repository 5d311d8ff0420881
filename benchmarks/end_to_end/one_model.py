"""A row that trains one model through Lightning's ``Trainer``: the set-up the link and heterogeneous benchmarks
share (``benchmarks.end_to_end.link.train``, ``benchmarks.end_to_end.hetero.train``).

:func:`fit_one_model` joins an MPS row's daemon before CUDA is touched, loads the dataset, seeds the model, builds
the ``Trainer`` with ``TrainClock`` (the validation metric over training time), ``DataTelemetry`` (stall), the
benchmark's batch check and the row's ``PipelineCallback``, trains through our DataModule, PyG's loader or staged
batches by the row's kind, and returns the row's figures. What differs between the benchmarks (dataset, model,
check, DataModule, PyG's loader) comes in as functions.
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Callable

import torch
from pytorch_lightning.callbacks import Callback

from benchmarks.common.cli import gemm_rows_callbacks
from benchmarks.common.measure import TrainClock, _device_name, summarize
from benchmarks.common.rows import RowUnavailable
from benchmarks.end_to_end.rows import Row
from benchmarks.end_to_end.train import (fit_on_staged_batches, pipeline_options, require_trainer_mps, row_strategy,
                                         share_figures)

__all__ = ["fit_one_model", "our_datamodule"]


def fit_one_model(row: Row, args: Any, kwargs: dict[str, Any], *, build_dataset: Callable[[dict[str, Any]], Any],
                  batch_check: Callable[[Any, int], Any], model: Callable[[Any, Any, Any], Any],
                  datamodule: Callable[..., Any], fit_pyg: Callable[[Any, Any, Any, Any, torch.device], dict[str, Any]],
                  metric: str = "val_acc",
                  figures: Callable[[dict[str, Any]], dict[str, Any]] = lambda f: f) -> dict[str, Any]:  # fmt: skip
    """Train ``row`` and return its figures.

    Args:
        row: the row (its kind: ``ours``, ``pyg`` or ``model_only``).
        args: the run's flags.
        kwargs: ``build_dataset``'s argument (the graph's, the same in every row: one cache).
        build_dataset: the dataset of ``kwargs`` (loaded here).
        batch_check: the callback that checks the first ``count`` batches against the loaded data, of
            ``(data, count)`` (its ``result`` is reported as ``batch_check``).
        model: the model of ``(args, dataset, data)``, built after seeding (the same weights in every row).
        datamodule: our DataModule of ``(dataset, args, **data options)``.
        fit_pyg: trains ``(trainer, model, data, args, device)`` on PyG's loader; returns ``fit_s`` and ``fit_t0``.
        metric: the validation metric ``TrainClock`` records.
        figures: rewrites ``summarize``'s figures (renames, additions) before the rest is added.

    Raises:
        RowUnavailable: the row needs what this build or machine lacks (a GPU, MPS, a DataModule option).
    """
    import pytorch_lightning as pl

    from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback

    cuda = torch.cuda.device_count() > 0 and torch.version.cuda is not None
    if row.needs_cuda and not cuda:
        raise RowUnavailable("needs a CUDA GPU (none here)")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    pipeline = None
    if row.pipeline is not None:  # first: with mps it joins the launcher's daemon before CUDA is touched
        pipeline = PipelineCallback(**pipeline_options(row, args))
        if row.mps and pipeline.join_mps() is None:
            raise RowUnavailable("MPS is unavailable here (nvidia-cuda-mps-control missing or failed; see the row's log)")
    require_trainer_mps(row)
    dataset = build_dataset(kwargs)
    data = dataset.load()
    clock = TrainClock(args.warmup, args.row_budget_s, torch.cuda.synchronize if cuda else (lambda: None), metric=metric)
    telemetry = DataTelemetry(prog_bar=False)
    check = batch_check(data, min(3, max(1, args.warmup)))
    callbacks: list[Callback] = [clock, telemetry, check] + ([pipeline] if pipeline is not None else [])
    gemm_rows = int(getattr(args, "gemm_rows", 0) or 0)
    callbacks += gemm_rows_callbacks(gemm_rows)  # every row, PyG's and model-only's included: the same model on each
    pl.seed_everything(args.seed, workers=True, verbose=False)
    module = model(args, dataset, data)
    trainer = pl.Trainer(
        accelerator="gpu" if cuda else "cpu", devices=1, strategy=row_strategy(row, args), max_steps=args.steps,
        val_check_interval=args.val_every, check_val_every_n_epoch=None, limit_val_batches=args.val_batches,
        num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        log_every_n_steps=50,
    )  # fmt: skip
    if row.kind == "ours":
        dm = datamodule(dataset, args, **row.data)
        t0 = time.perf_counter()
        trainer.fit(module, datamodule=dm)
        extra: dict[str, Any] = {"fit_s": time.perf_counter() - t0, "fit_t0": t0}
    elif row.kind == "pyg":
        extra = fit_pyg(trainer, module, data, args, device)
    elif row.kind == "model_only":  # the plan's first batches, built by our CPU builder, moved to the device first
        extra = fit_on_staged_batches(trainer, module, datamodule(dataset, args, sampler_placement="cpu", gather="cpu"), args, device)
    else:
        raise ValueError(f"row {row.name}: unknown kind {row.kind!r}")
    if trainer.interrupted:
        raise RuntimeError("training was interrupted (see the row's log)")
    if clock.train_started is not None:
        extra["setup_s"] = clock.train_started - extra["fit_t0"]
    del extra["fit_t0"]
    if pipeline is not None and row.mps:
        extra.update(share_figures(pipeline))
    return {**figures(summarize(clock, telemetry, args.warmup)), "batch_check": check.result, "device": _device_name(cuda),
            "threads": torch.get_num_threads(), "gemm_rows": gemm_rows, **extra}  # fmt: skip


def our_datamodule(name: str, dataset: Any, options: dict[str, Any], **kwargs: Any) -> Any:
    """``lightning_zerocopy.<name>(dataset, **kwargs, **options)``: a row's DataModule (``options``: the row's data
    options).

    Raises:
        RowUnavailable: this build has no ``name``, or it rejects an option (one it does not have, e.g. a sampler
            placement).
    """
    try:
        cls = getattr(importlib.import_module("lightning_zerocopy"), name)
    except (ImportError, AttributeError) as exc:
        raise RowUnavailable(f"this build has no {name} ({exc})") from exc
    try:
        return cls(dataset, **kwargs, **options)
    except (TypeError, ValueError) as exc:
        raise RowUnavailable(f"{name} rejects {options}: {exc}") from exc
