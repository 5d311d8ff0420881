"""One row of the heterogeneous benchmark, run in a process of its own (see ``benchmarks/e2e/hetero/``).

Every row trains the same ``HeteroNodeClassifier`` (same seed, so the same initial weights) through Lightning's
``Trainer``: our rows through ``ZeroCopyHeteroDataModule`` (the fanouts for every edge type), PyG's row through
``NeighborLoader`` over a ``HeteroData`` of the same arrays (its own shuffle; the same fanouts, batch size and
validation seeds), model-only on batches our CPU builder made before training. ``TrainClock`` (validation accuracy
over training time), ``DataTelemetry`` (stall) and ``summarize`` are the end-to-end benchmark's;
:class:`HeteroBatchCheck` compares the first batches with the dataset. The DataModule and the generator are
imported inside the functions, so this module imports where they are missing (the rows then fail with the reason).
"""

from __future__ import annotations

import functools
import time
import traceback
from typing import Any, Iterator

import torch
from pytorch_lightning.callbacks import Callback

from benchmarks.common.measure import TrainClock, _device_name, _sync, summarize
from benchmarks.common.pyg import fit_on_best_pyg_loader, pyg_sampling_backends
from benchmarks.common.rows import RowUnavailable
from benchmarks.e2e.rows import Row
from benchmarks.e2e.train import pipeline_options, share_figures
from benchmarks.e2e.hetero.report import mag_epoch_steps

__all__ = ["HeteroBatchCheck", "build_dataset", "run_row"]


class HeteroBatchCheck(Callback):
    """The first ``count`` training batches against the dataset: every featured type's ``x`` equals the dataset's
    rows at its ``n_id``, the seeds are training ids of the input type with their labels, every edge type's local
    ids are in range of its endpoint types' rows."""

    def __init__(self, data: Any, count: int) -> None:
        self.data, self.count = data, count
        self.train = torch.sort(data.split("train")).values
        self.result: dict[str, Any] = {"checked": 0, "ok": True, "problems": []}

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step >= self.count:
            return
        problems, data = self.result["problems"], self.data
        for node_type, x in data.x.items():
            n_id = batch[node_type].n_id.cpu()
            if not torch.equal(batch[node_type].x.cpu(), torch.as_tensor(x[n_id]).to(batch[node_type].x.dtype)):
                problems.append(f"step {step}: {node_type}.x differs from the dataset's rows at n_id")
        seeds_store = batch[data.input_type]
        size = int(seeds_store.batch_size)
        seeds = seeds_store.n_id[:size].cpu()
        found = self.train[torch.searchsorted(self.train, seeds).clamp(max=self.train.numel() - 1)] == seeds
        if not bool(found.all()):
            problems.append(f"step {step}: {int((~found).sum())} seeds are not training {data.input_type} ids")
        if not torch.equal(seeds_store.y[:size].cpu(), data.y[seeds]):
            problems.append(f"step {step}: the seeds' y differs from the dataset's labels")
        for edge_type in batch.edge_types:
            index = batch[edge_type].edge_index
            if index.numel() == 0:
                continue
            src, _, dst = edge_type
            if int(index[0].max()) >= batch[src].num_nodes or int(index[1].max()) >= batch[dst].num_nodes:
                problems.append(f"step {step}: {'__'.join(edge_type)} edge_index out of range")
        self.result["checked"] += 1
        self.result["ok"] = not problems


