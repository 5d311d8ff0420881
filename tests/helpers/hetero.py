"""A tiny heterogeneous dataset built inline (papers with features and labels, authors without features, institutions
with features), a pure-Python reference of PyG's hetero neighbor sampling semantics for comparison, a model that
records the shapes the CLI links into it, a small HeteroConv model that trains, tests and predicts, and a dataset with
one fault of its content (for the command's one-line errors)."""

from __future__ import annotations

from typing import Optional

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch_geometric.nn import HeteroConv, SAGEConv

from lightning_zerocopy.datasets.hetero import EdgeType, HeteroNodeData, HeteroNodeDataset

PAPER, AUTHOR, INST = "paper", "author", "institution"
CITES: EdgeType = (PAPER, "cites", PAPER)
WRITES: EdgeType = (AUTHOR, "writes", PAPER)
WRITTEN_BY: EdgeType = (PAPER, "rev_writes", AUTHOR)
EMPLOYS: EdgeType = (INST, "employs", AUTHOR)
EDGE_TYPES = [CITES, WRITES, WRITTEN_BY, EMPLOYS]


def make_hetero_data(num_papers: int = 40, num_authors: int = 60, num_inst: int = 7, seed: int = 0,
                     num_classes: int = 3) -> HeteroNodeData:  # fmt: skip
    """Random typed edges (repeats and self-loops kept, as a dataset may have them); authors outnumber papers, so
    the id spaces of ``writes`` differ in size."""
    g = torch.Generator().manual_seed(seed)
    cites = torch.stack([torch.randint(0, num_papers, (160,), generator=g), torch.randint(0, num_papers, (160,), generator=g)])
    writes = torch.stack([torch.randint(0, num_authors, (120,), generator=g), torch.randint(0, num_papers, (120,), generator=g)])
    employs = torch.stack([torch.randint(0, num_inst, (num_authors,), generator=g), torch.arange(num_authors)])
    perm = torch.randperm(num_papers, generator=g)
    return HeteroNodeData(
        num_nodes={PAPER: num_papers, AUTHOR: num_authors, INST: num_inst},
        edge_index={CITES: cites, WRITES: writes, WRITTEN_BY: writes.flip(0).contiguous(), EMPLOYS: employs},
        x={PAPER: torch.randn(num_papers, 8, generator=g), INST: torch.randn(num_inst, 4, generator=g)},
        input_type=PAPER,
        y=torch.randint(0, num_classes, (num_papers,), generator=g),
        train_idx=perm[: num_papers // 2],
        val_idx=perm[num_papers // 2 : 3 * num_papers // 4],
        test_idx=perm[3 * num_papers // 4 :],
    )


class TinyHeteroDataset(HeteroNodeDataset):
    """:func:`make_hetero_data` behind the dataset interface (shape properties without loading)."""

    def __init__(self, seed: int = 0, num_classes: int = 3) -> None:
        self.seed, self._num_classes = seed, num_classes
        self._data: Optional[HeteroNodeData] = None

    @property
    def node_types(self) -> list[str]:
        return [PAPER, AUTHOR, INST]

    @property
    def edge_types(self) -> list[EdgeType]:
        return list(EDGE_TYPES)

    @property
    def num_nodes(self) -> dict[str, int]:
        return {PAPER: 40, AUTHOR: 60, INST: 7}

    @property
    def input_type(self) -> str:
        return PAPER

    @property
    def num_features(self) -> dict[str, int]:
        return {PAPER: 8, INST: 4}

    @property
    def num_classes(self) -> int:
        return self._num_classes

    def load(self) -> HeteroNodeData:
        if self._data is None:
            self._data = make_hetero_data(seed=self.seed, num_classes=self._num_classes)
        return self._data


def reference_hetero_sample(
    data: HeteroNodeData, seeds: list[int], fanouts: dict[EdgeType, list[int]], picks
) -> tuple[dict[str, list[int]], dict[EdgeType, set[tuple[int, int, int]]]]:
    """PyG's hetero sampling semantics in plain Python (pyg-lib's loop), with the picks given.

    ``picks(edge_type, hop, target_id)`` returns the edge ids (into ``data.edge_index[edge_type]``) that the target
    draws. Returns ``n_id`` per type (order of first appearance, seeds first) and per edge type the set of
    ``(local src, local dst, e_id)``.
    """
    n_id = {t: [] for t in data.num_nodes}
    local = {t: {} for t in data.num_nodes}
    for s in seeds:
        local[data.input_type][s] = len(n_id[data.input_type])
        n_id[data.input_type].append(s)
    frontier = {t: (0, len(n_id[t])) for t in data.num_nodes}
    edges: dict[EdgeType, set] = {et: set() for et in data.edge_index}
    hops = len(next(iter(fanouts.values())))
    for hop in range(hops):
        for et in data.edge_index:
            src, _, dst = et
            begin, end = frontier[dst]
            for target in n_id[dst][begin:end]:
                for e in picks(et, hop, target):
                    s = int(data.edge_index[et][0, e])
                    if s not in local[src]:
                        local[src][s] = len(n_id[src])
                        n_id[src].append(s)
                    edges[et].add((local[src][s], local[dst][target], int(e)))
        for t in data.num_nodes:
            frontier[t] = (frontier[t][1], len(n_id[t]))
    return n_id, edges


class HeteroShapeProbe(pl.LightningModule):
    """A model that only records the shapes the CLI links into it (``in_channels`` per featured type)."""

    def __init__(self, in_channels: dict[str, int], out_channels: int) -> None:
        super().__init__()
        self.save_hyperparameters()


class TinyHeteroSAGE(pl.LightningModule):
    """A HeteroConv of SAGEConvs (no to_hetero): featureless types embedded from n_id. ``test_step`` keeps each
    seed's logits by node id (``tested``); ``predict_step`` returns the logits of every sampled input-type node (the
    prediction writer keeps the seeds' rows)."""

    def __init__(self, metadata, num_features, num_nodes, num_classes, hidden: int = 16) -> None:
        super().__init__()
        node_types, edge_types = metadata
        self.inputs = torch.nn.ModuleDict({t: torch.nn.Linear(num_features[t], hidden) for t in num_features})
        self.embeddings = torch.nn.ModuleDict(
            {t: torch.nn.Embedding(num_nodes[t], hidden) for t in node_types if t not in num_features}
        )
        self.convs = torch.nn.ModuleList(
            HeteroConv({tuple(et): SAGEConv((hidden, hidden), hidden) for et in edge_types}, aggr="sum")
            for _ in range(2)
        )
        self.head = torch.nn.Linear(hidden, num_classes)
        self.tested: dict[int, torch.Tensor] = {}

    def forward(self, batch):
        x = {t: self.inputs[t](batch[t].x) if t in self.inputs else self.embeddings[t](batch[t].n_id)
             for t in batch.node_types}  # fmt: skip
        for conv in self.convs:
            out = conv(x, batch.edge_index_dict)
            x = {t: out[t].relu() if t in out else x[t] for t in x}
        return self.head(x[PAPER])

    def training_step(self, batch, batch_idx):
        size = batch[PAPER].batch_size
        loss = F.cross_entropy(self(batch)[:size], batch[PAPER].y[:size])
        self.log("train_loss", loss, batch_size=size)
        return loss

    def validation_step(self, batch, batch_idx):
        size = batch[PAPER].batch_size
        self.log("val_loss", F.cross_entropy(self(batch)[:size], batch[PAPER].y[:size]), batch_size=size)

    def test_step(self, batch, batch_idx):
        size = batch[PAPER].batch_size
        logits = self(batch)[:size]
        for node, row in zip(batch[PAPER].n_id[:size].tolist(), logits):
            self.tested[node] = row.detach().clone()

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0):
        return self(batch)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class HeteroLinear(pl.LightningModule):
    """The smallest trainable model the command builds with a heterogeneous DataModule: a linear classifier of the
    input type's features (``in_channels`` per featured type and ``out_channels`` are linked from the DataModule)."""

    def __init__(self, in_channels: dict[str, int], out_channels: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(in_channels[PAPER], out_channels)

    def forward(self, batch):
        """Logits of every sampled paper (Lightning's default ``predict_step`` returns them)."""
        return self.lin(batch[PAPER].x)

    def training_step(self, batch, batch_idx):
        size = batch[PAPER].batch_size
        return F.cross_entropy(self(batch)[:size], batch[PAPER].y[:size])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class FaultyHeteroDataset(TinyHeteroDataset):
    """The tiny graph with one fault (for the command's one-line errors):

    * ``"none"``: no fault;
    * ``"missing_type"``: an edge type ``venue__hosts__paper`` whose source type ``venue`` is no node type;
    * ``"bad_id"``: ``author__writes__paper`` holds the author id 60 (``author`` has 60 nodes);
    * ``"rows"``: ``paper`` has 39 feature rows for its 40 nodes.
    """

    def __init__(self, fault: str = "none") -> None:
        super().__init__()
        self.fault = fault

    @property
    def edge_types(self) -> list[EdgeType]:
        extra = [("venue", "hosts", PAPER)] if self.fault == "missing_type" else []
        return list(EDGE_TYPES) + extra

    def load(self) -> HeteroNodeData:
        data = make_hetero_data()
        fields = {name: getattr(data, name) for name in ("num_nodes", "edge_index", "x", "input_type", "y",
                                                         "train_idx", "val_idx", "test_idx")}  # fmt: skip
        if self.fault == "missing_type":
            fields["edge_index"][("venue", "hosts", PAPER)] = torch.zeros(2, 1, dtype=torch.int64)
        elif self.fault == "bad_id":
            fields["edge_index"][WRITES][0, 5] = 60
        elif self.fault == "rows":
            fields["x"][PAPER] = fields["x"][PAPER][:39]
        return HeteroNodeData(**fields)
