"""One row of the link-prediction benchmark, run in a process of its own (see ``benchmarks/link/``).

Every row trains the same ``LinkPredictor`` (same seed, so the same initial weights) through Lightning's
``Trainer``: our rows through ``ZeroCopyLinkDataModule`` (``drop_last=True``: every step has ``batch_size``
positives), PyG's row through ``LinkNeighborLoader`` (its own shuffle; the same positives per step and negatives
ratio), model-only on batches our CPU builder made before training. Validation scores the same val positives and
their fixed negatives in every row. ``TrainClock`` (validation AUROC over training time), ``DataTelemetry`` (stall)
and ``summarize`` are the end-to-end benchmark's; :class:`LinkBatchCheck` compares the first batches with the
dataset.
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
from lightning_zerocopy.models.link_predictor import num_positives

__all__ = ["LinkBatchCheck", "run_row"]


class LinkBatchCheck(Callback):
    """The first ``count`` training batches against the dataset: ``x`` equals the rows at ``n_id``, label edges point
    into the batch, ``batch_size`` positives that are train edges, ``round(batch_size * ratio)`` negatives."""

    def __init__(self, x: torch.Tensor, train_pos: torch.Tensor, num_nodes: int, ratio: float, count: int) -> None:
        self.x, self.ratio, self.count, self.num_nodes = x, ratio, count, num_nodes
        self.train_keys = torch.sort(train_pos[0] * num_nodes + train_pos[1]).values
        self.result: dict[str, Any] = {"checked": 0, "ok": True, "problems": []}

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step >= self.count:
            return
        problems = self.result["problems"]
        n_id, bs = batch.n_id.cpu(), num_positives(batch)  # PyG's link batches have no batch_size
        if not torch.equal(batch.x.cpu(), self.x[n_id].to(batch.x.dtype)):
            problems.append(f"step {step}: x differs from the dataset's rows at n_id")
        eli, label = batch.edge_label_index.cpu(), batch.edge_label.cpu()
        if eli.numel() and (int(eli.min()) < 0 or int(eli.max()) >= n_id.numel()):
            problems.append(f"step {step}: edge_label_index out of range")
        elif int((label > 0).sum()) != bs or label.numel() != bs + round(bs * self.ratio):
            problems.append(f"step {step}: {int((label > 0).sum())} positives and {label.numel()} label edges for "
                            f"batch_size {bs} and negatives ratio {self.ratio}")  # fmt: skip
        else:
            pos = n_id[eli[:, label > 0]]
            keys = pos[0] * self.num_nodes + pos[1]
            found = self.train_keys[torch.searchsorted(self.train_keys, keys).clamp(max=self.train_keys.numel() - 1)] == keys
            if not bool(found.all()):
                problems.append(f"step {step}: {int((~found).sum())} positives are not train edges")
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
    """The ``SyntheticLinkGraph`` of ``benchmarks.link.dataset_kwargs`` (the same in every row: one cache)."""
    from lightning_zerocopy.datasets import SyntheticGraph, SyntheticLinkGraph

    return SyntheticLinkGraph(SyntheticGraph(**kwargs["graph"]), **kwargs["link"])


def _run(row: Row, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    import pytorch_lightning as pl

    from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
    from lightning_zerocopy.models import LinkPredictor

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
    clock = TrainClock(args.warmup, args.row_budget_s, torch.cuda.synchronize if cuda else (lambda: None), metric="val_auroc")
    telemetry = DataTelemetry(prog_bar=False)
    check = LinkBatchCheck(data.x, data.split("train").pos_edge_index, data.num_nodes, args.neg_ratio, count=min(3, max(1, args.warmup)))
    callbacks: list[Callback] = [clock, telemetry, check] + ([pipeline] if pipeline is not None else [])
    pl.seed_everything(args.seed, workers=True, verbose=False)
    model = LinkPredictor(data.num_features, hidden_channels=args.hidden, num_layers=len(args.fanouts),
                          optimizer=functools.partial(torch.optim.Adam, lr=args.lr))  # fmt: skip
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
    figures["final_val_auroc"], figures["best_val_auroc"] = figures.pop("final_val_acc"), figures.pop("best_val_acc")
    return {**figures, "batch_check": check.result, "device": _device_name(cuda), "threads": torch.get_num_threads(), **extra}


def _datamodule(dataset: Any, args: Any, **data: Any) -> Any:
    try:
        from lightning_zerocopy import ZeroCopyLinkDataModule
    except ImportError as exc:
        raise RowUnavailable(f"this build has no ZeroCopyLinkDataModule ({exc})") from exc
    try:
        return ZeroCopyLinkDataModule(dataset, num_neighbors=args.fanouts, batch_size=args.batch_size, neg_sampling="binary",
                                      neg_sampling_ratio=args.neg_ratio, drop_last=True, seed=args.seed, **data)  # fmt: skip
    except ValueError as exc:  # an option this build does not have (e.g. a sampler placement)
        raise RowUnavailable(f"ZeroCopyLinkDataModule rejects {data}: {exc}") from exc


def _eval_edges(split: Any, positives: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``positives`` positives of ``split``, each followed by its fixed negatives (grouped) or then the
    pool's first negatives (shared), with labels 1 / 0: the edges our validation batches score."""
    pos = split.pos_edge_index[:, :positives]
    if split.neg_per_positive is not None:
        k = split.neg_per_positive
        neg = split.neg_edge_index[:, : positives * k].view(2, -1, k)
        edges = torch.cat([pos.unsqueeze(2), neg], dim=2).reshape(2, -1)
        label = torch.cat([torch.ones(pos.size(1), 1), torch.zeros(pos.size(1), k)], dim=1).flatten()
        return edges, label
    neg = split.neg_edge_index
    return torch.cat([pos, neg], dim=1), torch.cat([torch.ones(pos.size(1)), torch.zeros(neg.size(1))])


def _fit_pyg(trainer: Any, model: Any, data: Any, args: Any, device: torch.device) -> dict[str, Any]:
    """PyG's LinkNeighborLoader as users run it; worker count: the best of a short sweep."""
    backends = pyg_sampling_backends("LinkNeighborLoader")
    from torch_geometric.data import Data
    from torch_geometric.loader import LinkNeighborLoader
    from torch_geometric.sampler import NegativeSampling, NeighborSampler

    graph = Data(x=data.x, edge_index=data.edge_index, num_nodes=data.num_nodes)
    t0 = time.perf_counter()
    sampler = NeighborSampler(graph, num_neighbors=list(args.fanouts), share_memory=True)
    sampler_s = time.perf_counter() - t0
    train = data.split("train").pos_edge_index
    val_split = data.split("val")
    k = val_split.neg_per_positive or 0
    val_edges, val_label = _eval_edges(val_split, min(val_split.num_positives, args.val_batches * args.batch_size))

    def loader(workers: int, evaluate: bool = False) -> Any:
        common = dict(num_neighbors=list(args.fanouts), num_workers=workers, pin_memory=device.type == "cuda",
                      persistent_workers=workers > 0, neighbor_sampler=sampler)  # fmt: skip
        if evaluate:  # the batches our validation scores: batch_size positives with their fixed negatives
            return LinkNeighborLoader(graph, edge_label_index=val_edges, edge_label=val_label,
                                      batch_size=args.batch_size * (1 + k) if k else args.batch_size, shuffle=False, **common)  # fmt: skip
        return LinkNeighborLoader(graph, edge_label_index=train, neg_sampling=NegativeSampling("binary", args.neg_ratio),
                                  batch_size=args.batch_size, shuffle=True, drop_last=True, **common)  # fmt: skip

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
