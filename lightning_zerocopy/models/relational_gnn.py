"""A relational GNN over PyG's ``HeteroData`` fields (``x_dict`` / ``edge_index_dict``): the net of
:class:`~lightning_zerocopy.models.HeteroNodeClassifier`.

:class:`HeteroGNN`: every layer runs one convolution per edge type ``(src, rel, dst)`` (``SAGEConv``, or ``GATConv``
as in R-GAT) and sums the messages each destination type receives; node types without features are embedded from
their global ids (``batch[type].n_id``) with an ``nn.Embedding``. Every weight has explicit input widths (no lazy
``-1`` parameters), so a checkpoint restores and DDP wraps materialised weights. Layer ``i`` only holds the
convolutions whose destination type still matters for the input type's logits ``L - 1 - i`` layers later, so every
parameter gets a gradient from the seeds' loss (no ``find_unused_parameters``) and no layer computes a type no later
layer reads. Given per-hop counts, each layer runs on the hops the remaining layers still need
(:func:`torch_geometric.utils.trim_to_layer` on ``num_sampled_nodes_dict`` / ``num_sampled_edges_dict``).
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GATConv, SAGEConv
from torch_geometric.utils import trim_to_layer

from lightning_zerocopy.models.layerwise import block_destination
from lightning_zerocopy.models.trim import hetero_counts_for_layers

__all__ = ["EdgeType", "HeteroGNN", "as_edge_type", "edge_type_key"]

EdgeType = tuple[str, str, str]
EdgeTypeLike = Union[str, Sequence[str]]


def as_edge_type(edge_type: EdgeTypeLike) -> EdgeType:
    """``(src, rel, dst)`` from a tuple/list of three names or PyG's string form ``"src__rel__dst"``.

    Raises:
        ValueError: not three non-empty names.
    """
    parts = edge_type.split("__") if isinstance(edge_type, str) else list(edge_type)
    if len(parts) != 3 or not all(isinstance(p, str) and p for p in parts):
        raise ValueError(f"{edge_type!r} is not an edge type: give (src, relation, dst) or 'src__relation__dst'")
    return parts[0], parts[1], parts[2]


def edge_type_key(edge_type: EdgeType) -> str:
    """PyG's string form of an edge type, ``"src__rel__dst"`` (a ``ModuleDict`` key, YAML, checkpoints)."""
    return "__".join(edge_type)


