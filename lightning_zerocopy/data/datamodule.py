"""``ZeroCopyDataModule``: node classification on an untyped graph, batches like PyG's ``NeighborLoader``.

A constructor of the one DataModule core (:class:`~lightning_zerocopy.data.graph_datamodule.GraphDataModule`, where
the lifecycle is described): an untyped schema and a :class:`~lightning_zerocopy.data.tasks.NodeTask`.

GPU data path (``sampler_placement``, ``gather``, ``gather_mode``, ``hot_rows``): node features stay in host
memory and the GPU reads exactly the rows a mini-batch needs (see :mod:`lightning_zerocopy.data.batch`).
``node_order`` stores graph, features and labels in a locality-preserving internal order, which the batches
never show (see :mod:`lightning_zerocopy.data.host`); ``prepare_data`` builds its disk cache. ``feature_dtype``
stores the feature table in ``bfloat16``/``float16`` (half the bytes over PCIe), ``x_dtype`` says what ``batch.x``
is (``float32`` by default: the rows are cast where the batch is built, so a float32 model runs unchanged).
"""

from __future__ import annotations

from typing import Literal, Optional, Sequence

from lightning_zerocopy.data.gpu_options import KEY_PREFIX
from lightning_zerocopy.data.graph_datamodule import GraphDataModule, Split
from lightning_zerocopy.data.hooks import HostMemoryConsumer, LoaderFactory
from lightning_zerocopy.data.layerwise_options import LayerwiseOptions, PredictMode, check_layerwise_fanouts
from lightning_zerocopy.data.tasks import NodeTask
from lightning_zerocopy.datasets.attributes import AttributeChoice
from lightning_zerocopy.datasets.base import NodeDataset
from lightning_zerocopy.graph.schema import GraphSchema
from lightning_zerocopy.options import (
    FeatureDtype,
    FeatureStorage,
    GatherChoice,
    GatherMode,
    NodeOrderKind,
    SamplerPlacement,
    check_loader_options,
)

__all__ = ["GatherChoice", "GraphDataModule", "HostMemoryConsumer", "LoaderFactory", "Split", "ZeroCopyDataModule"]

_KEY = KEY_PREFIX  # how errors name this class's arguments: the recipe's YAML keys


