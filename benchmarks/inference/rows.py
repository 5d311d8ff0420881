"""The inference benchmark's rows (``benchmarks/inference/``), their presets, and what a row process runs.

Every row computes the logits of every node of one ``SyntheticGraph`` with the same ``lightning_zerocopy.models``
GraphSAGE (same seed, so the same weights; never trained: the time of a pass does not depend on the weights):

* ``ours``: ``predict_mode: layerwise`` (:class:`~lightning_zerocopy.data.layerwise.LayerwisePass` over the
  DataModule's host-memory features, read zero-copy on a GPU);
* ``pyg``: PyG's ``BasicGNN.inference`` over ``NeighborLoader(num_neighbors=[-1])`` (its best worker count of a short
  sweep), intermediate embeddings on the CPU, as PyG's examples run it; ``pyg_cached``: the same with ``cache=True``
  (PyG's ``CachedLoader`` keeps every one-hop batch on the GPU after the first layer);
* ``sampled``: our sampled ``trainer.predict`` over every node (the model's fanouts, ``--sampled-batch-size`` seeds a
  batch); it runs ``--sampled-batches`` batches and its time over all nodes is extrapolated from their steady rate.

``ours`` and ``pyg*`` keep the logits of ``--probe-nodes`` evenly spaced nodes, so the report gives the largest
difference between them (exact both: float noise only).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from benchmarks.common.rows import RowUnavailable
from benchmarks.end_to_end.rows import MODELS as E2E_MODELS

__all__ = ["MODELS", "PRESETS", "ROWS", "InferenceRow", "Preset", "run_row"]


@dataclass(frozen=True)
class InferenceRow:
    name: str
    kind: str
    doc: str
    needs_cuda: bool = False


ROWS: dict[str, InferenceRow] = {row.name: row for row in [
    InferenceRow("ours", "ours", "predict_mode: layerwise (host-memory features, one-hop batches of our sampler)"),
    InferenceRow("pyg", "pyg", "PyG BasicGNN.inference, NeighborLoader([-1]), best worker count, embeddings on the CPU"),
    InferenceRow("pyg_cached", "pyg", "as pyg, cache=True (CachedLoader: the one-hop batches kept on the GPU)"),
    InferenceRow("sampled", "ours", "our sampled predict over every node (the model's fanouts), extrapolated"),
]}  # fmt: skip

#: name: (hidden, layers, fanouts of the sampled row) -- the e2e benchmark's light and heavy models
MODELS: dict[str, tuple[int, int, tuple[int, ...]]] = {
    name: (E2E_MODELS[name].hidden, E2E_MODELS[name].layers, E2E_MODELS[name].fanouts) for name in ("light", "heavy")
}


@dataclass(frozen=True)
class Preset:
    """The graph and the batch sizes of a named run; every field is also a flag."""

    num_nodes: int
    avg_degree: float
    features: int
    classes: int
    batch_size: int
    ours_batch_size: int
    sampled_batch_size: int
    sampled_batches: int
    pyg_workers: str
    configs: str
    models: str
    threads: int
    row_timeout_s: float


PRESETS: dict[str, Preset] = {
    # CPU rows on a few thousand nodes (the smoke test, CI); one thread per row process (a shared two-core box)
    "ci": Preset(3_000, 8.0, 16, 4, 256, 256, 128, 6, "0", "ours,sampled,pyg", "light", 1, 300.0),
    # the e2e benchmark's 24M-node graph (docs/PERFORMANCE.md: 288M edges, 9.6 GB of fp32 features), one GPU
    # (a device call of at most 10 min: one model a call, --models light then --models heavy); PyG at 4096 as its
    # examples, ours at the library's default (LayerwiseOptions.batch_size; 4096 -> 32768 took light from 36.6 to 19.9 s)
    "24m": Preset(24_000_000, 12.0, 100, 47, 4096, 32768, 1024, 400, "4,8,12", "ours,pyg,sampled", "light", 0, 420.0),
}


def _model(args: Any, name: str) -> Any:
    from lightning_zerocopy.models import GraphSAGE

    hidden, layers, _ = MODELS[name]
    torch.manual_seed(args.seed)
    return GraphSAGE(args.features, args.classes, hidden_channels=hidden, num_layers=layers).eval()


def _device(row: InferenceRow, args: Any) -> torch.device:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise RowUnavailable("--device cuda, but no CUDA GPU is available here")
    return torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _probe_ids(num_nodes: int, count: int) -> torch.Tensor:
    """``count`` evenly spaced node ids from 0 to ``num_nodes - 1``, in integers (a float32 ``linspace`` rounds ids
    above 2**24 up to ``num_nodes``, past the last node)."""
    count = min(count, num_nodes)
    if count <= 1:
        return torch.zeros(count, dtype=torch.int64)
    return (torch.arange(count, dtype=torch.int64) * (num_nodes - 1) // (count - 1)).unique()


def run_row(row: InferenceRow, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Row ``row`` for every model of ``args.models``: ``{"models": {name: figures}}`` (a row process's result)."""
    from benchmarks.common.row_runs import guarded_row

    def run(row: InferenceRow, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        from lightning_zerocopy import SyntheticGraph

        device = _device(row, args)
        dataset = SyntheticGraph(**kwargs)
        go = {"ours": _ours, "pyg": _pyg, "pyg_cached": _pyg, "sampled": _sampled}[row.name]
        return {"models": {name: go(row, args, dataset, name, device) for name in args.models.split(",")}}

    return guarded_row(row, args, kwargs, run)


# ---- ours: layer-wise ---------------------------------------------------------------------------------------------


def _datamodule(args: Any, dataset: Any, device: torch.device, **kwargs: Any) -> Any:
    import pytorch_lightning as pl

    from lightning_zerocopy import ZeroCopyDataModule

    dm = ZeroCopyDataModule(dataset, num_threads=args.threads or None, predict_split="all",
                            sampler_placement=args.sampler_placement, **kwargs)  # fmt: skip
    dm.trainer = pl.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, logger=False,
                            enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    t0 = time.perf_counter()
    dm.setup()
    return dm, time.perf_counter() - t0


def _ours(row: InferenceRow, args: Any, dataset: Any, name: str, device: torch.device) -> dict[str, Any]:
    from lightning_zerocopy.data.layerwise import LayerwisePass
    from lightning_zerocopy.data.layerwise_options import LayerwiseOptions
    from lightning_zerocopy.models.layerwise import layerwise_module

    placement = args.sampler_placement if args.sampler_placement in ("cpu", "uva", "gpu") else "auto"
    options = LayerwiseOptions(batch_size=args.ours_batch_size, max_batch_edges=args.max_batch_edges, storage=args.storage,
                               dtype=args.layerwise_dtype, sampler_placement=placement)  # fmt: skip
    dm, setup_s = _datamodule(args, dataset, device, fanouts=list(MODELS[name][2]), predict_mode="layerwise",
                              layerwise=options)  # fmt: skip
    try:
        model = _model(args, name).to(device)
        builder = dm.builder("predict", layerwise=True).open(dm.resources)
        try:
            _sync(device)
            t0 = time.perf_counter()
            result = LayerwisePass(builder, layerwise_module(model), options, device=device).run()
            _sync(device)
            total = time.perf_counter() - t0
        finally:
            builder.close()
        try:
            table = result.tables["_N"]
            probe = table.data[_probe_ids(table.data.shape[0], args.probe_nodes).to(table.data.device)]
            storage = table.storage
        finally:
            result.close()
    finally:
        dm.teardown()
    layers = [{"layer": s.layer, "seconds": s.seconds, "batches": s.batches, "edges": s.edges,
               "bytes_read": s.bytes_read, "gb_per_s": s.bytes_read / max(s.seconds, 1e-9) / 1e9,
               "sample_s": s.sample_seconds} for s in result.stats]  # fmt: skip
    return {"total_s": total, "setup_s": setup_s, "layers": layers, "storage": storage, "batch_size": options.batch_size,
            "sampler_placement": builder.sampler_placement,
            "probe": probe.float().cpu().tolist()}  # fmt: skip


# ---- PyG: BasicGNN.inference --------------------------------------------------------------------------------------

_PYG: dict[str, Any] = {}  # a row process's PyG graph and sampler, shared by its models


def _pyg(row: InferenceRow, args: Any, dataset: Any, name: str, device: torch.device) -> dict[str, Any]:
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from benchmarks.common.pyg import _loader_rate, pyg_sampling_backends

    backends = pyg_sampling_backends("NeighborLoader")
    if row.name == "pyg_cached" and device.type != "cuda":
        raise RowUnavailable("pyg_cached keeps the batches on a GPU: --device cuda")
    if "data" not in _PYG:  # once per row process (both models): x in RAM as a PyG user holds it, one CSC
        loaded = dataset.load()
        _PYG["data"] = Data(x=loaded.x.clone(), edge_index=loaded.edge_index.clone(), num_nodes=int(loaded.x.shape[0]))
        del loaded
    data = _PYG["data"]

    class TimedLoader(NeighborLoader):
        """PyG's NeighborLoader, noting when each layer's pass starts and how many rows its batches gather."""

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.starts: list[float] = []
            self.rows: list[int] = []

        def __iter__(self) -> Any:
            _sync(device)
            self.starts.append(time.perf_counter())
            self.rows.append(0)
            for batch in super().__iter__():
                self.rows[-1] += int(batch.n_id.numel())
                yield batch

    def loader(workers: int, cls: Any = NeighborLoader) -> Any:
        made = cls(data, num_neighbors=[-1], input_nodes=None, batch_size=args.batch_size, shuffle=False,
                   num_workers=workers, persistent_workers=workers > 0, pin_memory=device.type == "cuda",
                   neighbor_sampler=_PYG.get("sampler"))  # fmt: skip
        _PYG["sampler"] = made.node_sampler  # its CSC is built once (288M edges: tens of seconds)
        return made

    t0 = time.perf_counter()
    workers = [int(w) for w in str(args.pyg_workers).split(",") if w.strip()]
    sweep = {w: _loader_rate(loader(w), device, args.sweep_batches) for w in workers} if len(workers) > 1 else {}
    best = max(sweep, key=sweep.get) if sweep else workers[0]
    timed = loader(best, TimedLoader)
    sweep_s = time.perf_counter() - t0
    net = _model(args, name).net.to(device)
    _sync(device)
    t0 = time.perf_counter()
    out = net.inference(timed, device=device, embedding_device="cpu", progress_bar=False, cache=row.name == "pyg_cached")
    _sync(device)
    end = time.perf_counter()
    layers = []
    if row.name == "pyg":  # one pass of the loader per layer (pyg_cached iterates it once, then its cache)
        starts, counts = [*timed.starts[-len(net.convs):], end], timed.rows[-len(net.convs):]
        widths = [args.features, *[MODELS[name][0]] * (len(net.convs) - 1)]
        for layer, (a, b) in enumerate(zip(starts, starts[1:])):
            read = counts[layer] * widths[layer] * 4  # x_all[batch.n_id], float32
            layers.append({"layer": layer, "seconds": b - a, "bytes_read": read,
                           "gb_per_s": read / max(b - a, 1e-9) / 1e9})  # fmt: skip
    return {"total_s": end - t0, "setup_s": sweep_s, "layers": layers, "pyg_workers": best, "pyg_sweep": sweep,
            "batch_size": args.batch_size,
            "pyg_backends": backends, "probe": out[_probe_ids(out.shape[0], args.probe_nodes)].float().tolist()}  # fmt: skip


# ---- ours: sampled predict ----------------------------------------------------------------------------------------


def _sampled(row: InferenceRow, args: Any, dataset: Any, name: str, device: torch.device) -> dict[str, Any]:
    import pytorch_lightning as pl

    from lightning_zerocopy import ZeroCopyDataModule

    fanouts = list(MODELS[name][2])
    dm = ZeroCopyDataModule(dataset, fanouts=fanouts, eval_fanouts=fanouts, eval_batch_size=args.sampled_batch_size,
                            num_threads=args.threads or None, predict_split="all",
                            sampler_placement=args.sampler_placement)  # fmt: skip
    warm = max(1, min(args.sampled_batches // 5, 20))

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.marks: dict[int, float] = {}

        def on_predict_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                                 dataloader_idx: int = 0) -> None:  # fmt: skip
            if batch_idx in (warm - 1, args.sampled_batches - 1):
                _sync(device)
                self.marks[batch_idx] = time.perf_counter()

    clock = Clock()
    trainer = pl.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         limit_predict_batches=args.sampled_batches, callbacks=[clock])  # fmt: skip
    t0 = time.perf_counter()
    trainer.predict(_model(args, name), datamodule=dm, return_predictions=False)
    run_s = time.perf_counter() - t0
    batches = math.ceil(int(dataset.config["num_nodes"]) / args.sampled_batch_size)
    measured = args.sampled_batches - warm
    if warm - 1 not in clock.marks or args.sampled_batches - 1 not in clock.marks or measured < 1:
        raise RuntimeError(f"the sampled predict ran fewer than --sampled-batches {args.sampled_batches} batches")
    per_batch = (clock.marks[args.sampled_batches - 1] - clock.marks[warm - 1]) / measured
    return {"total_s": per_batch * batches, "extrapolated": True, "measured_batches": measured, "batches": batches,
            "batches_per_s": 1 / per_batch, "run_s": run_s, "fanouts": fanouts}  # fmt: skip


def graph_summary(dataset: Any) -> dict[str, Any]:
    """The graph's size for the report (its cache is drawn here when missing)."""
    data = dataset.load()
    return {"num_nodes": int(data.x.shape[0]), "num_edges": int(data.edge_index.shape[1]),
            "features": int(data.x.shape[1]), "features_gb": data.x.numel() * data.x.element_size() / 1e9}  # fmt: skip


def one_line(result: dict[str, Any]) -> str:
    """A row's console line."""
    if result.get("status") != "ok":
        return f"{result['row']}: {result.get('status')} ({result.get('reason')})"
    parts = [f"{m} {r['total_s']:.2f} s" + (" (extrapolated)" if r.get("extrapolated") else "")
             for m, r in result["models"].items()]  # fmt: skip
    return f"{result['row']}: " + ", ".join(parts)


def probe_diff(a: Optional[list], b: Optional[list]) -> Optional[float]:
    """The largest |a - b| over two rows' probe logits (None when either has none)."""
    if not a or not b:
        return None
    return float((torch.tensor(a) - torch.tensor(b)).abs().max())
