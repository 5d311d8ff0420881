"""A node-classification LightningModule written the way PyG's Lightning examples are.

``training_step`` runs the GNN on the sampled subgraph and keeps the first ``batch.batch_size`` rows (the
seed nodes), exactly as with PyG's ``NeighborLoader``; nothing here knows about lightning-zerocopy's
DataModule. Optimizer and LR scheduler are typed init arguments, so a LightningCLI recipe picks them with
``class_path``/``init_args``.

Training figures never synchronize a step with the GPU: loss and accuracy are summed on the device
(:class:`~lightning_zerocopy.models.seed_accuracy.SeedAccuracy`) and read back only on the steps
:func:`~lightning_zerocopy.step_logging.is_log_step` names (every ``trainer.log_every_n_steps`` and an epoch's last
batch): ``train_loss`` and ``train_acc_step`` are the means over the steps since the previous hand-over, logged
as CPU tensors for the progress bar and the loggers; ``train_acc_epoch`` is the epoch's exact accuracy (summed
over ranks under DDP).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from pytorch_lightning.cli import LRSchedulerCallable, OptimizerCallable
from pytorch_lightning.utilities import rank_zero_warn
from torch import nn

from lightning_zerocopy.models.layerwise import LayerwiseByBasicGNN
from lightning_zerocopy.models.seed_classifier import SeedClassifier
from lightning_zerocopy.models.trim import batch_hop_counts, can_trim

__all__ = ["NodeClassifier"]


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
