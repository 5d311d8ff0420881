"""The plan of a layer-wise pass (:mod:`lightning_zerocopy.data.layerwise`): what a module gives it
(:class:`LayerwiseModule`, checked against the graph's types), how destination nodes are cut into batches
(:func:`batch_bounds`), and the predict loader of ``predict_mode: layerwise`` (:func:`layerwise_pass_loader`)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol, Sequence, Union

import numpy as np
import torch

from lightning_zerocopy.graph.schema import NODE
from lightning_zerocopy.options import RecipeError

__all__ = ["LayerwiseModule", "LayerwisePassLoader", "batch_bounds", "layer_index", "layer_outputs", "layerwise_pass_loader"]

_KEY = "data.init_args.layerwise."


class LayerwiseModule(Protocol):
    """What a module gives layer-wise inference (:mod:`lightning_zerocopy.models.layerwise` describes it)."""

    def layerwise_layers(self) -> Union[int, Sequence[Sequence[str]]]:
        """The number of layers (untyped graph), or per layer the node types it outputs (typed graph)."""
        ...

    def layerwise_step(self, layer: int, block: Any) -> Union[torch.Tensor, Mapping[str, torch.Tensor]]:
        """Layer ``layer``'s outputs of ``block``'s first ``batch_size`` nodes (of the type holding it)."""
        ...


def batch_bounds(cum_degrees: np.ndarray, batch_size: int, max_edges: int) -> list[int]:
    """Cut points of a destination list into batches of at most ``batch_size`` nodes and ``max_edges`` in-edges (a
    node with more is a batch of its own); ``cum_degrees[i]`` is the in-edges of the list's first ``i`` nodes (any
    offset). The same cuts for any rank count."""
    n = len(cum_degrees) - 1
    bounds, start = [0], 0
    while start < n:
        limit = int(np.searchsorted(cum_degrees, cum_degrees[start] + max_edges, side="right")) - 1
        stop = max(start + 1, min(start + batch_size, limit, n))
        bounds.append(stop)
        start = stop
    return bounds


def layer_outputs(model: Any, schema: Any) -> list[tuple[str, ...]]:
    """``model.layerwise_layers()`` as the node types each layer outputs, checked against the graph's types."""
    name = type(model).__name__
    spec = model.layerwise_layers()
    if not schema.is_typed:
        if isinstance(spec, bool) or not isinstance(spec, int) or spec < 1:
            raise TypeError(f"{name}.layerwise_layers() must return its number of layers (an int >= 1) for an untyped "
                            f"graph, got {spec!r}")  # fmt: skip
        return [(NODE,)] * spec
    if isinstance(spec, (int, str)) or not isinstance(spec, Sequence) or not spec:
        raise TypeError(f"{name}.layerwise_layers() must return, per layer, the node types it outputs (the graph has "
                        f"{list(schema.node_types)}), got {spec!r}")  # fmt: skip
    layers = [tuple(str(t) for t in types) for types in spec]
    for layer, types in enumerate(layers):
        unknown = [t for t in types if t not in schema.node_types]
        if unknown or not types:
            raise ValueError(f"{name}.layerwise_layers()[{layer}] must name node types of the graph "
                             f"{list(schema.node_types)}, got {list(types)}")  # fmt: skip
    return layers


def layer_index(index: Optional[int], num_layers: int) -> Optional[int]:
    if index is None:
        return None
    resolved = index + num_layers if index < 0 else index
    if not 0 <= resolved < num_layers:
        raise ValueError(f"{_KEY}embeddings is {index}, but the model has {num_layers} layers: give 0 to "
                         f"{num_layers - 1} (or -1 for the last)")  # fmt: skip
    return resolved


class LayerwisePassLoader:
    """The predict loader of ``predict_mode: layerwise``: one step, the whole layer-wise pass; it yields no batch.

    Lightning's predict loop calls its ``on_predict_start`` hooks only for a loader with a step, and calls the
    module's ``predict_step`` for every batch a loader yields, which layer-wise inference never runs. So
    :class:`~lightning_zerocopy.callbacks.LayerwisePredictionWriter` runs the pass in ``on_predict_start``; create
    the loader with :func:`layerwise_pass_loader`, which checks that a trainer has that callback.
    """

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Any:
        return iter(())


def layerwise_pass_loader(trainer: Any) -> LayerwisePassLoader:
    """The predict loader of ``predict_mode: layerwise`` for ``trainer``.

    Raises:
        RecipeError: no callback of ``trainer`` runs the pass (one with ``runs_layerwise_pass = True``).
    """
    callbacks = getattr(trainer, "callbacks", None) or []
    if not any(getattr(c, "runs_layerwise_pass", False) for c in callbacks):
        from pytorch_lightning.callbacks import BasePredictionWriter

        writers = [type(c).__name__ for c in callbacks if isinstance(c, BasePredictionWriter)]
        instead = f"replace trainer.callbacks' {writers[0]} (sampled predictions) by" if writers else "add"
        raise RecipeError(f"data.init_args.predict_mode: layerwise runs in the LayerwisePredictionWriter callback: "
                          f"{instead} lightning_zerocopy.callbacks.LayerwisePredictionWriter (the lightning-zerocopy "
                          "predict command adds it when the recipe lists no prediction writer)")  # fmt: skip
    return LayerwisePassLoader()
