"""The node-classification DataModules: ``ZeroCopyDataModule`` (an untyped graph, batches like PyG's
``NeighborLoader``) and ``ZeroCopyHeteroDataModule`` (a typed graph, ``HeteroData`` like PyG's hetero
``NeighborLoader``), and the checks of a typed graph's arguments the link DataModules share.

Both are constructors of the one DataModule core (:class:`~lightning_zerocopy.data.graph_datamodule.GraphDataModule`,
where the lifecycle is described) with a :class:`~lightning_zerocopy.data.tasks.NodeTask`: the untyped schema, or the
dataset's node and edge types and its input type (the host copy then holds one CSC per edge type and a table per
featured type, the builder samples and gathers per type and yields ``HeteroData``, :mod:`lightning_zerocopy.data.batch`).

GPU data path (``sampler_placement``, ``gather``, ``gather_mode``, ``hot_rows``): node features stay in host
memory and the GPU reads exactly the rows a mini-batch needs (see :mod:`lightning_zerocopy.data.batch`).
``node_order`` stores graph, features and labels in a locality-preserving internal order, which the batches
never show (see :mod:`lightning_zerocopy.data.host`); ``prepare_data`` builds its disk cache. ``feature_dtype``
stores the feature table in ``bfloat16``/``float16`` (half the bytes over PCIe), ``x_dtype`` says what ``batch.x``
is (``float32`` by default: the rows are cast where the batch is built, so a float32 model runs unchanged).

A typed graph under several ranks (Lightning's ``ddp``, or ``ZeroCopyDDPStrategy``, whose ``cache_budget`` covers the
rows of every featured type): each machine's local rank 0 builds the typed host copy, the other ranks map it, and
each rank's plan deals it a disjoint, equal share of the input type's seeds. A host-memory consumer (the strategy,
then the callbacks) takes part only if it says so with ``takes_hetero_builders``
(:func:`~lightning_zerocopy.data.hooks.check_typed_consumers`, before the strategy's launcher starts a rank and again
in ``setup``). Not yet for typed graphs: a cache of one table (``hot_rows``) and a ``node_order`` other than ``none``,
each refused in one line (a per-type order would renumber both endpoints of every edge type and carry per-type maps
through the sampler and the assembly). ``sampler_placement`` ``hybrid``/``auto`` is resolved as for one type; batches
are bitwise the CPU placement's.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Sequence, Union

from lightning_zerocopy.data.gpu_options import KEY_PREFIX
from lightning_zerocopy.data.graph_datamodule import GraphDataModule, Split, passed_on
from lightning_zerocopy.data.hooks import HostMemoryConsumer, LoaderFactory
from lightning_zerocopy.data.layerwise_options import LayerwiseOptions, PredictMode, check_layerwise_fanouts
from lightning_zerocopy.data.tasks import NodeTask
from lightning_zerocopy.datasets.attributes import AttributeChoice
from lightning_zerocopy.datasets.base import NodeDataset
from lightning_zerocopy.datasets.hetero import EdgeType, HeteroNodeDataset, Metadata, edge_type_str
from lightning_zerocopy.graph.schema import GraphSchema
from lightning_zerocopy.options import (
    FeatureDtype,
    FeatureStorage,
    GatherChoice,
    GatherMode,
    NodeOrderKind,
    SamplerPlacement,
    check_choice,
    check_fanouts,
    check_loader_options,
)

__all__ = [
    "GatherChoice",
    "GraphDataModule",
    "HostMemoryConsumer",
    "LoaderFactory",
    "NumNeighbors",
    "Split",
    "TypedShapes",
    "ZeroCopyDataModule",
    "ZeroCopyHeteroDataModule",
    "check_edge_types",
    "check_metadata",
    "check_typed_node_order",
    "resolve_num_neighbors",
]

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
            keep the faster), ``"direct"`` (batch order) or ``"sorted"`` (address order: fewer pages touched); or
            ``"staged"``: host threads gather the rows into a pinned buffer and the copy engines move it (slower
            than the zero-copy reads, but gentler on a training step beside it; cached rows still come from the GPU).
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
        evaluation = list(eval_fanouts) if eval_fanouts is not None else list(fanouts)
        super().__init__(dataset, NodeTask(), schema=GraphSchema.untyped(), fanouts=list(fanouts),
                         eval_fanouts=evaluation, **passed_on(locals()))  # fmt: skip

    @property
    def num_classes(self) -> int:
        """Number of classes of the dataset."""
        return self.dataset.num_classes


# ---- a typed graph: its arguments' checks (the link DataModules share them) and shape properties --------------------

#: ``num_neighbors`` as a recipe gives it: one list for every edge type, or a list per edge type keyed by PyG's
#: edge-type string (``paper__cites__paper``).
NumNeighbors = Union[Sequence[int], Mapping[str, Sequence[int]]]


def resolve_num_neighbors(value: NumNeighbors, edge_types: Sequence[EdgeType], key: str) -> dict[EdgeType, list[int]]:
    """``num_neighbors`` per edge type: a list for all, or a dict by edge-type string covering every edge type.

    Raises:
        ValueError: an unknown edge type (naming it and the valid ones), a missing one, lists of different
            lengths, or a bad fanout (naming ``key``).
    """
    names = {edge_type_str(et): tuple(et) for et in edge_types}
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ValueError(f"{key} names the unknown edge type {unknown[0]!r}; the edge types are: "
                             f"{', '.join(names)}")  # fmt: skip
        missing = [k for k in names if k not in value]
        if missing:
            raise ValueError(f"{key} gives no fanouts for the edge type {missing[0]!r}: give every edge type "
                             f"({', '.join(names)}) or one list for all")  # fmt: skip
        resolved = {names[k]: check_fanouts(list(value[k]), f"{key}.{k}") for k in names}
    else:
        fanouts = check_fanouts(list(value), key)
        resolved = {et: list(fanouts) for et in names.values()}
    lengths = {name: len(resolved[et]) for name, et in names.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{key}: every edge type needs the same number of hops, got "
                         f"{', '.join(f'{n}: {c}' for n, c in lengths.items())}")  # fmt: skip
    return resolved


def check_edge_types(dataset: Any, key: str) -> list[EdgeType]:
    """The dataset's edge types, each naming two of its node types (cheap: its shape properties, nothing loaded).

    Raises:
        ValueError: an edge type naming a node type the dataset does not have (naming ``key``, the dataset's class
            and the type).
    """
    node_types = list(dataset.node_types)
    edge_types = [(et[0], et[1], et[2]) for et in dataset.edge_types]
    for edge_type in edge_types:
        for node_type in (edge_type[0], edge_type[2]):
            if node_type not in node_types:
                raise ValueError(f"{key} ({type(dataset).__name__}): the edge type {edge_type_str(edge_type)} names "
                                 f"the node type {node_type!r}, which is not one of its node types "
                                 f"({', '.join(node_types)})")  # fmt: skip
    return edge_types


def check_metadata(dataset: HeteroNodeDataset, key: str) -> list[EdgeType]:
    """The dataset's node and edge types fit together (cheap: its shape properties, nothing loaded); its edge types.

    Raises:
        ValueError: an edge type naming a node type the dataset does not have, or an input type that is no node type
            (naming ``key``, the dataset's class and the type).
    """
    node_types = list(dataset.node_types)
    if dataset.input_type not in node_types:
        raise ValueError(f"{key} ({type(dataset).__name__}): the input type {dataset.input_type!r} is not one of its "
                         f"node types ({', '.join(node_types)})")  # fmt: skip
    return check_edge_types(dataset, key)


def check_typed_node_order(node_order: Any) -> None:
    """Refuse a ``node_order`` other than ``none`` for a typed graph (one line naming the key)."""
    check_choice(node_order, NodeOrderKind, _KEY + "node_order")
    if node_order != "none":
        raise ValueError(f"{_KEY}node_order={node_order!r} is not yet supported for heterogeneous graphs (no "
                         "per-type node order is built); use 'none'")  # fmt: skip


class TypedShapes:
    """The shape properties of a typed graph's DataModule that a model links (cheap: from the dataset)."""

    dataset: Any
    schema: GraphSchema

    @property
    def metadata(self) -> Metadata:
        """``(node types, edge types)`` as PyG's ``HeteroData.metadata()`` (what ``to_hetero``/``HeteroConv`` take):
        call it as PyG's (``dm.metadata()``) or read it as a tuple (``dm.metadata``), see :class:`Metadata`."""
        return Metadata(*self.schema.metadata())

    @property
    def num_nodes(self) -> dict[str, int]:
        """Nodes of every node type (a model sizes the embeddings of featureless types from it)."""
        return dict(self.dataset.num_nodes)


class ZeroCopyHeteroDataModule(TypedShapes, GraphDataModule):
    """Heterogeneous mini-batches (PyG ``HeteroData``, as the hetero ``NeighborLoader`` yields them) from host
    memory shared by all ranks.

    Args:
        dataset: the :class:`~lightning_zerocopy.datasets.hetero.HeteroNodeDataset` (``class_path``/``init_args``).
        num_neighbors: neighbors sampled per hop for training: one list for every edge type (``[10, 5]``) or a
            dict keyed by PyG's edge-type string (``{paper__cites__paper: [10, 5], author__writes__paper: [5, 5],
            ...}``, every edge type, lists of one length); ``-1`` takes all.
        batch_size: input-type seed nodes per training batch (per rank).
        eval_num_neighbors: the same for validation/test/predict (default: ``num_neighbors``); unless every fanout
            is ``-1``, evaluation samples node-keyed (:mod:`lightning_zerocopy.sampling.hetero`).
        eval_batch_size: seeds per evaluation batch (default: ``batch_size``).
        replace, shuffle, drop_last, num_threads, seed, predict_split, feature_storage, gather, gather_mode,
        check_features, x_dtype, allow_split_overlap, attributes: as
            :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` takes them (``predict_split: all``
            predicts every input-type node; each attribute goes on its own type's store).
        sampler_placement: ``"cpu"``, ``"uva"``, ``"gpu"``, ``"hybrid"`` or ``"auto"``, as
            :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` takes them (``hybrid``/``auto``: per batch
            the C++ threads or the ``gpu`` samplers of every edge type; on a CPU trainer they say so in one line and
            sample on the CPU). Every placement gives the same batches.
        feature_dtype: the dtype of every featured type's table in host memory (``"float32"``, ``"bfloat16"``,
            ``"float16"``; default: each type's own), cast once when the host copy is built
            (:mod:`lightning_zerocopy.data.host.share`); ``x_dtype`` says what each ``x`` of a batch is.
        predict_mode, layerwise: exact layer-wise ``predict`` (``layerwise``) instead of sampled, and its options, as
            :class:`~lightning_zerocopy.data.datamodule.ZeroCopyDataModule` takes them.
        node_order: only ``"none"`` (the dataset's ids) for heterogeneous graphs (see the module docstring).

    Raises:
        ValueError / TypeError: a bad argument (naming its recipe key), before any data is built.
    """

    def __init__(
        self,
        dataset: HeteroNodeDataset,
        num_neighbors: NumNeighbors = (10, 10),
        batch_size: int = 512,
        eval_num_neighbors: Optional[NumNeighbors] = None,
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
        check_features: bool = True,
        x_dtype: Optional[FeatureDtype] = "float32",
        allow_split_overlap: bool = False,
        feature_dtype: Optional[FeatureDtype] = None,
        node_order: NodeOrderKind = "none",
        attributes: AttributeChoice = "all",
        predict_mode: PredictMode = "sampled",
        layerwise: Optional[LayerwiseOptions] = None,
    ) -> None:
        check_layerwise_fanouts(predict_mode, eval_num_neighbors, _KEY + "eval_num_neighbors")
        check_typed_node_order(node_order)
        if not isinstance(dataset, HeteroNodeDataset):
            raise TypeError(f"{_KEY}dataset must be a HeteroNodeDataset, got {type(dataset).__name__}; homogeneous "
                            "node datasets go to ZeroCopyDataModule")  # fmt: skip
        edge_types = check_metadata(dataset, _KEY + "dataset")
        train = resolve_num_neighbors(num_neighbors, edge_types, _KEY + "num_neighbors")
        evaluation = train if eval_num_neighbors is None else resolve_num_neighbors(
            eval_num_neighbors, edge_types, _KEY + "eval_num_neighbors")  # fmt: skip
        self.num_neighbors, self.eval_num_neighbors = num_neighbors, eval_num_neighbors
        schema = GraphSchema.typed(dataset.node_types, edge_types, dataset.input_type)
        super().__init__(dataset, NodeTask(), schema=schema, fanouts=train, eval_fanouts=evaluation,
                         **passed_on(locals()))  # fmt: skip

    @property
    def num_classes(self) -> int:
        """Number of classes of the input type's labels."""
        return self.dataset.num_classes

    @property
    def input_type(self) -> str:
        """The node type with labels and splits (the seeds' type)."""
        return self.dataset.input_type
