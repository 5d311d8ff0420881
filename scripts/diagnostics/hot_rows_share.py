"""What share of a batch's gathered rows a ``hot_rows`` cache would hold, on the CPU (no GPU needed).

``hot_rows`` caches the nodes that are most often some node's in-neighbor (``most_frequent_neighbors``). This draws a
``SyntheticGraph`` (the e2e benchmark's generator), ranks its nodes the same way, iterates the CPU loader's training
batches and counts how many of each batch's ``n_id`` rows (the rows the gather reads) fall in the top
``--fraction``; it also prints the share of neighbor slots those nodes fill.

    python3 scripts/diagnostics/hot_rows_share.py --num-nodes 2400000 --avg-degree 12 --fraction 0.2 --batches 21
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.graph.reorder import neighbor_counts


def hot_share(num_nodes: int, avg_degree: float, fraction: float, fanouts: list[int], batch_size: int,
              batches: int, cache_dir: str) -> dict[str, float]:  # fmt: skip
    """``slot_share`` (neighbor slots held by the hot nodes), ``row_share`` (gathered rows that are hot) and
    ``rows_per_batch`` over the first ``batches`` training batches."""
    dataset = SyntheticGraph(num_nodes=num_nodes, avg_degree=avg_degree, num_features=8, num_classes=8,
                             cache_dir=cache_dir)  # fmt: skip
    counts = neighbor_counts(dataset.load().edge_index[0], num_nodes)
    top = torch.topk(counts, max(1, int(fraction * num_nodes))).indices
    hot = torch.zeros(num_nodes, dtype=torch.bool)
    hot[top] = True
    dm = ZeroCopyDataModule(dataset, fanouts=fanouts, batch_size=batch_size)
    dm.setup("fit")
    hits = rows = seen = 0
    for seen, batch in enumerate(dm.train_dataloader(), start=1):
        hits += int(hot[batch.n_id].sum())
        rows += batch.n_id.numel()
        if seen == batches:
            break
    dm.teardown("fit")
    return {"slot_share": float(counts[top].sum() / counts.sum()), "row_share": hits / rows,
            "rows_per_batch": rows / seen}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-nodes", type=int, default=2_400_000)
    parser.add_argument("--avg-degree", type=float, default=12.0)
    parser.add_argument("--fraction", type=float, default=0.2, help="share of rows the cache holds")
    parser.add_argument("--fanouts", type=int, nargs="+", default=[15, 10, 5])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=21)
    parser.add_argument("--cache-dir", default=None, help="dataset cache root (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        share = hot_share(args.num_nodes, args.avg_degree, args.fraction, args.fanouts, args.batch_size, args.batches,
                          args.cache_dir or tmp)  # fmt: skip
    print(f"top {args.fraction:.0%} of nodes: {share['slot_share']:.1%} of neighbor slots, "
          f"{share['row_share']:.1%} of gathered rows ({share['rows_per_batch']:,.0f} rows a batch)")  # fmt: skip


if __name__ == "__main__":
    main()