class ZeroCopyDataModule(GraphDataModule):
    """Node mini-batches like PyG's ``NeighborLoader`` (``Data``), sampled from host memory shared by all ranks: a
    :class:`GraphDataModule` of an untyped graph and a :class:`~lightning_zerocopy.data.tasks.NodeTask`.

    Args:
        dataset: the node-classification dataset (``class_path``/``init_args`` in a recipe).
        fanouts: neighbors sampled per hop for training, e.g. ``[15, 10, 5]``; ``-1`` takes all.
        batch_size: seed nodes per training batch (per rank).
        eval_fanouts: fanouts for validation/test/predict; default: ``fanouts``. Unless every one is ``-1``,
            evaluation samples node-keyed (one sampler seed per split, a node's picks keyed by its id, nodes
            deduplicated per hop), so each node's prediction is the same on any rank count, batch size or order.
        eval_batch_size: seeds per evaluation batch; default: ``batch_size``.
        replace: sample neighbors with replacement.
        shuffle: reshuffle the training seeds every epoch.
        drop_last: drop the training seeds that do not fill a whole batch (and equal rank shares).
        num_threads: threads of the sampling kernel; default: ``torch.get_num_threads()``.
        seed: base seed of the shuffles and of every batch's sampler seed.
        predict_split: the nodes ``predict`` runs on: ``"train"``, ``"val"``, ``"test"`` or ``"all"``. A split is
            sampled as its evaluation samples it (same seed), so ``predict`` outputs equal ``test``'s for test nodes.
        feature_storage: ``"shared_memory"`` (features copied into RAM shared by all local processes) or
            ``"mmap"`` (map the dataset's ``.npy`` feature file; for features larger than RAM).
        sampler_placement: where neighbors are sampled: ``"cpu"`` (C++ threads, default), ``"uva"`` (CUDA
            kernel reading the graph from pinned host memory; needs no GPU memory for the edges) or ``"gpu"``
            (CUDA kernel, graph copied to GPU memory: fastest when it fits), ``"hybrid"`` (per batch on the CPU
            threads or the ``gpu`` kernel, whichever a cost model calibrated on measured times expects to finish
            first; with a :class:`~lightning_zerocopy.callbacks.PipelineCallback` both sample at once) or
            ``"auto"`` (hybrid if both together measure faster, else the faster device). ``uva``/``gpu`` need a
            GPU trainer; ``hybrid``/``auto`` on a CPU trainer say so in one line and sample on the CPU. Every
            placement gives the same batches as ``cpu``.
        gather: how feature rows reach the model: ``"auto"`` (default: ``"zerocopy"`` when the trainer runs on
            a CUDA GPU, else ``"cpu"``), ``"cpu"`` (CPU threads gather, the trainer copies the batch) or
            ``"zerocopy"`` (the GPU reads exactly the batch's rows from pinned host memory; no CPU gather, no
            staging copy). With a GPU sampler or ``"zerocopy"``, batches are built on the GPU.
        gather_mode: read order of the zero-copy gather: ``"auto"`` (time both orders on the first batches and
            keep the faster), ``"direct"`` (batch order) or ``"sorted"`` (address order: fewer pages touched).
        hot_rows: number of feature rows kept in GPU memory (``hot_rows * num_features * bytes per value``),
            chosen as the nodes sampling picks most often (most frequent in-neighbors); ``0`` = none. Needs
            the zero-copy gather; capped at the number of nodes.
        node_order: how nodes are numbered in host memory: ``"none"`` (default: the dataset's ids), ``"bfs"``
            (breadth-first over in-edges: a node's neighbors get nearby ids) or ``"degree"`` (the nodes that
            sampling picks most often, i.e. the highest out-degree, first). With an order, the rows a batch reads
            can share memory pages, so the zero-copy gather touches fewer pages (the lever for narrow rows; how
            much depends on the graph's locality: measure with ``benchmarks/parts/gather.py --pages-only``). The graph,
            features and labels are relabeled once when the host memory is built (cached on disk next to the
            dataset's cache when it has one); batches are the same as with ``"none"`` in meaning -- ``n_id`` and
            ``e_id`` are the dataset's ids, ``x``/``y`` their rows, same seeds per step, ``input_id`` unchanged --
            but the sampled neighbors themselves differ (same distribution: the sampler's random draws are keyed
            by position in the renumbered adjacency).
        check_features: scan the features once at setup for NaN/inf (an error naming node and column; a memory-mapped
            table is read once from disk); ``false`` skips it.
        feature_dtype: the dtype of the feature table in host memory: ``"float32"``, ``"bfloat16"`` or ``"float16"``
            (half the host memory, and half the bytes every gather moves over PCIe); default: the dataset's own
            (float32 unless the dataset converts its features, e.g. ``SyntheticGraph(feature_dtype='float16')``).
            The cast happens once, when the host copy is built (a progress bar shows a long one): ``shared_memory``
            casts into the shared segment, ``mmap`` maps a converted copy of the feature file built once per machine
            next to the dataset's cache (its directory names the dtype). Every cache of rows on the GPU (``hot_rows``,
            the Strategy's shards) holds this dtype too. A finite value the dtype cannot hold (above 65504 in
            ``float16``) fails the setup, naming the node and column.
        x_dtype: the dtype of ``batch.x``: ``"float32"`` (default: the rows are cast where the batch is built, on the
            GPU for a GPU batch, so a float32 model runs unchanged whatever ``feature_dtype`` is), ``"bfloat16"``,
            ``"float16"``, or ``null`` to keep ``feature_dtype`` (no cast: for a model that runs in that dtype, e.g.
            ``precision: bf16-true``, which does not cast a PyG batch's ``x`` itself).
        predict_mode: ``"sampled"`` (default: ``predict`` samples each seed's neighborhood with the evaluation fanouts)
            or ``"layerwise"`` (exact: every layer over every node with all its in-neighbors, the outputs of a
            full-graph forward; :mod:`lightning_zerocopy.data.layerwise`, the model's contract in
            :mod:`lightning_zerocopy.models.layerwise`); leave the evaluation fanouts unset with it.
        layerwise: how ``predict_mode: layerwise`` runs (``batch_size``, ``max_batch_edges``, ``storage``, ``dtype``,
            ``embeddings``, ``embeddings_path``: :class:`~lightning_zerocopy.data.layerwise_options.LayerwiseOptions`).
        allow_split_overlap: train on a dataset whose val or test split holds training nodes (their labels leak
            into the scores), with a warning; by default ``setup`` refuses it, naming how many and the first.
        attributes: which other node- and edge-level tensors of the dataset reach every batch under their own names,
            indexed by ``n_id`` / ``e_id`` as PyG's loaders index them (``edge_weight``, masks, ``edge_attr``, any
            custom one): ``all`` (default, as PyG), ``none``, or a list of names (e.g. ``[edge_weight]``; every type's
            of that name). Each is one more table in the shared host copy: leave out what the model never reads.
    """

    def __init__(
        self,
        dataset: NodeDataset,
        fanouts: Sequence[int] = (10, 10),
        batch_size: int = 512,
        eval_fanouts: Optional[Sequence[int]] = None,
        eval_batch_size: Optional[int] = None,
        replace: bool = False,
        shuffle: bool = True,
        drop_last: bool = False,
        num_threads: Optional[int] = None,
        seed: int = 0,
        predict_split: Literal["train", "val", "test", "all"] = "test",
        feature_storage: FeatureStorage = "shared_memory",
        sampler_placement: SamplerPlacement = "cpu",
        gather: GatherChoice = "auto",
        gather_mode: GatherMode = "auto",
        hot_rows: int = 0,
        node_order: NodeOrderKind = "none",
        check_features: bool = True,
        feature_dtype: Optional[FeatureDtype] = None,
        x_dtype: Optional[FeatureDtype] = "float32",
        allow_split_overlap: bool = False,
        attributes: AttributeChoice = "all",
        predict_mode: PredictMode = "sampled",
        layerwise: Optional[LayerwiseOptions] = None,
    ) -> None:
        check_layerwise_fanouts(predict_mode, eval_fanouts, _KEY + "eval_fanouts")
        check_loader_options(batch_size, eval_batch_size, num_threads, fanouts, eval_fanouts, _KEY)
        super().__init__(
            dataset, NodeTask(), schema=GraphSchema.untyped(), fanouts=list(fanouts),
            eval_fanouts=list(eval_fanouts) if eval_fanouts is not None else list(fanouts), batch_size=batch_size,
            eval_batch_size=eval_batch_size, replace=replace, shuffle=shuffle, drop_last=drop_last,
            num_threads=num_threads, seed=seed, predict_split=predict_split, feature_storage=feature_storage,
            sampler_placement=sampler_placement, gather=gather, gather_mode=gather_mode, hot_rows=hot_rows,
            node_order=node_order, check_features=check_features, feature_dtype=feature_dtype, x_dtype=x_dtype,
            allow_split_overlap=allow_split_overlap, attributes=attributes,
            predict_mode=predict_mode, layerwise=layerwise,
        )  # fmt: skip

    @property
    def num_classes(self) -> int:
        """Number of classes of the dataset."""
        return self.dataset.num_classes
