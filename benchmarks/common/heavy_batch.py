"""One synthetic batch of the heavy model's shape, for measurements that need the model's arithmetic but no graph.

1024 seeds, fanouts [15, 10, 5] (each hop's new nodes 0.8 x its picks), 100 features, 47 classes, in NeighborLoader's
layout: nodes and edges by hop, hop k's edges from nodes of hops <= k into hop k-1's nodes, with the per-hop counts
the heavy GraphSAGE trims by. Labels are planted (from the seeds' features and their hop-1 neighbors' mean), so a
right model learns them within a few dozen steps and a wrong one stays at ln 47. Drawn on the CPU from ``seed``, so
every process and device sees the same bytes.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CLASSES", "FANOUTS", "FEATURES", "HIDDEN", "SEEDS", "heavy_batch", "heavy_train_step"]

SEEDS, FANOUTS, FEATURES, CLASSES, HIDDEN = 1024, (15, 10, 5), 100, 47, 256


def heavy_batch(seed: int = 0, device: Any = "cpu") -> dict[str, Any]:
    """``x``, ``edge_index``, ``y`` (the seeds' planted labels) on ``device``; ``nodes`` / ``edges``: per-hop counts."""
    g = torch.Generator().manual_seed(seed)
    nodes = [SEEDS]
    for f in FANOUTS:
        nodes.append(int(nodes[-1] * f * 0.8))  # some neighbors repeat
    starts = [sum(nodes[:k]) for k in range(len(nodes) + 1)]
    edges = []
    for k, f in enumerate(FANOUTS, start=1):
        dst = torch.arange(starts[k - 1], starts[k]).repeat_interleave(f)
        src = torch.randint(0, starts[k + 1], (dst.numel(),), generator=g)
        edges.append(torch.stack([src, dst]))
    x = torch.randn(starts[-1], FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(12345))
    first = edges[0]
    agg = torch.zeros(SEEDS, FEATURES).index_add_(0, first[1], x[first[0]]) / FANOUTS[0]
    y = ((x[:SEEDS] + agg) @ w).argmax(dim=1)
    return {"x": x.to(device), "edge_index": torch.cat(edges, dim=1).to(device), "y": y.to(device), "nodes": nodes,
            "edges": [e.shape[1] for e in edges]}  # fmt: skip


def heavy_train_step(model: Any, opt: Any, batch: dict[str, Any], autocast: Any) -> None:
    """One training step of the heavy GraphSAGE on ``batch`` (a :func:`heavy_batch` dict): the forward under
    ``autocast`` (a ``torch.autocast``), trimmed by the per-hop counts, cross-entropy on the seeds, backward and
    ``opt.step()``; nothing synchronizes."""
    import torch.nn.functional as F

    with autocast:
        out = model(batch["x"], batch["edge_index"], num_sampled_nodes_per_hop=batch["nodes"],
                    num_sampled_edges_per_hop=batch["edges"])[:SEEDS]  # fmt: skip
        loss = F.cross_entropy(out.float(), batch["y"])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
