"""Link batches built by hand in PyG ``LinkNeighborLoader``'s layout, for the model tests (no sampler needed):
a planted-class graph whose edges stay inside a class, and binary / triplet / evaluation batches over it; each also as
the one-type ``HeteroData`` batch PyG's hetero ``LinkNeighborLoader`` would make of it (:func:`as_typed`)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch_geometric.data import Data, HeteroData


def planted_graph(num_nodes: int = 240, classes: int = 4, edges: int = 2400, seed: int = 0) -> SimpleNamespace:
    """Nodes in planted classes, features = class signal + noise, edges only within a class."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (num_nodes,), generator=gen)
    x = torch.randn(num_nodes, 8, generator=gen) * 0.5
    x[torch.arange(num_nodes), y] += 1.0
    src = torch.randint(0, num_nodes, (edges * 4,), generator=gen)
    dst = torch.randint(0, num_nodes, (edges * 4,), generator=gen)
    keep = (y[src] == y[dst]) & (src != dst)
    edge_index = torch.stack([src[keep], dst[keep]])[:, :edges]
    return SimpleNamespace(x=x, y=y, edge_index=edge_index, num_nodes=num_nodes, gen=gen)


def link_batch(g: SimpleNamespace, pos: torch.Tensor, neg: torch.Tensor, mode: str = "binary", query: bool = False) -> Data:
    """A batch laid out as PyG's LinkNeighborLoader lays it out: seeds (the unique endpoints) first, the whole graph
    as their 'sampled' neighborhood, label edges in local ids."""
    seeds = torch.unique(torch.cat([pos.flatten(), neg.flatten()]))
    rest = torch.ones(g.num_nodes, dtype=torch.bool)
    rest[seeds] = False
    n_id = torch.cat([seeds, rest.nonzero().flatten()])
    local = torch.empty(g.num_nodes, dtype=torch.long)
    local[n_id] = torch.arange(g.num_nodes)
    batch = Data(x=g.x[n_id], edge_index=local[g.edge_index], n_id=n_id, e_id=torch.arange(g.edge_index.size(1)),
                 input_id=torch.arange(pos.size(1)), num_sampled_nodes=[seeds.numel(), g.num_nodes - seeds.numel()],
                 num_sampled_edges=[g.edge_index.size(1)], batch_size=pos.size(1))  # fmt: skip
    if mode == "binary":
        batch.edge_label_index = local[torch.cat([pos, neg], dim=1)]
        batch.edge_label = torch.cat([torch.ones(pos.size(1)), torch.zeros(neg.size(1))])
        if query:  # K negatives per positive, grouped: negatives i*K .. (i+1)*K-1 belong to positive i
            k = neg.size(1) // pos.size(1)
            batch.edge_label_query = torch.cat([torch.arange(pos.size(1)), torch.arange(pos.size(1)).repeat_interleave(k)])
    else:
        batch.src_index, batch.dst_pos_index = local[pos[0]], local[pos[1]]
        batch.dst_neg_index = local[neg].view(pos.size(1), -1) if neg.dim() == 2 else local[neg]
    return batch


#: the node type and edge type of :func:`as_typed`'s batches
NODE, EDGE = "node", ("node", "to", "node")
#: ``HeteroLinkPredictor``'s ``metadata`` / ``num_features`` of them (8 features, as :func:`planted_graph`'s)
TYPED_METADATA, TYPED_FEATURES = (["node"], [EDGE]), {"node": 8}


def as_typed(batch: Data) -> HeteroData:
    """``batch`` as a heterogeneous link batch of one node type ``NODE`` and one edge type ``EDGE``, laid out as PyG's
    hetero ``LinkNeighborLoader`` lays it out: node fields on the node type, edges and the label fields
    (``edge_label_index``, ``edge_label``, ``edge_label_query``, ``input_id``, ``batch_size``) on the edge type,
    ``src_index`` on the source type and ``dst_pos_index`` / ``dst_neg_index`` on the destination type."""
    typed = HeteroData()
    for key in ("x", "n_id", "num_sampled_nodes"):
        typed[NODE][key] = batch[key]
    for key in ("edge_index", "e_id", "num_sampled_edges", "edge_label_index", "edge_label", "edge_label_query",
                "input_id", "batch_size"):  # fmt: skip
        if key in batch:
            typed[EDGE][key] = batch[key]
    for key in ("src_index", "dst_pos_index", "dst_neg_index"):
        if key in batch:
            typed[NODE][key] = batch[key]
    return typed


def random_negatives(g: SimpleNamespace, src: torch.Tensor, per: int) -> torch.Tensor:
    return torch.stack([src.repeat_interleave(per), torch.randint(0, g.num_nodes, (src.numel() * per,), generator=g.gen)])


def train_batches(g: SimpleNamespace, steps: int, size: int, mode: str) -> list[Data]:
    out = []
    for _ in range(steps):
        pos = g.edge_index[:, torch.randint(0, g.edge_index.size(1), (size,), generator=g.gen)]
        if mode == "binary":
            out.append(link_batch(g, pos, random_negatives(g, pos[0], 1)))
        else:
            out.append(link_batch(g, pos, torch.randint(0, g.num_nodes, (size, 2), generator=g.gen), mode="triplet"))
    return out


def eval_batches(g: SimpleNamespace, size: int, k: int, query: bool) -> list[Data]:
    pos = g.edge_index[:, torch.randperm(g.edge_index.size(1), generator=g.gen)[: size * 2]]
    return [link_batch(g, p, random_negatives(g, p[0], k), query=query) for p in pos.split(size, dim=1)]
