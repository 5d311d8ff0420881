"""The node-classification LightningModules: :class:`NodeClassifier`, written the way PyG's Lightning examples
are, and :class:`HeteroNodeClassifier`, the same on ``HeteroData`` batches (the net:
:class:`~lightning_zerocopy.models.relational_gnn.HeteroGNN`). Their steps are
:class:`~lightning_zerocopy.models.seed_classifier.SeedClassifier`'s; only where the seeds stand and how the logits
are computed differ.

``training_step`` runs the GNN on the sampled subgraph and keeps the first ``batch.batch_size`` rows (the
seed nodes; on a typed batch those of ``batch[input_type]``), exactly as with PyG's ``NeighborLoader``; nothing here
knows about lightning-zerocopy's DataModule. Optimizer and LR scheduler are typed init arguments, so a LightningCLI
recipe picks them with ``class_path``/``init_args``.

Training figures never synchronize a step with the GPU: loss and accuracy are summed on the device
(:class:`~lightning_zerocopy.models.seed_accuracy.SeedAccuracy`) and read back only on the steps
:func:`~lightning_zerocopy.step_logging.is_log_step` names (every ``trainer.log_every_n_steps`` and an epoch's last
batch): ``train_loss`` and ``train_acc_step`` are the means over the steps since the previous hand-over, logged
as CPU tensors for the progress bar and the loggers; ``train_acc_epoch`` is the epoch's exact accuracy (summed
over ranks under DDP).

Where a typed graph's shape comes from: ``in_channels`` (features per featured type) and ``out_channels`` are init
arguments (the CLI links them from ``data.num_features`` / ``data.num_classes``); node types, edge types, node counts
and the input type are either init arguments too (``node_types``, ``edge_types``, ``num_nodes``, ``input_type``: the
module then works outside a trainer) or are read in :meth:`HeteroNodeClassifier.configure_model` from the trainer's
DataModule (``metadata``, ``num_nodes``, ``input_type``). Lightning calls ``configure_model`` after the DataModule's
``setup`` and before it restores a checkpoint, moves the module to its device or wraps it in DDP. Once built, the
shape is kept in the hyperparameters, so ``load_from_checkpoint`` rebuilds the layers before loading the weights; a
module built without a shape and handed a checkpoint builds itself from the checkpoint's in ``on_load_checkpoint``.
With ``trim=True`` each layer runs on the hops the remaining layers still need.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Union

import torch
from pytorch_lightning.cli import LRSchedulerCallable, OptimizerCallable
from pytorch_lightning.utilities import rank_zero_warn
from torch import nn

from lightning_zerocopy.models.layerwise import LayerwiseByBasicGNN
from lightning_zerocopy.models.relational_gnn import HeteroGNN, as_edge_type, edge_type_key
from lightning_zerocopy.models.seed_classifier import SeedClassifier
from lightning_zerocopy.models.trim import batch_hop_counts, can_trim

__all__ = ["HeteroNodeClassifier", "NodeClassifier"]


class NodeClassifier(LayerwiseByBasicGNN, SeedClassifier):
    """Cross-entropy training of ``net(x, edge_index)`` on the seed nodes of each mini-batch.

    Subclasses build ``net`` (any module taking ``(x, edge_index)`` and returning per-node logits).

    Args:
        net: the GNN.
        out_channels: number of classes.
        optimizer: builds the optimizer from the parameters (YAML: ``class_path: torch.optim.Adam``).
        lr_scheduler: optional, builds a scheduler from the optimizer (YAML: ``class_path:
            torch.optim.lr_scheduler.StepLR``); stepped every epoch.
        lr_scheduler_monitor: the metric a ``ReduceLROnPlateau`` scheduler watches.
        trim: run each layer on the nodes and edges the remaining layers still need, from the batch's
            ``num_sampled_nodes`` / ``num_sampled_edges`` (:mod:`lightning_zerocopy.models.trim`); batches
            without them run untrimmed. ``net`` must take ``num_sampled_nodes_per_hop`` and
            ``num_sampled_edges_per_hop`` (as PyG's ``BasicGNN`` models do) and have ``num_layers``.
        compile: ``torch.compile`` the net (``dynamic=True``: batch sizes vary every step); the parameters and
            checkpoints are the net's own.

    Raises:
        ValueError: ``trim=True`` with a ``net`` that cannot trim.
    """

    def __init__(
        self,
        net: nn.Module,
        out_channels: int,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: Optional[LRSchedulerCallable] = None,
        lr_scheduler_monitor: str = "val_acc",
        trim: bool = False,
        compile: bool = False,
    ) -> None:
        super().__init__()
        if trim and not can_trim(net):
            raise ValueError(
                f"trim=True needs a net with an int `num_layers` whose forward takes `num_sampled_nodes_per_hop` and "
                f"`num_sampled_edges_per_hop` (PyG's BasicGNN models do); {type(net).__name__} does not: set trim=False"
            )
        self.net = net
        self.trim = bool(trim)
        if compile:  # in place: state_dict keys stay the net's own (no `_orig_mod.`)
            self.net.compile(dynamic=True)
        self._init_seed_classification(out_channels, optimizer, lr_scheduler, lr_scheduler_monitor)
        self._warned_hops = False

    def forward(
        self,
        x: torch.Tensor,
        edge_index: torch.Tensor,
        num_sampled_nodes_per_hop: Optional[list[int]] = None,
        num_sampled_edges_per_hop: Optional[list[int]] = None,
    ) -> torch.Tensor:
        """Per-node logits. With per-hop counts (``num_layers`` hops, see
        :func:`~lightning_zerocopy.models.trim.counts_for_layers`) each layer is trimmed as by PyG's
        ``trim_to_layer``: fewer rows come back, and only the seeds' rows equal the untrimmed output."""
        if num_sampled_nodes_per_hop is None:
            return self.net(x, edge_index)
        return self.net(x, edge_index, num_sampled_nodes_per_hop=num_sampled_nodes_per_hop,
                        num_sampled_edges_per_hop=num_sampled_edges_per_hop)  # fmt: skip

    def _seed_store(self, batch: Any) -> Any:
        return batch

    def _logits(self, batch: Any) -> torch.Tensor:
        hops = batch_hop_counts(batch, self.net.num_layers) if self.trim else None
        if hops is None:
            return self(batch.x, batch.edge_index)
        return self(hops.x, hops.edge_index, hops.nodes_per_hop, hops.edges_per_hop)

    def _seed_logits(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The seeds' logits and labels."""
        out, y, _ = self._seed_outputs(batch)
        return out, y

    def setup(self, stage: str) -> None:
        """Warns once when the GNN has more layers than the data module samples hops (``len(fanouts)``)."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        layers = getattr(self.net, "num_layers", None)
        if self._warned_hops or datamodule is None or not isinstance(layers, int):
            return
        for name in ("fanouts", "eval_fanouts"):
            fanouts = getattr(datamodule, name, None)
            if isinstance(fanouts, (list, tuple)) and layers > len(fanouts):
                rank_zero_warn(
                    f"{type(self).__name__} has num_layers={layers} but the data module's {name}={list(fanouts)} "
                    f"samples {len(fanouts)} hops: the extra layers reach no further neighbors (the outermost "
                    f"sampled nodes have no sampled in-edges). Set num_layers={len(fanouts)} or add a fanout per layer."
                )
                self._warned_hops = True
                return


# ---- on HeteroData batches -----------------------------------------------------------------------------------------

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
        "edge_types": [edge_type_key(as_edge_type(e)) for e in edge_types],
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
            edge_types = [edge_type_key(as_edge_type(e)) for e in edge_types]  # saved as strings: YAML and checkpoints
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
        mine = {"node_types": self.net.node_types, "edge_types": [edge_type_key(e) for e in self.net.edge_types],
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