def run_row(row: Row, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Train the row; a result dict (``status`` ok | skipped | error)."""
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    base = {"row": row.name, "kind": row.kind, "doc": row.doc}
    try:
        return {**base, "status": "ok", **_run(row, args, kwargs)}
    except RowUnavailable as exc:
        return {**base, "status": "skipped", "reason": str(exc)}
    except Exception as exc:  # noqa: BLE001 - one broken row must not lose the others' results
        return {**base, "status": "error", "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}


def build_dataset(kwargs: dict[str, Any]) -> Any:
    """The ``SyntheticHeteroGraph`` of ``benchmarks.e2e.hetero.dataset_kwargs`` (the same in every row: one cache).

    Raises:
        RowUnavailable: this build has no ``SyntheticHeteroGraph``.
    """
    try:
        from lightning_zerocopy.datasets import SyntheticHeteroGraph
    except ImportError as exc:
        raise RowUnavailable(f"this build has no SyntheticHeteroGraph ({exc})") from exc
    return SyntheticHeteroGraph(**kwargs)


def _model(args: Any, dataset: Any, data: Any) -> Any:
    from lightning_zerocopy.models import HeteroNodeClassifier

    return HeteroNodeClassifier(dict(dataset.num_features), int(dataset.num_classes), hidden_channels=args.hidden, num_layers=len(args.fanouts),
                                conv=args.conv, node_types=list(data.num_nodes), edge_types=list(data.edge_index),
                                num_nodes=dict(data.num_nodes), input_type=data.input_type,
                                optimizer=functools.partial(torch.optim.Adam, lr=args.lr))  # fmt: skip


def _run(row: Row, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
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
    dataset = build_dataset(kwargs)
    data = dataset.load()
    clock = TrainClock(args.warmup, args.row_budget_s, torch.cuda.synchronize if cuda else (lambda: None))
    telemetry = DataTelemetry(prog_bar=False)
    check = HeteroBatchCheck(data, count=min(3, max(1, args.warmup)))
    callbacks: list[Callback] = [clock, telemetry, check] + ([pipeline] if pipeline is not None else [])
    pl.seed_everything(args.seed, workers=True, verbose=False)
    model = _model(args, dataset, data)  # the shape given: the same weights in every row, whatever the data path
    trainer = pl.Trainer(
        accelerator="gpu" if cuda else "cpu", devices=1, max_steps=args.steps, val_check_interval=args.val_every,
        check_val_every_n_epoch=None, limit_val_batches=args.val_batches, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        log_every_n_steps=50,
    )  # fmt: skip
    if row.kind == "ours":
        dm = _datamodule(dataset, args, **row.data)
        t0 = time.perf_counter()
        trainer.fit(model, datamodule=dm)
        extra: dict[str, Any] = {"fit_s": time.perf_counter() - t0, "fit_t0": t0}
    elif row.kind == "pyg":
        extra = _fit_pyg(trainer, model, data, args, device)
    elif row.kind == "model_only":
        extra = _fit_model_only(trainer, model, dataset, args, device)
    else:
        raise ValueError(f"row {row.name}: unknown kind {row.kind!r}")
    if trainer.interrupted:
        raise RuntimeError("training was interrupted (see the row's log)")
    if clock.train_started is not None:
        extra["setup_s"] = clock.train_started - extra["fit_t0"]
    del extra["fit_t0"]
    if row.mps:
        extra.update(share_figures(pipeline))
    figures = summarize(clock, telemetry, args.warmup)
    rate = figures.get("steps_per_s")
    figures["mag_epoch_s"] = mag_epoch_steps() / rate if rate else None
    return {**figures, "batch_check": check.result, "device": _device_name(cuda), "threads": torch.get_num_threads(), **extra}


def _datamodule(dataset: Any, args: Any, **data: Any) -> Any:
    try:
        from lightning_zerocopy import ZeroCopyHeteroDataModule
    except ImportError as exc:
        raise RowUnavailable(f"this build has no ZeroCopyHeteroDataModule ({exc})") from exc
    try:
        return ZeroCopyHeteroDataModule(dataset, num_neighbors=list(args.fanouts), batch_size=args.batch_size,
                                        drop_last=True, seed=args.seed, **data)  # fmt: skip
    except (TypeError, ValueError) as exc:  # an option this build does not have (e.g. a sampler placement)
        raise RowUnavailable(f"ZeroCopyHeteroDataModule rejects {data}: {exc}") from exc


def _hetero_data(data: Any) -> Any:
    """PyG's ``HeteroData`` of the dataset's arrays (features as they are: memory-mapped ones stay mapped)."""
    from torch_geometric.data import HeteroData

    graph = HeteroData()
    for node_type, count in data.num_nodes.items():
        graph[node_type].num_nodes = count
        if node_type in data.x:
            graph[node_type].x = torch.as_tensor(data.x[node_type])
    for edge_type, index in data.edge_index.items():
        graph[edge_type].edge_index = index
    graph[data.input_type].y = data.y
    return graph


def _fit_pyg(trainer: Any, model: Any, data: Any, args: Any, device: torch.device) -> dict[str, Any]:
    """PyG's hetero NeighborLoader as users run it; worker count: the best of a short sweep."""
    backends = pyg_sampling_backends("NeighborLoader")
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.sampler import NeighborSampler

    graph = _hetero_data(data)
    t0 = time.perf_counter()
    sampler = NeighborSampler(graph, num_neighbors=list(args.fanouts), share_memory=True)
    sampler_s = time.perf_counter() - t0
    train = (data.input_type, data.split("train"))
    val = (data.input_type, data.split("val")[: args.val_batches * args.batch_size])  # the seeds ours validates on

    def loader(workers: int, evaluate: bool = False) -> Any:
        common = dict(num_neighbors=list(args.fanouts), batch_size=args.batch_size, num_workers=workers,
                      pin_memory=device.type == "cuda", persistent_workers=workers > 0, neighbor_sampler=sampler)  # fmt: skip
        if evaluate:
            return NeighborLoader(graph, input_nodes=val, shuffle=False, **common)
        return NeighborLoader(graph, input_nodes=train, shuffle=True, drop_last=True, **common)

    return fit_on_best_pyg_loader(trainer, model, loader, lambda w: loader(w, evaluate=True), args, device,
                                  backends=backends, pyg_sampler_build_s=sampler_s)  # fmt: skip


def _fit_model_only(trainer: Any, model: Any, dataset: Any, args: Any, device: torch.device) -> dict[str, Any]:
    """The plan's first ``stage_batches`` batches, built by our CPU builder and moved to the device before training."""
    dm = _datamodule(dataset, args, sampler_placement="cpu", gather="cpu")
    dm.prepare_data()
    dm.setup("fit")
    try:
        loader = dm.train_dataloader()
        count = min(args.stage_batches, args.steps)
        t0 = time.perf_counter()
        staged: list[Any] = []
        for epoch in range(-(-count // len(loader))):
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            staged += [batch.to(device) for _, batch in zip(range(count - len(staged)), loader)]
        _sync(device)
        stage_s = time.perf_counter() - t0

        class Staged:
            def __len__(self) -> int:
                return args.steps

            def __iter__(self) -> Iterator[Any]:
                return (staged[i % count] for i in range(args.steps))

        t0 = time.perf_counter()
        trainer.fit(model, train_dataloaders=Staged(), val_dataloaders=dm.val_dataloader())
        return {"fit_s": time.perf_counter() - t0, "fit_t0": t0, "staged_batches": count, "stage_s": stage_s}
    finally:
        dm.teardown("fit")
