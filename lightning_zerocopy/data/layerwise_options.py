"""The recipe's switch for exact layer-wise predictions (``data.init_args.predict_mode: layerwise``) and its options
(``data.init_args.layerwise``), checked where the DataModule is built so a bad value is one line naming its key.

``predict_mode: sampled`` (default): ``predict`` samples each seed's neighborhood with ``eval_fanouts``, as
``validate``/``test`` do. ``predict_mode: layerwise``: every layer runs once over every node with all in-neighbors
(:mod:`lightning_zerocopy.data.layerwise`), so the outputs equal a full-graph forward; no fanout is sampled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from lightning_zerocopy.data.gpu_options import cuda_build_problem
from lightning_zerocopy.options import FeatureDtype, RecipeError, check_choice, check_count

__all__ = ["LayerSampler", "LayerStorage", "LayerwiseOptions", "PredictMode", "check_layerwise_fanouts",
           "layerwise_placement"]  # fmt: skip

#: How ``predict`` computes its outputs: per seed over a sampled neighborhood, or layer by layer over every node.
PredictMode = Literal["sampled", "layerwise"]
#: Where a layer's outputs are kept until the next layer has read them: ``host`` (shared, pinned host memory),
#: ``gpu`` (one rank, GPU memory), ``auto`` (``gpu`` where a layer's input and output tables fit in half the free GPU
#: memory of a one-rank run on a GPU, else ``host``).
LayerStorage = Literal["auto", "host", "gpu"]
#: Where the pass samples each batch's full one-hop neighborhood: ``auto`` (the DataModule's ``gpu`` or ``uva`` sampler;
#: in place of CPU threads or a ``hybrid`` choice, ``uva`` where the batches are gathered zero-copy on a GPU), or one
#: placement. Batches are the same on every placement, so the outputs are too.
LayerSampler = Literal["auto", "cpu", "uva", "gpu"]

_KEY = "data.init_args.layerwise."


@dataclass(frozen=True)
class LayerwiseOptions:
    """How ``predict_mode: layerwise`` runs (every field a key under ``data.init_args.layerwise``).

    Args:
        batch_size: destination nodes per batch of a layer (fewer where ``max_batch_edges`` cuts a batch first). A
            batch has a fixed cost (1-2 ms on an H200), so large batches: 32768 took the light model's pass over a
            24M-node graph from 36.6 s (4096) to 19.9 s; the GPU working set is bounded by ``max_batch_edges``.
        max_batch_edges: in-edges per batch at most (a node with more in-edges is a batch of its own): what bounds a
            batch's GPU working set, about ``(batch_size + max_batch_edges) x width`` rows gathered plus the layer's
            per-edge messages.
        storage: where each layer's outputs are kept for the next layer: ``auto``, ``host`` or ``gpu``.
        sampler_placement: where each batch's neighborhood is sampled (:data:`LayerSampler`, :func:`layerwise_placement`).
            ``auto`` lets a DataModule that samples on CPU threads run the pass on the GPU sampler reading the graph
            in place (``uva``): on one H200 a 24M-node pass took 6.2 s there against 17.4 s on the CPU threads.
        dtype: the dtype a layer's outputs are stored in (``float32``, ``bfloat16``, ``float16``: half the memory and
            half the bytes the next layer reads; the next layer computes in the dtype the model returned).
        embeddings: the layer (0-based; ``-1`` the last) whose outputs are also written as ``.npy`` files of every
            node, memory-mapped (they may exceed RAM; float32, or float16 with ``dtype: float16``); ``null``: none,
            except for a link DataModule, which writes the last layer's (its node embeddings).
        embeddings_path: the file (``.npy``) of an untyped graph's embeddings, or the folder of a typed graph's
            (``embeddings.<node type>.npy``); default: the run's log folder.
    """

    batch_size: int = 32768
    max_batch_edges: int = 2_000_000
    storage: LayerStorage = "auto"
    sampler_placement: LayerSampler = "auto"
    dtype: FeatureDtype = "float32"
    embeddings: Optional[int] = None
    embeddings_path: Optional[str] = None

    def __post_init__(self) -> None:
        check_count(self.batch_size, _KEY + "batch_size", minimum=1)
        check_count(self.max_batch_edges, _KEY + "max_batch_edges", minimum=1)
        check_choice(self.storage, LayerStorage, _KEY + "storage")
        check_choice(self.sampler_placement, LayerSampler, _KEY + "sampler_placement")
        check_choice(self.dtype, FeatureDtype, _KEY + "dtype")
        if self.embeddings is not None and (isinstance(self.embeddings, bool) or not isinstance(self.embeddings, int)):
            raise TypeError(f"{_KEY}embeddings must be a layer index (0-based, -1 the last) or null, "
                            f"got {self.embeddings!r}")  # fmt: skip


def check_layerwise_fanouts(predict_mode: Any, eval_fanouts: Any, key: str) -> None:
    """Refuse a sampled evaluation fanout given together with ``predict_mode: layerwise`` (which takes every
    in-neighbor of every layer, so the fanout would silently mean nothing).

    Args:
        eval_fanouts: the evaluation fanouts as the recipe gave them (``None``: not given), a list or a dict of lists.
        key: the recipe key of ``eval_fanouts`` (e.g. ``data.init_args.eval_fanouts``).

    Raises:
        ValueError: one line naming ``key``.
    """
    check_choice(predict_mode, PredictMode, "data.init_args.predict_mode")
    if predict_mode != "layerwise" or eval_fanouts is None:
        return
    lists = eval_fanouts.values() if isinstance(eval_fanouts, dict) else [eval_fanouts]
    sampled = [int(f) for fs in lists for f in fs if int(f) >= 0]
    if sampled:
        raise ValueError(f"{key} samples {sampled[0]} neighbors, but predict_mode: layerwise takes every in-neighbor of "
                         f"every node: leave {key} unset (or -1) for layer-wise predictions")  # fmt: skip


def layerwise_placement(choice: str, placement: str, gather: str, device_index: Optional[int]) -> str:
    """The sampler placement of a layer-wise pass (``choice``: ``layerwise.sampler_placement``) over a DataModule
    whose options resolved to ``placement``, ``gather`` (``cpu`` / ``zerocopy``) on ``device_index`` (``None``: no GPU).

    Raises:
        RecipeError: ``uva`` or ``gpu`` chosen where the run has no CUDA device, naming the key (the command prints it
            as one line).
    """
    if choice == "auto":
        if placement in ("uva", "gpu"):
            return placement
        on_gpu = gather == "zerocopy" and device_index is not None and cuda_build_problem() is None
        return "uva" if on_gpu else "cpu"
    if choice != "cpu" and device_index is None:
        raise RecipeError(f"{_KEY}sampler_placement={choice!r} samples on a CUDA GPU, but this run has none: "
                         "use 'auto' or 'cpu'")  # fmt: skip
    return choice
