"""The per-layer contract of layer-wise inference (``data.init_args.predict_mode: layerwise``).

Layer-wise inference runs a model one layer at a time over every node: each layer on one-hop blocks (a batch of
destination nodes with all their in-neighbors), its outputs stored as the next layer's input table. A module takes
part by defining two methods:

``layerwise_layers()``
    its layers: an ``int`` (how many) on an untyped graph, or on a typed graph one list per layer of the node types
    that layer outputs (``[["paper", "author"], ["paper"]]``; the last layer's must include the predicted type).

``layerwise_step(layer, block)``
    layer ``layer`` on ``block``: the outputs of the block's first ``batch_size`` nodes (more rows are cut off). An
    untyped ``block`` is a ``Data`` with ``x`` (layer 0: the features, as ``x_dtype`` makes them; later: the previous
    layer's outputs), ``edge_index`` (local ids, neighbor -> destination), ``n_id`` (the dataset's ids, destination
    nodes first) and ``batch_size``; return a ``[nodes, width]`` tensor. A typed ``block`` is a ``HeteroData`` with, per
    node type, ``n_id`` and ``x`` where that type has a table (layer 0: the featured types; later: the types the
    previous layer output), ``edge_index`` per edge type, and ``batch_size`` on the destination type; return a tensor
    or a dict by node type holding that type's rows. Run in eval mode, under ``torch.inference_mode``.

The outputs equal a full-graph forward when a layer's output for a node depends only on its own and its
in-neighbors' previous-layer rows (SAGE, GAT, GIN, R-GAT, ...). Not so for normalizations over a batch of nodes
(``GraphNorm``, graph-mode ``LayerNorm``) or a ``GCNConv`` that normalizes by source degrees (a block knows only its
destinations' full degrees): PyG's ``BasicGNN.inference`` differs from its forward there too.

:func:`layerwise_module` finds the contract of any module: its own two methods (the reference models define them), or
else one PyG ``BasicGNN`` holding all of its parameters, run as PyG's ``BasicGNN.inference`` runs it
(:class:`BasicGNNLayers`: per layer ``conv``, then, except after the last layer unless ``jk``, ``act``/``norm`` in the
model's order, dropout off in eval, ``lin`` after the last); anything else gets one line saying what to add.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import nn
from torch_geometric.nn import GCNConv
from torch_geometric.nn.models.basic_gnn import BasicGNN

from lightning_zerocopy.options import RecipeError

__all__ = ["BasicGNNLayers", "LayerwiseByBasicGNN", "basic_gnn_layers", "block_destination", "layerwise_module"]

_HINT = ("add layerwise_layers() (its number of layers; on a typed graph, per layer the node types it outputs) and "
         "layerwise_step(layer, block) (that layer's outputs of the block's first batch_size nodes; see "
         "lightning_zerocopy.models.layerwise), or build it on a PyG BasicGNN (convs, norms, act, jk) holding all "
         "its parameters")  # fmt: skip


class BasicGNNLayers:
    """The layer-wise contract of a PyG ``BasicGNN``, as ``BasicGNN.inference`` runs it (``inference_per_layer``).

    Args:
        net: the ``BasicGNN``.
        owner: how to name it in errors (e.g. the module's attribute ``model.net``).

    Raises:
        RecipeError: a ``jk`` other than ``None``/``"last"`` (it needs every layer's outputs at once).
    """

    def __init__(self, net: nn.Module, owner: str = "the model's BasicGNN") -> None:
        jk = getattr(net, "jk_mode", None)
        if jk not in (None, "last"):
            raise RecipeError(f"{owner} has jk={jk!r}, which combines every layer's outputs of a node at once: "
                              "layer-wise predictions take jk=None or 'last' (or use predict_mode: sampled)")  # fmt: skip
        self.net = net
        _warn_if_inexact(net, owner)

    def layerwise_layers(self) -> int:
        return int(self.net.num_layers)

    def layerwise_step(self, layer: int, block: Any) -> torch.Tensor:
        return self.net.inference_per_layer(layer, block.x, block.edge_index, int(block.batch_size))


def block_destination(block: Any) -> str:
    """The destination type of a typed ``block``: the node type whose store holds ``batch_size``."""
    return next(t for t in block.node_types if "batch_size" in block[t])


def _warn_if_inexact(net: nn.Module, owner: str) -> None:
    """Layers whose layer-wise outputs differ from a full-graph forward (as in PyG's own ``inference``)."""
    if getattr(net, "supports_norm_batch", False):
        rank_zero_warn(f"{owner} normalizes over a batch of nodes ({type(net.norms[0]).__name__}): its layer-wise "
                       "outputs depend on the batches and differ from a full-graph forward")  # fmt: skip
    if any(isinstance(conv, GCNConv) and conv.normalize for conv in getattr(net, "convs", [])):
        rank_zero_warn(f"{owner}'s GCNConv normalizes by the source nodes' degrees, which a one-hop block does not "
                       "hold: its layer-wise outputs differ from a full-graph forward (as PyG's inference does)")  # fmt: skip


def layerwise_module(module: nn.Module) -> Any:
    """The layer-wise contract of ``module``: itself where it defines ``layerwise_layers`` and ``layerwise_step``, else
    :class:`BasicGNNLayers` of the one PyG ``BasicGNN`` that holds all of its parameters.

    Raises:
        RecipeError: neither; the message says what to add.
    """
    if callable(getattr(module, "layerwise_layers", None)) and callable(getattr(module, "layerwise_step", None)):
        return module
    name = f"{type(module).__module__}.{type(module).__qualname__}"
    found = _only_basic_gnn(module)
    if found is None:
        raise RecipeError(f"{name} cannot run layer-wise (data.init_args.predict_mode: layerwise): {_HINT}")
    attribute, net = found
    return BasicGNNLayers(net, f"{name}.{attribute}" if attribute else name)


def _only_basic_gnn(module: nn.Module) -> Optional[tuple[str, nn.Module]]:
    """``(attribute path, net)`` of the one ``BasicGNN`` in ``module`` when it holds every parameter, else ``None``."""
    nets = [(path, m) for path, m in module.named_modules() if isinstance(m, BasicGNN)]
    nets = [(p, m) for p, m in nets if not any(p.startswith(q + ".") for q, _ in nets if q and q != p)]
    if len(nets) != 1:
        return None
    path, net = nets[0]
    inside = {id(p) for p in net.parameters()}
    if any(id(p) not in inside for p in module.parameters()):
        return None
    return path, net


def basic_gnn_layers(net: nn.Module, owner: str) -> BasicGNNLayers:
    """:class:`BasicGNNLayers` of ``net`` (a reference model's GNN), or one line saying what ``net`` lacks.

    Raises:
        RecipeError: ``net`` is not a PyG ``BasicGNN``.
    """
    if not isinstance(net, BasicGNN):
        raise RecipeError(f"{owner} is a {type(net).__name__}, not a PyG BasicGNN, so it cannot run layer-wise "
                          f"(data.init_args.predict_mode: layerwise): {_HINT}")  # fmt: skip
    return BasicGNNLayers(net, owner)


class LayerwiseByBasicGNN:
    """The layer-wise contract of a module that runs one PyG ``BasicGNN`` (the reference models' ``net`` or
    ``encoder``): its layers run as PyG's ``BasicGNN.inference`` runs them; any other net gets one line saying what
    to add. A subclass names the attribute that holds the net in :attr:`layerwise_net_attribute`."""

    #: the attribute of the module that holds its ``BasicGNN``
    layerwise_net_attribute: str = "net"

    def layerwise_layers(self) -> int:
        """How many layers the net runs layer-wise."""
        return self._layerwise().layerwise_layers()

    def layerwise_step(self, layer: int, block: Any) -> torch.Tensor:
        """Layer ``layer``'s rows of ``block``'s first ``batch_size`` nodes (the last layer's: logits or embeddings)."""
        return self._layerwise().layerwise_step(layer, block)

    def _layerwise(self) -> BasicGNNLayers:
        if getattr(self, "_layerwise_layers", None) is None:
            name = self.layerwise_net_attribute
            self._layerwise_layers = basic_gnn_layers(getattr(self, name), f"{type(self).__name__}'s {name}")
        return self._layerwise_layers