class HeteroGNN(nn.Module):
    """A relational GNN over PyG's ``x_dict`` / ``edge_index_dict``: per layer one conv per edge type, summed per
    destination type, ReLU and dropout; then a linear head on the input type.

    Args:
        node_types: every node type of the graph.
        edge_types: every edge type ``(src, rel, dst)`` (or ``"src__rel__dst"``).
        input_type: the node type whose logits come out.
        in_channels: feature width of each node type that has features.
        out_channels: number of classes.
        num_nodes: node count of each type (needed for the types without features: their embedding tables).
        hidden_channels: width of every layer.
        num_layers: message-passing layers.
        conv: ``"sage"`` (``SAGEConv``, root weight on) or ``"gat"`` (``GATConv`` with ``heads`` heads,
            concatenated, a residual projection of the destination, no self loops: R-GAT).
        heads: attention heads of ``"gat"`` (``hidden_channels`` must be a multiple).
        embedding_dim: width of the embeddings of featureless types (default ``hidden_channels``).
        dropout: dropout after every layer.
        aggr: neighbor aggregation of ``"sage"`` (``"mean"``, ``"sum"``, ``"max"``).

    Raises:
        ValueError: an edge type naming an unknown node type, an input type without incoming relations, a
            featureless type used by the layers without a node count, or ``hidden_channels % heads != 0``.
    """

    def __init__(
        self,
        node_types: Sequence[str],
        edge_types: Sequence[EdgeTypeLike],
        input_type: str,
        in_channels: Mapping[str, int],
        out_channels: int,
        num_nodes: Optional[Mapping[str, int]] = None,
        hidden_channels: int = 128,
        num_layers: int = 2,
        conv: Literal["sage", "gat"] = "sage",
        heads: int = 4,
        embedding_dim: Optional[int] = None,
        dropout: float = 0.5,
        aggr: str = "mean",
    ) -> None:
        super().__init__()
        self.node_types = [str(t) for t in node_types]
        self.edge_types = [as_edge_type(e) for e in edge_types]
        self.input_type = str(input_type)
        self.num_layers = int(num_layers)
        self.dropout = float(dropout)
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if conv not in ("sage", "gat"):
            raise ValueError(f"conv must be 'sage' or 'gat', got {conv!r}")
        if conv == "gat" and hidden_channels % heads:
            raise ValueError(f"conv='gat' concatenates {heads} heads: hidden_channels ({hidden_channels}) must be a multiple")
        known = set(self.node_types)
        if self.input_type not in known:
            raise ValueError(f"input type {self.input_type!r} is not a node type ({', '.join(self.node_types)})")
        for edge_type in self.edge_types:
            if edge_type[0] not in known or edge_type[2] not in known:
                raise ValueError(f"edge type {edge_type_key(edge_type)} names a node type that is not one of "
                                 f"{self.node_types}")  # fmt: skip
        unknown = set(in_channels) - known
        if unknown:
            raise ValueError(f"in_channels names {sorted(unknown)}, which are not node types ({', '.join(self.node_types)})")

        # which types each layer must output, from the last layer (the input type only) back to the first
        outputs: list[list[str]] = [[] for _ in range(self.num_layers)]
        relations: list[list[EdgeType]] = [[] for _ in range(self.num_layers)]
        wanted = [self.input_type]
        for layer in reversed(range(self.num_layers)):
            outputs[layer] = [t for t in self.node_types if t in wanted]
            relations[layer] = [e for e in self.edge_types if e[2] in wanted]
            wanted = sorted(set(wanted) | {e[0] for e in relations[layer]}, key=self.node_types.index)
        if not any(e[2] == self.input_type for e in self.edge_types):
            raise ValueError(f"no edge type ends at the input type {self.input_type!r}: it would receive no messages")
        self.input_types = wanted  # the types layer 0 reads
        self._used_edge_types = [e for e in self.edge_types if any(e in layer for layer in relations)]
        self.layer_outputs = outputs
        self.layer_relations = relations

        self.embeddings = nn.ModuleDict()
        width: dict[str, int] = {}
        for node_type in self.input_types:
            if node_type in in_channels:
                width[node_type] = int(in_channels[node_type])
                continue
            count = None if num_nodes is None else num_nodes.get(node_type)
            if count is None:
                raise ValueError(f"node type {node_type!r} has no features and no node count: pass num_nodes (or train "
                                 "with a DataModule that has num_nodes) so it can be embedded from n_id")  # fmt: skip
            width[node_type] = int(embedding_dim or hidden_channels)
            self.embeddings[node_type] = nn.Embedding(int(count), width[node_type])

        self.convs = nn.ModuleList()
        self.self_lins = nn.ModuleList()  # output types that no relation of the layer reaches keep their own state
        for layer in range(self.num_layers):
            convs = nn.ModuleDict()
            for src, rel, dst in relations[layer]:
                pair, key = (width[src], width[dst]), edge_type_key((src, rel, dst))
                if conv == "sage":
                    convs[key] = SAGEConv(pair, hidden_channels, aggr=aggr)
                else:
                    convs[key] = GATConv(pair, hidden_channels // heads, heads=heads, add_self_loops=False, residual=True)
            lonely = nn.ModuleDict()
            for node_type in outputs[layer]:
                if not any(e[2] == node_type for e in relations[layer]):
                    lonely[node_type] = nn.Linear(width[node_type], hidden_channels)
            self.convs.append(convs)
            self.self_lins.append(lonely)
            width = {t: hidden_channels for t in outputs[layer]}
        self.head = nn.Linear(hidden_channels, out_channels)

    def inputs(self, x_dict: Mapping[str, torch.Tensor], n_id_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Layer 0's input per type: the features where the type has them, else the embeddings of its ``n_id``."""
        out: dict[str, torch.Tensor] = {}
        for node_type in self.input_types:
            if node_type in self.embeddings:
                if node_type not in n_id_dict:
                    raise ValueError(f"node type {node_type!r} has no features, so the batch needs its n_id")
                out[node_type] = self.embeddings[node_type](n_id_dict[node_type])
            elif node_type in x_dict:
                out[node_type] = x_dict[node_type]
            else:
                raise ValueError(f"the batch has no x for node type {node_type!r}, which the model was built with features")
        return out

    def forward(
        self,
        x_dict: Mapping[str, torch.Tensor],
        edge_index_dict: Mapping[EdgeType, torch.Tensor],
        n_id_dict: Optional[Mapping[str, torch.Tensor]] = None,
        num_sampled_nodes_dict: Optional[Mapping[str, Sequence[int]]] = None,
        num_sampled_edges_dict: Optional[Mapping[EdgeType, Sequence[int]]] = None,
    ) -> torch.Tensor:
        """Logits of the input type's rows.

        Args:
            x_dict: features of the featured types (a batch's ``x_dict``).
            edge_index_dict: local edges per edge type (``batch.edge_index_dict``), messages row 0 → row 1.
            n_id_dict: global ids per type (``batch.n_id_dict``), for the embedded types.
            num_sampled_nodes_dict, num_sampled_edges_dict: per-hop counts (``batch.num_sampled_nodes_dict``,
                ``batch.num_sampled_edges_dict``); given, each layer is trimmed to the hops the remaining layers
                need, fewer rows come back, and the seeds' rows (the first) equal the untrimmed ones.
        """
        x = self.inputs(x_dict, n_id_dict or {})
        # the relations some layer runs (their endpoint types are all among the inputs); others are not even trimmed
        edges = {e: edge_index_dict[e] for e in self._used_edge_types if e in edge_index_dict}
        trim = num_sampled_nodes_dict is not None and num_sampled_edges_dict is not None
        if trim:
            cut = hetero_counts_for_layers(x, edges, num_sampled_nodes_dict, num_sampled_edges_dict, self.num_layers)
            x, edges, nodes, sampled = cut.x_dict, cut.edge_index_dict, cut.nodes_per_hop, cut.edges_per_hop
        for layer in range(self.num_layers):
            if trim:
                x, edges, _ = trim_to_layer(layer, nodes, sampled, x, edges)
            out: dict[str, torch.Tensor] = {}
            for key, conv in self.convs[layer].items():
                src, rel, dst = as_edge_type(key)
                index = edges.get((src, rel, dst))
                if index is None:  # a batch without this relation: its destinations get only the other relations
                    index = torch.empty(2, 0, dtype=torch.long, device=x[dst].device)
                message = conv((x[src], x[dst]), index)
                out[dst] = message if dst not in out else out[dst] + message
            for node_type, lin in self.self_lins[layer].items():
                out[node_type] = lin(x[node_type])
            x = {t: F.dropout(h.relu(), p=self.dropout, training=self.training) for t, h in out.items()}
        return self.head(x[self.input_type])

    def layerwise_layers(self) -> list[list[str]]:
        """Layer-wise predictions (:mod:`~lightning_zerocopy.models.layerwise`): the node types each layer outputs
        (the last: the input type, through the head)."""
        return [list(types) for types in self.layer_outputs]

    def layerwise_step(self, layer: int, block: Any) -> dict[str, torch.Tensor]:
        """Layer ``layer`` of :meth:`forward` for the rows of ``block``'s destination type (the store holding
        ``batch_size``): its relations into that type summed in the same order, ReLU, dropout; the last layer's rows
        through the head (the logits)."""
        dst = block_destination(block)
        x = {t: block[t].x for t in block.node_types if "x" in block[t]}
        if layer == 0:
            x = self.inputs(x, {t: block[t].n_id for t in block.node_types})
        out: Optional[torch.Tensor] = None
        for key, conv in self.convs[layer].items():
            edge_type = as_edge_type(key)
            if edge_type[2] != dst:
                continue
            index = block[edge_type].edge_index if edge_type in block.edge_types else None
            if index is None:
                index = torch.empty(2, 0, dtype=torch.long, device=x[dst].device)
            message = conv((x[edge_type[0]], x[dst]), index)
            out = message if out is None else out + message
        if dst in self.self_lins[layer]:
            out = self.self_lins[layer][dst](x[dst])
        if out is None:
            raise ValueError(f"layer {layer} of the HeteroGNN outputs no {dst!r} rows (it outputs {self.layer_outputs[layer]})")
        h = F.dropout(out.relu(), p=self.dropout, training=self.training)
        return {dst: self.head(h) if layer == self.num_layers - 1 else h}
