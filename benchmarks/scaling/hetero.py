"""``python -m benchmarks.scaling --graph hetero``: the parts of a scaling run that differ on a heterogeneous graph.

The graph, its preset, the model and PyG's baseline are the heterogeneous benchmark's (``benchmarks/end_to_end/hetero/``):
a ``SyntheticHeteroGraph`` of ogbn-mag's shape from one of its presets (``mag`` by default: ogbn-mag's own counts),
drawn and cached once by that benchmark's ``--prepare-only`` in a process of its own, and its
``HeteroNodeClassifier`` (the preset's fanouts for every edge type and its width). Everything a run measures, how it
launches its ranks and how it reports is the scaling benchmark's own (``__main__``): our rows train through
``ZeroCopyHeteroDataModule`` under ``ZeroCopyDDPStrategy`` (its cache over typed rows, ``replicate`` or ``clique``),
PyG's through ``NeighborLoader`` over a ``HeteroData`` under Lightning's ``DDPStrategy``
(:func:`benchmarks.scaling.pyg_ddp.pyg_ddp_datamodule`, shared with the homogeneous rows).

Imports of PyG and the library happen inside the functions: the parent process of the sweep imports this module and
must not initialize CUDA (``import torch_geometric`` does; ``import pytorch_lightning`` does not).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any, Optional

import pytorch_lightning as pl

__all__ = ["HeteroParts", "TypeCacheCounts", "hetero_args", "hetero_parts", "prepare_graph", "segment_paths"]

#: the heterogeneous benchmark's module (its presets, dataset arguments, model and ``--prepare-only``)
HETERO_MODULE = "benchmarks.end_to_end.hetero"


def hetero_args(args: argparse.Namespace) -> argparse.Namespace:
    """The heterogeneous benchmark's parsed flags for this scaling run: ``--preset``, ``--cache-dir`` and ``--seed``
    passed through, so the graph is the one its ``--prepare-only`` cached (the same dataset arguments, one cache key).

    The result carries the preset's graph counts, ``fanouts``, ``hidden``, ``conv``, ``lr`` and ``batch_size``.
    """
    from benchmarks.end_to_end.hetero.__main__ import parse_args

    return parse_args(_hetero_flags(args))


def _hetero_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--preset", args.preset, "--seed", str(args.seed)]
    return flags + (["--cache-dir", args.cache_dir] if args.cache_dir else [])


def prepare_graph(args: argparse.Namespace, repo_root: str, timeout_s: float) -> dict[str, Any]:
    """Draw and cache the preset's graph with the heterogeneous benchmark's ``--prepare-only`` (a process of its own:
    nothing here touches CUDA), before any run starts, so no run's timeout pays for it.

    Returns:
        The graph's summary (node and edge counts, feature bytes, splits, ``prepare_s`` of loading it) and
        ``wall_s`` of the whole preparation.

    Raises:
        RuntimeError: the preparation failed or ran past ``timeout_s`` (its output's tail in the message).
    """
    out = tempfile.mkdtemp(prefix="lzc-hetero-prepare-")
    cmd = [sys.executable, "-m", HETERO_MODULE, "--prepare-only", *_hetero_flags(args), "--out", out]
    env = dict(os.environ, PYTHONPATH=repo_root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"preparing the {args.preset!r} graph ran past {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        raise RuntimeError(f"preparing the {args.preset!r} graph failed (rc {proc.returncode}):\n"
                           f"{(proc.stdout or '')[-2000:]}{(proc.stderr or '')[-3000:]}")  # fmt: skip
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        graph = dict(json.load(f)["graph"])
    graph.pop("kwargs", None)
    return {**graph, "wall_s": time.perf_counter() - started}


def graph_shape(dataset: Any) -> SimpleNamespace:
    """The shape the heterogeneous benchmark's model reads from a loaded graph (``num_nodes``, the edge types as the
    keys of ``edge_index``, ``input_type``), from the dataset's cheap properties: our rows load no array for it."""
    return SimpleNamespace(num_nodes=dict(dataset.num_nodes), edge_index={t: None for t in dataset.edge_types},
                           input_type=dataset.input_type)  # fmt: skip


def segment_paths(handles: Any) -> tuple[list[str], int]:
    """The shared host copy of a heterogeneous DataModule: the paths of every edge type's CSC, the fused CSC, every
    featured type's table, the labels and the splits, and their bytes (for the ranks' PSS of it)."""
    parts = [t for _, graph in handles.graphs for t in (graph.indptr, graph.indices)]
    if handles.fused is not None:  # the sampler's CSC of every edge type (it holds the edge ids of all)
        parts += [handles.fused.graph.indptr, handles.fused.graph.indices, handles.fused.graph.edge_perm]
    parts += [table.data for _, table in handles.features]
    parts += [handles.labels, *handles.splits.values()]
    return [p.path for p in parts], sum(int(p.nbytes) for p in parts)


