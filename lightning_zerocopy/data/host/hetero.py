"""The host copy of a heterogeneous dataset: one CSC per edge type, features per featured type, input-type labels.

Built once per machine by local rank 0 into job-unique shared segments (like the homogeneous copy,
:mod:`lightning_zerocopy.data.host.share`), handed to every rank as picklable
:class:`~lightning_zerocopy.data.handles.HeteroHostGraphHandles`.

One CSC per edge type
---------------------
Every edge type ``(s, r, d)`` gets its own CSC (built by the same ``build_csc`` op): targets are ``d``-type ids,
``indices`` hold ``s``-type ids, ``edge_perm`` maps back to that type's own edge list (so a batch's ``e_id`` is the
position in ``edge_index[(s, r, d)]``, as PyG's). The two id spaces may differ in size; the CSC is built over
``max(num_nodes[s], num_nodes[d])`` ids (``build_csc`` range-checks both endpoints against one count), so
``indptr`` has a flat tail past the last ``d`` id that no seed ever reads, and the sampler kernel's bounds, which
cap a hop's new nodes at the graph's node count, hold for the ``s`` side too. The cost is 8 bytes per id of the
larger type per edge type.

Why not one CSC with edge-type offsets (GraphBolt's layout, one ``indptr`` over all typed node ids and each
target's neighbors grouped by edge type): per-edge-type CSCs reuse the homogeneous sampler kernel unchanged, one
call per (hop, edge type), on every placement; the single CSC would sample all edge types of a hop in one launch
(fewer launches and host syncs per batch on a GPU, where many small edge types cost launch latency) but needs a
typed kernel. Which one is faster is to be measured on a GPU (``uva``/``gpu`` placements, a graph with many edge
types) before the kernel is written.

Features: ``shared_memory`` copies each featured type's ``x`` into a segment of its own; ``mmap`` maps the type's
``.npy`` file (``HeteroNodeData.x_files``). Labels and the three splits are the input type's; a link dataset
(:class:`~lightning_zerocopy.datasets.hetero_links.HeteroLinkData`) has no labels, and its splits are the supervision
edges flattened into named tensors as the homogeneous link copy flattens them
(:func:`~lightning_zerocopy.data.host.links.link_split_tensors`), with the supervised edge type in the handles.

``feature_dtype`` (``bfloat16``/``float16``) stores every featured type's table in that dtype, cast once here as the
homogeneous copy casts its one table (:mod:`lightning_zerocopy.data.host.share`): ``shared_memory`` casts into the
type's segment; ``mmap`` maps a converted copy of the type's ``.npy`` file, built once per machine in
``<dataset cache>-x-<dtype>-v1-<node type>`` (a dataset with an on-disk ``cache``; otherwise the cast needs
``shared_memory``). A finite value the dtype cannot hold fails the build, naming the node type, node and column.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import torch
from pytorch_lightning.utilities import rank_zero_warn

from lightning_zerocopy.data.handles import HeteroHostGraphHandles
from lightning_zerocopy.data.host.links import link_split_tensors
from lightning_zerocopy.data.host.disk_cache import feature_cache_dir, feature_file
from lightning_zerocopy.datasets.base import DatasetFileError, InputDataError
from lightning_zerocopy.datasets.features import check_finite_features
from lightning_zerocopy.datasets.hetero import HeteroNodeData, HeteroNodeDataset
from lightning_zerocopy.datasets.hetero_links import HeteroLinkData
from lightning_zerocopy.datasets.splits import SplitError, check_splits
from lightning_zerocopy.gather.host_table import (
    FeatureOverflowError,
    FeatureTableHandle,
    HostFeatureTable,
    check_fits_dtype,
    feature_dtype_name,
    feature_dtype_of,
)
from lightning_zerocopy.gather.precision_loss import FeatureRangeError, FeatureUnderflowError
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.graph.shared_memory import NpyTensorHandle, share_tensor
from lightning_zerocopy.graph.stale_segments import cleanup_stale_segments
from lightning_zerocopy.options import FeatureDtype, FeatureStorage, check_choice

__all__ = ["HeteroHostCopyBuilder", "share_hetero_data"]


def share_hetero_data(
    data: "HeteroNodeData | HeteroLinkData",
    feature_storage: FeatureStorage = "shared_memory",
    *,
    feature_dtype: Optional[torch.dtype] = None,
    feature_dir: Optional[Callable[[str], Optional[Path]]] = None,
    dtype_key: str = "feature_dtype",
) -> HeteroHostGraphHandles:
    """Build one CSC per edge type and copy graphs, features, labels and splits into shared memory.

    Args:
        data: the dataset's arrays (a link dataset's: no labels, its link splits as split tensors).
        feature_storage: ``"shared_memory"`` or ``"mmap"``.
        feature_dtype: the dtype every featured type's table is stored in (``None``: each type's own); see the
            module docstring.
        feature_dir: where ``mmap`` storage keeps a type's features cast to ``feature_dtype`` (``None``, or a
            ``None`` for the type: nowhere, so an ``mmap`` cast is refused).
        dtype_key: how errors name ``feature_dtype`` (its YAML key).

    Returns:
        The handles. The caller owns the segments and calls ``handles.unlink()`` once every local process has
        opened them; if this function fails, it unlinks what it had created.

    Raises:
        ValueError: a bad ``feature_storage``, ``mmap`` for a featured type without an ``.npy`` file, or an ``mmap``
            cast without a directory for the converted file.
        FeatureOverflowError: a value does not fit ``feature_dtype`` (naming the node type and ``dtype_key``).
    """
    check_choice(feature_storage, FeatureStorage, "feature_storage")
    if feature_storage == "mmap":
        missing = [t for t in data.x if t not in data.x_files]
        if missing:
            raise ValueError(f"`feature_storage`='mmap' needs an .npy feature file for every featured node type; "
                             f"{missing} have none (use 'shared_memory')")  # fmt: skip
    dirs = {t: feature_dir(t) if feature_dir is not None else None for t in data.x}
    if feature_storage == "mmap" and feature_dtype is not None:
        homeless = [t for t, x in data.x.items() if x.dtype != feature_dtype and dirs[t] is None]
        if homeless:
            raise ValueError(
                f"`{dtype_key}`={feature_dtype_name(feature_dtype)!r} with `feature_storage`='mmap' needs a dataset "
                f"with an on-disk cache to hold the converted feature file of {homeless[0]!r}; use "
                "feature_storage='shared_memory'"
            )
    with ExitStack() as undo:
        graphs = []
        for edge_type, edge_index in data.edge_index.items():
            src, _, dst = edge_type
            ids = max(data.num_nodes[src], data.num_nodes[dst])  # one id space covering both endpoints
            graph = CSCGraph.from_edge_index(edge_index, ids).share()
            undo.callback(graph.unlink)
            graphs.append((tuple(edge_type), graph.handle()))
        features = []
        for node_type, x in data.x.items():
            name, dtype = f"x_{node_type}", x.dtype if feature_dtype is None else feature_dtype
            try:
                if feature_storage == "mmap":
                    source = NpyTensorHandle(data.x_files[node_type])
                    table = feature_file(source, x.dtype, dtype, dirs[node_type], dtype_key)
                else:
                    table = HostFeatureTable.share(x.contiguous(), name=name, dtype=dtype, key=dtype_key).handle()
                    undo.callback(table.unlink)
            except FeatureOverflowError as exc:  # name the type: node ids are per type
                raise FeatureOverflowError(f"features of {node_type!r}", exc.node, exc.column, exc.value, dtype,
                                           dtype_key) from exc  # fmt: skip
            except FeatureUnderflowError as exc:
                raise FeatureUnderflowError(f"features of {node_type!r}", exc.loss, dtype, dtype_key) from exc
            features.append((node_type, table))

        def share(tensor: torch.Tensor, name: str):
            _, handle = share_tensor(tensor.contiguous(), name=name)
            undo.callback(handle.unlink)
            return handle

        if isinstance(data, HeteroLinkData):  # supervision edges (their labels may be float), no node labels
            input_type, labels, link_edge_type = data.edge_type[0], None, data.edge_type
            splits = {name: share(t, name.replace(".", "_")) for name, t in link_split_tensors(data).items()}
        else:
            input_type, link_edge_type = data.input_type, None
            labels = share(data.y.to(torch.int64), "labels")
            splits = {name: share(data.split(name).to(torch.int64), f"{name}_idx") for name in ("train", "val", "test")}
        handles = HeteroHostGraphHandles(
            input_type=input_type,
            num_nodes=tuple((t, int(n)) for t, n in data.num_nodes.items()),
            graphs=tuple(graphs),  # type: ignore[arg-type]
            features=tuple(features),
            labels=labels,
            splits=splits,
            link_edge_type=link_edge_type,
        )
        undo.pop_all()  # success: the caller owns the segments now
    return handles


class HeteroHostCopyBuilder:
    """What local rank 0 of a :class:`~lightning_zerocopy.data.hetero_datamodule.ZeroCopyHeteroDataModule` runs in
    ``setup``: load, check (ids per edge type, splits and labels of the input type, finite features), share.

    The same interface as :class:`~lightning_zerocopy.data.host.builder.HostCopyBuilder` (``share`` /
    ``unlink_names``), so the DataModule's ``setup`` is the homogeneous one.

    Args:
        dataset: the :class:`~lightning_zerocopy.datasets.hetero.HeteroNodeDataset`.
        feature_storage: ``"shared_memory"`` or ``"mmap"``.
        key: how errors name the dataset (its YAML key).
        check_features: scan every featured type for NaN and infinity.
        opt_out: the key that turns the scan off, for its message.
        allow_split_overlap: training nodes in val/test are a warning instead of an error.
        overlap_opt_out: the key that allows them, for the message.
        feature_dtype: the dtype of every featured type's table (``None``: each type's own), cast once here.
        dtype_key: how errors name ``feature_dtype`` (its YAML key).
        x_dtype, x_dtype_key: the dtype batches cast each ``x`` to, checked once here like ``feature_dtype`` (its
            YAML key for the message).
    """

    def __init__(
        self,
        dataset: HeteroNodeDataset,
        feature_storage: FeatureStorage,
        key: str,
        check_features: bool = True,
        opt_out: str = "check_features: false",
        allow_split_overlap: bool = False,
        overlap_opt_out: str = "allow_split_overlap: true",
        feature_dtype: Optional[FeatureDtype] = None,
        dtype_key: str = "feature_dtype",
        x_dtype: Optional[FeatureDtype] = None,
        x_dtype_key: str = "x_dtype",
    ) -> None:
        self.dataset = dataset
        self.x_dtype, self.x_dtype_key = x_dtype, x_dtype_key
        self.feature_dtype: Optional[FeatureDtype] = feature_dtype
        self.dtype_key = dtype_key
        self.feature_storage: FeatureStorage = feature_storage
        self.key = key
        self.check_features = check_features
        self.opt_out = opt_out
        self.allow_split_overlap = allow_split_overlap
        self.overlap_opt_out = overlap_opt_out
        self._checked = False
        self._named: Optional[HeteroHostGraphHandles] = None

    def build(self) -> HeteroHostGraphHandles:
        """Load the dataset, check it (once), and copy it into shared segments.

        Raises:
            InputDataError: arrays that do not fit together (feature rows per type, an edge type naming a missing
                node type: the dataset's own checks, prefixed with ``key``), an id out of range for its type (naming
                the edge type), a bad split or label, a NaN or infinite feature, or one that does not fit
                ``feature_dtype`` (naming the node type).
        """
        cleanup_stale_segments()
        try:
            data = self.dataset.load()
        except DatasetFileError:
            raise  # names its file
        except InputDataError as exc:  # the arrays do not fit together (HeteroNodeData's checks): name the dataset
            raise InputDataError(f"{self.key} ({type(self.dataset).__name__}): {exc}") from exc
        self._check(data)
        dtype = None if self.feature_dtype is None else feature_dtype_of(self.feature_dtype, self.dtype_key)
        base = feature_cache_dir(self.dataset, "none", dtype)

        def feature_dir(node_type: str) -> Optional[Path]:
            return None if base is None else base.parent / f"{base.name}-{node_type}"

        try:
            return share_hetero_data(data, self.feature_storage, feature_dtype=dtype, feature_dir=feature_dir,
                                     dtype_key=self.dtype_key)  # fmt: skip
        except FeatureRangeError as exc:
            raise InputDataError(f"{self.key} ({type(self.dataset).__name__}) {exc}") from exc

    def share(self) -> "HeteroHostGraphHandles | Exception":
        """:meth:`build` on local rank 0, keeping the names until :meth:`unlink_names`; an error is returned so it
        reaches every rank through the handle exchange."""
        try:
            self._named = self.build()
        except Exception as exc:  # reported to every rank, then raised
            return exc
        return self._named

    def unlink_names(self) -> None:
        """Unlink the names of the segments :meth:`share` made (every local process has mapped them)."""
        named, self._named = self._named, None
        if named is not None:
            named.unlink()

    def _check(self, data: HeteroNodeData) -> None:
        if self._checked:
            return
        dataset = f"{self.key} ({type(self.dataset).__name__})"
        try:
            data.check_ids()
        except InputDataError as exc:
            raise InputDataError(f"{dataset}: {exc}") from exc
        # the input type's splits and labels, through the homogeneous checks
        view = SimpleNamespace(num_nodes=data.num_nodes[data.input_type], y=data.y, split=data.split)
        sources = {name: self.dataset.split_source(name) for name in ("train", "val", "test")}
        try:
            warnings = check_splits(view, sources, num_classes=self.dataset.num_classes,  # type: ignore[arg-type]
                                    allow_train_overlap=self.allow_split_overlap, opt_out=self.overlap_opt_out)  # fmt: skip
        except SplitError as exc:
            raise InputDataError(f"{dataset}: {exc}") from exc
        for warning in warnings:
            rank_zero_warn(f"{dataset}: {warning}")
        self._check_features(data, dataset)
        self._checked = True

    def _check_features(self, data: "HeteroNodeData | HeteroLinkData", dataset: str) -> None:
        """No NaN or infinity (unless the scan is off); every value fits ``x_dtype``, which each batch casts to."""
        if self.check_features:
            for node_type, x in data.x.items():
                check_finite_features(x, f"{dataset} features of {node_type!r}", self.opt_out)
        if self.x_dtype is not None and self.x_dtype != self.feature_dtype:
            for node_type, x in data.x.items():
                try:
                    check_fits_dtype(x, feature_dtype_of(self.x_dtype, self.x_dtype_key), f"features of {node_type!r}",
                                     self.x_dtype_key)  # fmt: skip
                except FeatureRangeError as exc:
                    raise InputDataError(f"{dataset} {exc}") from exc

