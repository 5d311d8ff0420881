"""One row of the heterogeneous benchmark, run in a process of its own (see ``benchmarks/end_to_end/hetero/``).

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
from typing import Any, Optional

import torch

from benchmarks.common.measure import FirstBatchesCheck
from benchmarks.common.pyg import fit_on_best_pyg_loader, pyg_sampling_backends
from benchmarks.common.row_runs import guarded_row
from benchmarks.common.rows import RowUnavailable
from benchmarks.end_to_end.one_model import fit_one_model, our_datamodule
from benchmarks.end_to_end.rows import Row
from benchmarks.end_to_end.hetero.report import mag_epoch_steps

__all__ = ["HeteroBatchCheck", "build_dataset", "build_model", "hetero_data", "run_row"]


class HeteroBatchCheck(FirstBatchesCheck):
    """The first ``count`` training batches against the dataset: every featured type's ``x`` equals the dataset's
    rows at its ``n_id``, the seeds are training ids of the input type with their labels, every edge type's local
    ids are in range of its endpoint types' rows."""

    def __init__(self, data: Any, count: int, stored_dtype: Optional[torch.dtype] = None) -> None:
        super().__init__(count)
        self.data = data
        self.train = torch.sort(data.split("train")).values
        self.stored_dtype = stored_dtype  # the host tables' dtype (feature_dtype): x is the dataset's rows cast to it

    def check(self, step: int, batch: Any, pl_module: Any) -> None:
        problems, data = self.result["problems"], self.data
        for node_type, x in data.x.items():
            n_id = batch[node_type].n_id.cpu()
            want = torch.as_tensor(x[n_id])
            want = want if self.stored_dtype is None else want.to(self.stored_dtype)
            if not torch.equal(batch[node_type].x.cpu(), want.to(batch[node_type].x.dtype)):
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


def run_row(row: Row, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Train the row; a result dict (``status`` ok | skipped | error)."""
    return guarded_row(row, args, kwargs, _run)


def build_dataset(kwargs: dict[str, Any]) -> Any:
    """The ``SyntheticHeteroGraph`` of ``benchmarks.end_to_end.hetero.dataset_kwargs`` (the same in every row: one cache).

    Raises:
        RowUnavailable: this build has no ``SyntheticHeteroGraph``.
    """
    try:
        from lightning_zerocopy.datasets import SyntheticHeteroGraph
    except ImportError as exc:
        raise RowUnavailable(f"this build has no SyntheticHeteroGraph ({exc})") from exc
    return SyntheticHeteroGraph(**kwargs)


def build_model(args: Any, dataset: Any, data: Any) -> Any:
    """The ``HeteroNodeClassifier`` every row trains (``args``: ``hidden``, ``fanouts``, ``conv``, ``lr``): its graph
    shape given explicitly from ``data`` (node and edge types, node counts, input type), so a PyG DataModule trains
    the same model; shared with ``benchmarks.scaling --graph hetero``."""
    from lightning_zerocopy.models import HeteroNodeClassifier

    return HeteroNodeClassifier(dict(dataset.num_features), int(dataset.num_classes), hidden_channels=args.hidden, num_layers=len(args.fanouts),
                                conv=args.conv, node_types=list(data.num_nodes), edge_types=list(data.edge_index),
                                num_nodes=dict(data.num_nodes), input_type=data.input_type,
                                optimizer=functools.partial(torch.optim.Adam, lr=args.lr))  # fmt: skip


def _run(row: Row, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    feature_dtype = getattr(args, "feature_dtype", None) if row.kind == "ours" else None  # PyG, model-only: fp32

    def figures(found: dict[str, Any]) -> dict[str, Any]:
        rate = found.get("steps_per_s")
        found["mag_epoch_s"] = mag_epoch_steps() / rate if rate else None
        found["feature_dtype"] = feature_dtype or "float32"
        return found

    stored = None if feature_dtype is None else getattr(torch, feature_dtype)
    return fit_one_model(row, args, kwargs, build_dataset=build_dataset, model=build_model, fit_pyg=_fit_pyg,
                         batch_check=functools.partial(HeteroBatchCheck, stored_dtype=stored),
                         datamodule=functools.partial(_datamodule, feature_dtype=feature_dtype), figures=figures)  # fmt: skip


def _datamodule(dataset: Any, args: Any, feature_dtype: Optional[str] = None, **data: Any) -> Any:
    extra = {} if feature_dtype is None else {"feature_dtype": feature_dtype}
    return our_datamodule("ZeroCopyHeteroDataModule", dataset, data, num_neighbors=list(args.fanouts),
                          batch_size=args.batch_size, drop_last=True, seed=args.seed, **extra)  # fmt: skip


def hetero_data(data: Any) -> Any:
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

    graph = hetero_data(data)
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
