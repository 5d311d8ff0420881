"""Heterogeneous batches built by hand in the layout of PyG's ``NeighborLoader`` over a ``HeteroData`` (no sampler
library needed): a small MAG-shaped typed graph with planted paper classes, and a few-hop neighbor sample of it.

The layout (what PyG's hetero ``NeighborLoader`` yields, and ``ZeroCopyHeteroDataModule`` mirrors): per node type
``n_id`` (the seeds first for the input type, then each hop's new nodes), ``x`` for featured types,
``num_sampled_nodes`` (per hop, the seeds first); per edge type ``(src, rel, dst)`` ``edge_index`` in local ids
(messages row 0 → row 1), ``e_id`` and ``num_sampled_edges`` (per hop: hop ``k``'s edges point into the nodes added
at hop ``k - 1``); on the input type ``batch_size``, ``input_id`` and ``y`` of every sampled node of that type.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Mapping, Optional, Sequence, Union

import torch
from pytorch_lightning import LightningDataModule
from helpers import BatchList
from torch_geometric.data import HeteroData

EdgeType = tuple[str, str, str]

NODE_TYPES = ["paper", "author", "institution", "field_of_study"]
INPUT_TYPE = "paper"
FORWARD = [("author", "writes", "paper"), ("paper", "cites", "paper"), ("paper", "has_topic", "field_of_study"),
           ("author", "affiliated_with", "institution")]  # fmt: skip


def mag_like_graph(papers: int = 300, authors: int = 150, institutions: int = 12, fields: int = 20, classes: int = 4,
                   features: int = 8, signal: float = 1.0, seed: int = 0) -> SimpleNamespace:  # fmt: skip
    """A tiny ogbn-mag-shaped graph: features on papers only (noise plus ``signal`` on the class's coordinate),
    labels on papers; citations, authorship and topics mostly within a class; reverse edges named as PyG's
    ``ToUndirected`` names them (``rev_writes`` etc.; ``cites`` gets its reverse edges in the same type)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (papers,), generator=gen)
    x = torch.randn(papers, features, generator=gen)
    x[torch.arange(papers), y] += signal
    author_class = torch.randint(0, classes, (authors,), generator=gen)
    field_class = torch.arange(fields) % classes

    def within_class(count: int, src_class: torch.Tensor, dst_class: torch.Tensor) -> torch.Tensor:
        src = torch.randint(0, src_class.numel(), (count * 6,), generator=gen)
        dst = torch.randint(0, dst_class.numel(), (count * 6,), generator=gen)
        keep = src_class[src] == dst_class[dst]
        return torch.stack([src[keep], dst[keep]])[:, :count]

    cites = within_class(papers * 3, y, y)
    cites = cites[:, cites[0] != cites[1]]
    edges: dict[EdgeType, torch.Tensor] = {
        ("author", "writes", "paper"): within_class(papers * 2, author_class, y),
        ("paper", "cites", "paper"): torch.cat([cites, cites.flip(0)], dim=1),
        ("paper", "has_topic", "field_of_study"): within_class(papers, y, field_class),
        ("author", "affiliated_with", "institution"): torch.stack(
            [torch.arange(authors), torch.randint(0, institutions, (authors,), generator=gen)]),
    }
    for src, rel, dst in FORWARD:
        if src != dst:
            edges[(dst, f"rev_{rel}", src)] = edges[(src, rel, dst)].flip(0)
    num_nodes = {"paper": papers, "author": authors, "institution": institutions, "field_of_study": fields}
    return SimpleNamespace(x={"paper": x}, y=y, edge_index=edges, num_nodes=num_nodes, num_classes=classes,
                           num_features={"paper": features}, input_type=INPUT_TYPE, node_types=list(NODE_TYPES),
                           edge_types=list(edges))  # fmt: skip


def metadata(graph: SimpleNamespace) -> tuple[list[str], list[EdgeType]]:
    return list(graph.node_types), list(graph.edge_types)


