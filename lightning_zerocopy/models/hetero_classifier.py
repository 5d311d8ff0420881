"""Node classification on a heterogeneous graph (PyG ``HeteroData`` batches), as a LightningModule.

:class:`HeteroGNN` is a relational GNN: every layer runs one convolution per edge type ``(src, rel, dst)``
(``SAGEConv``, or ``GATConv`` as in R-GAT) and sums the messages each destination type receives; node types without
features are embedded from their global ids (``batch[type].n_id``) with an ``nn.Embedding``. Every weight has
explicit input widths (no lazy ``-1`` parameters), so a checkpoint restores and DDP wraps materialised weights. Layer
``i`` only holds the convolutions whose destination type still matters for the input type's logits ``L - 1 - i``
layers later, so every parameter gets a gradient from the seeds' loss (no ``find_unused_parameters``) and no
layer computes a type no later layer reads.

:class:`HeteroNodeClassifier` trains it as :class:`~lightning_zerocopy.models.NodeClassifier` trains a homogeneous
net: cross-entropy on the seeds ``batch[input_type].y[:batch_size]``, ``train_acc_step``/``train_acc_epoch``/
``train_loss``/``val_acc``/``val_loss``/``test_acc`` logged the same way, ``predict_step`` giving the seeds' ids and
logits. With ``trim=True`` each layer runs on the hops the remaining layers still need
(:func:`torch_geometric.utils.trim_to_layer` on ``num_sampled_nodes_dict`` / ``num_sampled_edges_dict``).

Where the graph's shape comes from: ``in_channels`` (features per featured type) and ``out_channels`` are init
arguments (the CLI links them from ``data.num_features`` / ``data.num_classes``); node types, edge types, node counts
and the input type are either init arguments too (``node_types``, ``edge_types``, ``num_nodes``, ``input_type``: the
module then works outside a trainer) or are read in :meth:`HeteroNodeClassifier.configure_model` from the trainer's
DataModule (``metadata``, ``num_nodes``, ``input_type``). Lightning calls ``configure_model`` after the DataModule's
``setup`` and before it restores a checkpoint, moves the module to its device or wraps it in DDP. Once built, the
shape is kept in the hyperparameters, so ``load_from_checkpoint`` rebuilds the layers before loading the weights; a
module built without a shape and handed a checkpoint builds itself from the checkpoint's in ``on_load_checkpoint``.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from pytorch_lightning.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torch_geometric.nn import GATConv, SAGEConv
from torch_geometric.utils import trim_to_layer

from lightning_zerocopy.models.seed_classifier import SeedClassifier
from lightning_zerocopy.models.trim import hetero_counts_for_layers

__all__ = ["HeteroGNN", "HeteroNodeClassifier"]

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


def _key(edge_type: EdgeType) -> str:
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
                raise ValueError(f"edge type {_key(edge_type)} names a node type that is not one of {self.node_types}")
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
                pair = (width[src], width[dst])
                if conv == "sage":
                    convs[_key((src, rel, dst))] = SAGEConv(pair, hidden_channels, aggr=aggr)
                else:
                    convs[_key((src, rel, dst))] = GATConv(pair, hidden_channels // heads, heads=heads, add_self_loops=False,
                                                           residual=True)  # fmt: skip
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
        dst = next(t for t in block.node_types if "batch_size" in block[t])
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


def _has_shape(datamodule: Any) -> bool:
    return all(hasattr(datamodule, n) for n in ("metadata", "num_nodes", "input_type"))


def _datamodule_shape(datamodule: Any) -> dict[str, Any]:
    """``node_types``, ``edge_types``, ``num_nodes``, ``input_type`` of a hetero DataModule (``metadata`` a
    property or a method, as PyG's ``HeteroData.metadata()``)."""
    missing = [n for n in ("metadata", "num_nodes", "input_type") if not hasattr(datamodule, n)]
    if missing:
        raise ValueError(f"HeteroNodeClassifier needs the graph's shape: the DataModule {type(datamodule).__name__} has "
                         f"no {', '.join(missing)}; use a heterogeneous DataModule (ZeroCopyHeteroDataModule) or pass "
                         "node_types, edge_types, num_nodes and input_type to the model")  # fmt: skip
    metadata = datamodule.metadata
    node_types, edge_types = metadata() if callable(metadata) else metadata
    num_nodes = datamodule.num_nodes
    return {
        "node_types": [str(t) for t in node_types],
        "edge_types": [_key(as_edge_type(e)) for e in edge_types],
        "num_nodes": {str(k): int(v) for k, v in (num_nodes() if callable(num_nodes) else num_nodes).items()},
        "input_type": str(datamodule.input_type),
    }


class HeteroNodeClassifier(SeedClassifier):
    """Cross-entropy training of :class:`HeteroGNN` on the input type's seed nodes of each ``HeteroData`` batch.

    Args:
        in_channels: feature width per featured node type (linked from ``data.num_features`` by the CLI).
        out_channels: number of classes (linked from ``data.num_classes``).
        hidden_channels: width of every layer.
        num_layers: message-passing layers (usually the number of sampled hops).
        conv: ``"sage"`` or ``"gat"`` (R-GAT: a ``GATConv`` per relation).
        heads: attention heads of ``"gat"``.
        embedding_dim: width of the ``n_id`` embeddings of featureless types (default ``hidden_channels``).
        dropout: dropout after every layer.
        aggr: neighbor aggregation of ``"sage"``.
        node_types, edge_types, num_nodes, input_type: the graph's shape (edge types as ``"src__rel__dst"`` or
            ``(src, rel, dst)``). Leave them out to read them from the trainer's DataModule in
            :meth:`configure_model`; give all of them to build the layers here (outside a trainer, or to
            ``load_from_checkpoint``, which passes the saved ones).
        optimizer: builds the optimizer from the parameters (YAML ``class_path: torch.optim.Adam``).
        lr_scheduler: optional LR scheduler factory, stepped every epoch.
        lr_scheduler_monitor: the metric a ``ReduceLROnPlateau`` scheduler watches.
        trim: run each layer on the hops the remaining layers still need (from ``num_sampled_nodes_dict`` /
            ``num_sampled_edges_dict``); batches without them run untrimmed.

    Raises:
        ValueError: only some of ``node_types``, ``edge_types``, ``input_type`` given.
    """

    def __init__(
        self,
        in_channels: dict[str, int],
        out_channels: int,
        hidden_channels: int = 128,
        num_layers: int = 2,
        conv: Literal["sage", "gat"] = "sage",
        heads: int = 4,
        embedding_dim: Optional[int] = None,
        dropout: float = 0.5,
        aggr: str = "mean",
        node_types: Optional[list[str]] = None,
        edge_types: Optional[list[Union[str, tuple[str, str, str]]]] = None,
        num_nodes: Optional[dict[str, int]] = None,
        input_type: Optional[str] = None,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: Optional[LRSchedulerCallable] = None,
        lr_scheduler_monitor: str = "val_acc",
        trim: bool = True,
    ) -> None:
        super().__init__()
        if edge_types is not None:
            edge_types = [_key(as_edge_type(e)) for e in edge_types]  # saved as strings: YAML and checkpoints
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.trim = bool(trim)
        self.net: Optional[HeteroGNN] = None
        self._init_seed_classification(out_channels, optimizer, lr_scheduler, lr_scheduler_monitor)
        given = {"node_types": node_types, "edge_types": edge_types, "input_type": input_type}
        if any(v is not None for v in given.values()):
            if any(v is None for v in given.values()):
                raise ValueError(f"give all of node_types, edge_types and input_type, or none (to read them from the "
                                 f"DataModule); missing: {', '.join(k for k, v in given.items() if v is None)}")  # fmt: skip
            self._build(dict(given, num_nodes=num_nodes))

    @property
    def input_type(self) -> str:
        """The node type whose seeds are classified (once the layers are built)."""
        return self._require_net().input_type

    def _require_net(self) -> HeteroGNN:
        if self.net is None:
            raise RuntimeError("HeteroNodeClassifier has no layers yet: train it with a DataModule that has metadata, "
                               "num_nodes and input_type, or pass node_types, edge_types, num_nodes and input_type")  # fmt: skip
        return self.net

    def _build(self, shape: Mapping[str, Any]) -> None:
        hp = self.hparams
        self.net = HeteroGNN(shape["node_types"], shape["edge_types"], shape["input_type"], hp.in_channels,
                             hp.out_channels, shape.get("num_nodes"), hidden_channels=hp.hidden_channels,
                             num_layers=hp.num_layers, conv=hp.conv, heads=hp.heads, embedding_dim=hp.embedding_dim,
                             dropout=hp.dropout, aggr=hp.aggr)  # fmt: skip
        # kept in the hyperparameters: checkpoints carry the shape, load_from_checkpoint rebuilds from it
        self.hparams.update({k: shape[k] for k in ("node_types", "edge_types", "input_type")})
        self.hparams["num_nodes"] = None if shape.get("num_nodes") is None else dict(shape["num_nodes"])

    def configure_model(self) -> None:
        """Builds the layers from the trainer's DataModule (``metadata``, ``num_nodes``, ``input_type``) unless the
        shape was given; with both, checks that they agree. A given shape needs nothing of the DataModule (PyG's
        ``LightningNodeData`` and other DataModules without these attributes train it).

        Without a DataModule and without a shape nothing is built here: a checkpoint being restored builds the layers
        (:meth:`on_load_checkpoint`), else the first forward or ``configure_optimizers`` says what is missing.

        Raises:
            ValueError: no shape given and a DataModule without ``metadata``/``num_nodes``/``input_type``, or a
                DataModule of another graph.
        """
        trainer = self._trainer
        datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
        if datamodule is None:  # a checkpoint may still bring the shape (on_load_checkpoint, which comes next)
            return
        if self.net is not None and not _has_shape(datamodule):  # e.g. PyG's LightningNodeData: nothing to check
            return
        shape = _datamodule_shape(datamodule)
        if self.net is None:
            self._build(shape)
            return
        mine = {"node_types": self.net.node_types, "edge_types": [_key(e) for e in self.net.edge_types],
                "input_type": self.net.input_type}  # fmt: skip
        for name, value in mine.items():
            theirs = shape[name]
            if (sorted(value) != sorted(theirs)) if isinstance(value, list) else value != theirs:
                raise ValueError(f"the model was built for {name}={value} but the DataModule has {name}={theirs}: "
                                 "a checkpoint or model of another graph")  # fmt: skip

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A module handed a checkpoint before it has layers (a new Trainer with ``ckpt_path`` and no DataModule)
        builds them from the checkpoint's saved shape."""
        if self.net is not None:
            return
        saved = checkpoint.get("hyper_parameters", {})
        if saved.get("node_types") is None:
            raise ValueError("the checkpoint has no graph shape (node_types, edge_types, input_type) and the model "
                             "has no layers to load its weights into")  # fmt: skip
        self._build(saved)

    def forward(self, batch: Any) -> torch.Tensor:
        """Logits of the input type's rows of a ``HeteroData`` batch (the seeds first); trimmed, only the rows the
        layers still compute come back (at least the seeds)."""
        net = self._require_net()
        n_id = {t: batch[t].n_id for t in net.input_types if "n_id" in batch[t]}
        x = {t: batch[t].x for t in net.input_types if "x" in batch[t]}
        counts = {}
        if self.trim:
            nodes = {t: batch[t].num_sampled_nodes for t in batch.node_types if "num_sampled_nodes" in batch[t]}
            edges = {e: batch[e].num_sampled_edges for e in batch.edge_types if "num_sampled_edges" in batch[e]}
            if nodes and edges:
                counts = {"num_sampled_nodes_dict": nodes, "num_sampled_edges_dict": edges}
        return net(x, batch.edge_index_dict, n_id, **counts)

    def layerwise_layers(self) -> list[list[str]]:
        """Layer-wise predictions: :meth:`HeteroGNN.layerwise_layers`."""
        return self._require_net().layerwise_layers()

    def layerwise_step(self, layer: int, block: Any) -> dict[str, torch.Tensor]:
        """:meth:`HeteroGNN.layerwise_step`."""
        return self._require_net().layerwise_step(layer, block)

    def _seed_store(self, batch: Any) -> Any:
        """The input type's store."""
        return batch[self.input_type]

    def _logits(self, batch: Any) -> torch.Tensor:
        return self(batch)

    def configure_optimizers(self) -> Any:
        self._require_net()  # a clear message rather than "optimizer got an empty parameter list"
        return super().configure_optimizers()