class HeteroParts(SimpleNamespace):
    """What one scaling run trains on a heterogeneous graph (see :func:`hetero_parts`).

    Attributes:
        datamodule: ``ZeroCopyHeteroDataModule`` (ours) or PyG's DDP DataModule.
        model: the heterogeneous benchmark's ``HeteroNodeClassifier``.
        budget_bytes: the cache budget per GPU: ``config["budget"]`` of the featured types' table bytes.
        batch_size: seed papers per batch per rank.
    """


def hetero_parts(args: argparse.Namespace, config: dict[str, Any], cuda: bool) -> HeteroParts:
    """The DataModule, model and cache budget of one run of ``config`` (``loader`` ``ours`` or ``pyg``, ``budget``
    a share of the feature bytes) on the preset's cached graph.

    Ours: GPU sampler and zero-copy gather on a GPU (CPU sampler and gather on CPU ranks), ``drop_last``, the run's
    seed; the Strategy's cache then covers every featured type's rows under one budget. PyG: ``NeighborLoader`` over
    a ``HeteroData`` of the same arrays, each rank its share of the training papers.
    """
    from benchmarks.end_to_end.hetero.__main__ import dataset_kwargs
    from benchmarks.end_to_end.hetero.train import build_dataset, build_model

    hargs = hetero_args(args)
    dataset = build_dataset(dataset_kwargs(hargs))
    batch_size = args.batch_size or hargs.batch_size
    row_bytes = {t: 4 * int(w) for t, w in dataset.num_features.items()}  # the presets' features are fp32
    feature_bytes = sum(row_bytes[t] * int(dataset.num_nodes[t]) for t in row_bytes)
    budget = int(config["budget"] * feature_bytes)
    if config["loader"] == "pyg":
        from benchmarks.end_to_end.hetero.train import hetero_data
        from benchmarks.scaling.pyg_ddp import pyg_ddp_datamodule

        data = dataset.load()
        dm: Any = pyg_ddp_datamodule(lambda: hetero_data(data), data.split("train"), args, hargs.fanouts,
                                     batch_size, input_type=data.input_type)  # fmt: skip
        shape: Any = data
    else:
        from lightning_zerocopy import ZeroCopyHeteroDataModule

        dm = ZeroCopyHeteroDataModule(dataset, num_neighbors=list(hargs.fanouts), batch_size=batch_size,
                                      sampler_placement="gpu" if cuda else "cpu", gather="zerocopy" if cuda else "cpu",
                                      drop_last=True, seed=args.seed)  # fmt: skip
        shape = graph_shape(dataset)
    model = build_model(hargs, dataset, shape)
    return HeteroParts(datamodule=dm, model=model, budget_bytes=budget, batch_size=batch_size)


def _type_counts(trainer: Any) -> Optional[dict[str, Any]]:
    read = getattr(trainer.strategy, "cache_counts_per_type", None)
    return read() if read is not None else None


class TypeCacheCounts(pl.Callback):
    """Per featured type, the rows this rank's caches served in the last training epoch from the local shard, the
    peers' shards and host memory, and the hit rate (``ZeroCopyDDPStrategy.cache_counts_per_type``, read at the
    epoch's start and end; reading synchronizes the GPU). Empty without a typed cache, and ``None`` for a type no
    cache of this process gathered (a pipeline worker gathers in its own process: its totals are ``DataTelemetry``'s).
    """

    def __init__(self) -> None:
        self.last: dict[str, Optional[dict[str, float]]] = {}
        self._start: dict[str, Any] = {}

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._start = _type_counts(trainer) or {}

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        now = _type_counts(trainer) or {}
        self.last = {}
        for node_type, counts in now.items():
            before = self._start.get(node_type)
            if counts is None:
                self.last[node_type] = None
                continue
            local, peer, host = (int(getattr(counts, f)) - (int(getattr(before, f)) if before is not None else 0)
                                 for f in ("local", "peer", "host"))  # fmt: skip
            total = local + peer + host
            self.last[node_type] = None if total == 0 else {"hit_rate": (local + peer) / total, "local_rows": local,
                                                            "peer_rows": peer, "host_rows": host}  # fmt: skip