def sample_batch(graph: SimpleNamespace, seeds: torch.Tensor, num_neighbors: Union[Sequence[int], Mapping[EdgeType, Sequence[int]]],
                 seed: int = 0) -> HeteroData:  # fmt: skip
    """A neighbor sample of ``seeds`` (``input_type`` ids) laid out as PyG's hetero ``NeighborLoader`` lays it out:
    without replacement, up to ``num_neighbors`` in-neighbors per edge type and hop (a list for every edge type, or a
    dict per edge type), directional, not disjoint."""
    gen = torch.Generator().manual_seed(seed)
    hops = len(next(iter(num_neighbors.values()))) if isinstance(num_neighbors, Mapping) else len(num_neighbors)
    into: dict[EdgeType, dict[int, list[tuple[int, int]]]] = {}
    for edge_type, index in graph.edge_index.items():
        table: dict[int, list[tuple[int, int]]] = {}
        for e, (s, d) in enumerate(index.t().tolist()):
            table.setdefault(d, []).append((s, e))
        into[edge_type] = table

    n_id: dict[str, list[int]] = {t: [] for t in graph.node_types}
    local: dict[str, dict[int, int]] = {t: {} for t in graph.node_types}
    for s in seeds.tolist():
        local[graph.input_type][s] = len(n_id[graph.input_type])
        n_id[graph.input_type].append(s)
    nodes_per_hop = {t: [len(n_id[t])] for t in graph.node_types}
    rows: dict[EdgeType, list[int]] = {e: [] for e in graph.edge_types}
    cols: dict[EdgeType, list[int]] = {e: [] for e in graph.edge_types}
    e_ids: dict[EdgeType, list[int]] = {e: [] for e in graph.edge_types}
    edges_per_hop: dict[EdgeType, list[int]] = {e: [] for e in graph.edge_types}
    frontier = {t: list(range(len(n_id[t]))) for t in graph.node_types}
    for hop in range(hops):
        added: dict[str, list[int]] = {t: [] for t in graph.node_types}
        for edge_type in graph.edge_types:
            src, _, dst = edge_type
            fanout = (num_neighbors[edge_type] if isinstance(num_neighbors, Mapping) else num_neighbors)[hop]
            before = len(rows[edge_type])
            for dst_local in frontier[dst]:
                candidates = into[edge_type].get(n_id[dst][dst_local], [])
                if 0 <= fanout < len(candidates):
                    pick = torch.randperm(len(candidates), generator=gen)[:fanout].tolist()
                    candidates = [candidates[i] for i in pick]
                for src_global, e in candidates:
                    if src_global not in local[src]:
                        local[src][src_global] = len(n_id[src])
                        n_id[src].append(src_global)
                        added[src].append(local[src][src_global])
                    rows[edge_type].append(local[src][src_global])
                    cols[edge_type].append(dst_local)
                    e_ids[edge_type].append(e)
            edges_per_hop[edge_type].append(len(rows[edge_type]) - before)
        for t in graph.node_types:
            nodes_per_hop[t].append(len(added[t]))
        frontier = added

    batch = HeteroData()
    for t in graph.node_types:
        ids = torch.tensor(n_id[t], dtype=torch.long)
        batch[t].n_id = ids
        batch[t].num_sampled_nodes = nodes_per_hop[t]
        if t in graph.x:
            batch[t].x = graph.x[t][ids]
    for e in graph.edge_types:
        batch[e].edge_index = torch.tensor([rows[e], cols[e]], dtype=torch.long).view(2, -1)
        batch[e].e_id = torch.tensor(e_ids[e], dtype=torch.long)
        batch[e].num_sampled_edges = edges_per_hop[e]
    inputs = batch[graph.input_type]
    inputs.y = graph.y[inputs.n_id]
    inputs.input_id = torch.arange(seeds.numel())
    inputs.batch_size = seeds.numel()
    return batch


def batches(graph: SimpleNamespace, ids: torch.Tensor, batch_size: int, num_neighbors: Union[Sequence[int], Mapping],
            seed: int = 0) -> BatchList:  # fmt: skip
    """``ids`` in order, ``batch_size`` seeds a batch, each sampled with :func:`sample_batch`."""
    return BatchList([sample_batch(graph, ids[i : i + batch_size], num_neighbors, seed=seed + i)
                      for i in range(0, ids.numel(), batch_size)])  # fmt: skip


class HandBuiltHeteroDataModule(LightningDataModule):
    """A heterogeneous DataModule over :func:`mag_like_graph` with hand-sampled batches, exposing what
    ``ZeroCopyHeteroDataModule`` exposes (``metadata``, ``num_features``, ``num_nodes``, ``num_classes``,
    ``input_type``): for the CLI and model tests, before the real one exists in this checkout.

    Args:
        papers: papers of the graph (60 % train, 20 % val, 20 % test).
        batch_size: seed papers per batch.
        num_neighbors: fanouts per hop (every edge type).
    """

    def __init__(self, papers: int = 300, batch_size: int = 20, num_neighbors: Optional[list[int]] = None) -> None:
        super().__init__()
        self.graph = mag_like_graph(papers=papers, authors=papers // 2)
        self.batch_size = batch_size
        self.num_neighbors = list(num_neighbors or [4, 3])
        perm = torch.randperm(papers, generator=torch.Generator().manual_seed(0))
        cut = (papers * 6 // 10, papers * 8 // 10)
        self.ids = {"train": perm[: cut[0]], "val": perm[cut[0] : cut[1]], "test": perm[cut[1] :]}

    @property
    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        return metadata(self.graph)

    @property
    def num_features(self) -> dict[str, int]:
        return dict(self.graph.num_features)

    @property
    def num_nodes(self) -> dict[str, int]:
        return dict(self.graph.num_nodes)

    @property
    def num_classes(self) -> int:
        return int(self.graph.num_classes)

    @property
    def input_type(self) -> str:
        return self.graph.input_type

    def _loader(self, split: str) -> BatchList:
        return batches(self.graph, self.ids[split], self.batch_size, self.num_neighbors, seed=len(split))

    def train_dataloader(self) -> BatchList:
        return self._loader("train")

    def val_dataloader(self) -> BatchList:
        return self._loader("val")

    def test_dataloader(self) -> BatchList:
        return self._loader("test")

    def predict_dataloader(self) -> BatchList:
        return self._loader("test")
