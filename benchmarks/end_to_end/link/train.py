"""One row of the link-prediction benchmark, run in a process of its own (see ``benchmarks/end_to_end/link/``).

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
from typing import Any

import torch

from benchmarks.common.measure import FirstBatchesCheck
from benchmarks.common.pyg import fit_on_best_pyg_loader, pyg_sampling_backends
from benchmarks.common.row_runs import guarded_row
from benchmarks.end_to_end.one_model import fit_one_model, our_datamodule
from benchmarks.end_to_end.rows import Row
from lightning_zerocopy.models.link_predictor import num_positives

__all__ = ["LinkBatchCheck", "run_row"]


class LinkBatchCheck(FirstBatchesCheck):
    """The first ``count`` training batches against the dataset: ``x`` equals the rows at ``n_id``, label edges point
    into the batch, ``batch_size`` positives that are train edges, ``round(batch_size * ratio)`` negatives."""

    def __init__(self, x: torch.Tensor, train_pos: torch.Tensor, num_nodes: int, ratio: float, count: int) -> None:
        super().__init__(count)
        self.x, self.ratio, self.num_nodes = x, ratio, num_nodes
        self.train_keys = torch.sort(train_pos[0] * num_nodes + train_pos[1]).values

    def check(self, step: int, batch: Any, pl_module: Any) -> None:
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


def run_row(row: Row, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Train the row; a result dict (``status`` ok | skipped | error)."""
    return guarded_row(row, args, kwargs, _run)


def build_dataset(kwargs: dict[str, Any]) -> Any:
    """The ``SyntheticLinkGraph`` of ``benchmarks.end_to_end.link.dataset_kwargs`` (the same in every row: one cache)."""
    from lightning_zerocopy.datasets import SyntheticGraph, SyntheticLinkGraph

    return SyntheticLinkGraph(SyntheticGraph(**kwargs["graph"]), **kwargs["link"])


def _model(args: Any, dataset: Any, data: Any) -> Any:
    from lightning_zerocopy.models import LinkPredictor

    return LinkPredictor(data.num_features, hidden_channels=args.hidden, num_layers=len(args.fanouts),
                         optimizer=functools.partial(torch.optim.Adam, lr=args.lr))  # fmt: skip


def _run(row: Row, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    def check(data: Any, count: int) -> LinkBatchCheck:
        return LinkBatchCheck(data.x, data.split("train").pos_edge_index, data.num_nodes, args.neg_ratio, count=count)

    def figures(found: dict[str, Any]) -> dict[str, Any]:
        found["final_val_auroc"], found["best_val_auroc"] = found.pop("final_val_acc"), found.pop("best_val_acc")
        return found

    return fit_one_model(row, args, kwargs, build_dataset=build_dataset, batch_check=check, model=_model,
                         datamodule=_datamodule, fit_pyg=_fit_pyg, metric="val_auroc", figures=figures)  # fmt: skip


def _datamodule(dataset: Any, args: Any, **data: Any) -> Any:
    return our_datamodule("ZeroCopyLinkDataModule", dataset, data, num_neighbors=args.fanouts, batch_size=args.batch_size,
                          neg_sampling="binary", neg_sampling_ratio=args.neg_ratio, drop_last=True, seed=args.seed)  # fmt: skip


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
