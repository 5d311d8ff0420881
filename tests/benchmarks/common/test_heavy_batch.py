"""benchmarks.common.heavy_batch: the heavy model's batch shape in NeighborLoader's layout, drawn the same every time."""

from __future__ import annotations

import torch

from benchmarks.common.heavy_batch import CLASSES, FANOUTS, SEEDS, heavy_batch


def test_the_batch_has_the_heavy_shape_in_neighbor_loaders_layout() -> None:
    batch = heavy_batch(0, "cpu")
    nodes, edges = batch["nodes"], batch["edges"]
    assert nodes[0] == SEEDS and len(nodes) == len(FANOUTS) + 1 and sum(nodes) == batch["x"].shape[0]
    assert edges == [n * f for n, f in zip(nodes, FANOUTS)]
    src, dst = batch["edge_index"]
    first = slice(0, edges[0])  # hop 1's edges go into the seeds, from nodes of hops <= 1
    assert int(dst[first].max()) < SEEDS and int(src[first].max()) < nodes[0] + nodes[1]
    assert torch.equal(heavy_batch(0, "cpu")["x"], batch["x"])  # drawn from a fixed seed


def test_the_labels_are_the_same_for_a_seed_and_differ_across_seeds() -> None:
    y = heavy_batch(0, "cpu")["y"]
    assert y.shape == (SEEDS,) and 0 <= int(y.min()) and int(y.max()) < CLASSES
    assert torch.equal(heavy_batch(0, "cpu")["y"], y) and not torch.equal(heavy_batch(1, "cpu")["y"], y)
