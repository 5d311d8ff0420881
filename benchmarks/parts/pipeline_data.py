"""The pipeline benchmark's data, made in its owner process: a power-law graph and random features of ``--gib`` GiB
in shared host memory (``prepare``), the features filled on the GPU by a short-lived child (``fill_features``).
``pipeline.py`` runs the configurations on it."""

from __future__ import annotations

import argparse
import pickle
import subprocess
import sys
import time

import torch


def prepare(args: argparse.Namespace, handles_path: str, fill_script: str) -> dict:
    """Generate the graph into shared host memory (no CUDA in this process: it stays alive, owning the segments,
    while configurations run under MPS); a short-lived child (``fill_script --_fill=handles_path``, which calls
    :func:`fill_features`) fills the features on the GPU through the handle."""
    from lightning_zerocopy.data.host import share_node_data
    from lightning_zerocopy.datasets.base import NodeData

    t0 = time.perf_counter()
    num_nodes = int(args.gib * 2**30 // (4 * args.dim))
    num_edges = int(num_nodes * args.avg_degree)
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(num_nodes, generator=gen)  # shuffled ids: no free locality
    # power-law sources (density ~ rank^-alpha by inverse transform), uniform targets
    u = torch.rand(num_edges, generator=gen, dtype=torch.float64)
    rank = u.mul_(num_nodes ** (1 - args.alpha)).pow_(1 / (1 - args.alpha)).long().clamp_(0, num_nodes - 1)
    del u
    edge_index = torch.stack([perm[rank], torch.randint(0, num_nodes, (num_edges,), generator=gen)])
    del rank
    x = torch.empty((num_nodes, args.dim), dtype=torch.float32)  # filled on the GPU below, through the handle
    y = torch.randint(0, args.classes, (num_nodes,), generator=gen)
    order = torch.randperm(num_nodes, generator=gen)
    n_train = min(num_nodes // 2, args.batch_size * (max(args.steps, 20) + args.warmup + 10))  # breakdown: 20
    data = NodeData(edge_index=edge_index, x=x, y=y, train_idx=order[:n_train], val_idx=order[n_train : n_train + 1024],
                    test_idx=order[n_train + 1024 : n_train + 2048])  # fmt: skip
    gen_s = time.perf_counter() - t0
    handles = share_node_data(data)
    del data, x, edge_index
    with open(handles_path, "wb") as f:
        pickle.dump(handles, f)
    filled = subprocess.run([sys.executable, fill_script, f"--_fill={handles_path}"], timeout=600)
    if filled.returncode != 0:
        handles.unlink()
        raise RuntimeError(f"filling the features failed (exit {filled.returncode})")
    return {
        "num_nodes": num_nodes,
        "num_edges": num_edges,
        "feature_gib": num_nodes * args.dim * 4 / 2**30,
        "dim": args.dim,
        "generate_s": gen_s,
        "share_and_fill_s": time.perf_counter() - t0 - gen_s,
    }


def fill_features(handles_path: str) -> None:
    """Random normal features, generated on the GPU (or CPU) and written into the shared table in place."""
    with open(handles_path, "rb") as f:
        handles = pickle.load(f)
    table = handles.features.open().data
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(1)
    rows = max(1, (1 << 28) // (4 * table.shape[1]))
    for start in range(0, table.shape[0], rows):
        n = min(rows, table.shape[0] - start)
        table[start : start + n].copy_(torch.randn(n, table.shape[1], device=dev, generator=gen))
