"""A machine's host copy of a dataset, built by its local rank 0 in the DataModule's ``setup``.

:class:`HostCopyBuilder` is one builder for every dataset (node or link, untyped or typed): load, check once, share
(:func:`~lightning_zerocopy.data.host.share.share_host_data`). It keeps what one DataModule need not redo when
``setup`` runs again after a teardown (fit, then test, in one process): the checks of ids, splits, labels and
features (once per dataset) and a node order computed in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Optional

from pytorch_lightning.utilities import rank_zero_warn

from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.data.host.disk_cache import feature_cache_dir, node_order_cache_dir
from lightning_zerocopy.data.host.links import link_split_tensors
from lightning_zerocopy.data.host.share import TypedArrays, share_host_data, shared_node_order, typed_arrays
from lightning_zerocopy.datasets.attributes import (
    AttributeChoice,
    check_attribute_names,
    check_attribute_rows,
    select_attributes,
)
from lightning_zerocopy.datasets.base import DatasetFileError, InputDataError, out_of_range_edge
from lightning_zerocopy.datasets.features import check_finite_features
from lightning_zerocopy.datasets.hetero_links import check_hetero_link_splits
from lightning_zerocopy.datasets.link_checks import check_link_splits
from lightning_zerocopy.datasets.splits import SplitError, check_splits
from lightning_zerocopy.gather.host_table import check_fits_dtype, feature_dtype_of
from lightning_zerocopy.gather.precision_loss import FeatureRangeError
from lightning_zerocopy.graph.reorder import NodeOrder
from lightning_zerocopy.graph.stale_segments import cleanup_stale_segments
from lightning_zerocopy.options import FeatureDtype, FeatureStorage, NodeOrderKind

__all__ = ["HostCopyBuilder"]

_SPLITS = ("train", "val", "test")


@dataclass(eq=False)
class HostCopyBuilder:
    """Builds the shared host memory (graphs, features, labels, splits) of ``dataset`` on this machine.

    Args:
        dataset: the dataset (``data.init_args.dataset``): node or link, untyped or typed.
        feature_storage: ``"shared_memory"`` or ``"mmap"``.
        node_order: the internal node order of the host memory (one node type only).
        key: how errors name the dataset (its YAML key).
        check_features: scan the features for NaN and infinity (:func:`check_finite_features`).
        opt_out: the key that turns the feature scan off, for its error message.
        feature_dtype: the dtype the feature tables are stored in (``None``: the dataset's), cast once here.
        dtype_key: how errors name ``feature_dtype`` (its YAML key).
        allow_split_overlap: training nodes in the val/test split are a warning instead of an error.
        overlap_opt_out: the key that allows them, for the error message.
        link: the dataset's splits are supervision edges (a link dataset's), shared as named tensors
            (:func:`~lightning_zerocopy.data.host.links.link_split_tensors`) and checked as link splits.
        x_dtype, x_dtype_key: the dtype batches cast ``x`` to, checked once here like ``feature_dtype`` (a value it
            cannot hold, or many it turns into 0; its YAML key for the message).
        attributes, attributes_key: which node- and edge-level attributes of the dataset reach the batches
            (``"all"``, ``"none"`` or a list of names) and its YAML key for the messages.
        typed: the dataset is typed: its load errors (the typed contract's checks, which name the type but not the
            dataset) are prefixed with ``key``; an untyped dataset's name their own source (a file, a field).
    """

    dataset: Any
    feature_storage: FeatureStorage
    node_order: NodeOrderKind
    key: str
    check_features: bool = True
    opt_out: str = "check_features: false"
    feature_dtype: Optional[FeatureDtype] = None
    dtype_key: str = "feature_dtype"
    allow_split_overlap: bool = False
    overlap_opt_out: str = "allow_split_overlap: true"
    link: bool = False
    typed: bool = False
    x_dtype: Optional[FeatureDtype] = None
    x_dtype_key: str = "x_dtype"
    attributes: AttributeChoice = "all"
    attributes_key: str = "attributes"
    _order: Optional[NodeOrder] = field(default=None, init=False)  # an in-memory node order, kept for the next build
    _checked: bool = field(default=False, init=False)
    _named: Optional[HostGraphHandles] = field(default=None, init=False)  # segments share() made, names not unlinked

    def __post_init__(self) -> None:
        self.link, self.typed = bool(self.link), bool(self.typed)

    @property
    def _where(self) -> str:
        return f"{self.key} ({type(self.dataset).__name__})"

    def build(self) -> HostGraphHandles:
        """Load the dataset, check it (once), and copy it into job-unique shared segments.

        Raises:
            InputDataError: arrays that do not fit together (the dataset's own checks, prefixed with ``key``), an id
                out of range (naming the edge type of a typed graph, or the first bad edge), a bad split or label
                (naming the split and its source), a val/test split holding training nodes (unless allowed), a NaN
                or infinite feature (naming node and column), or one that does not fit ``feature_dtype``.
        """
        cleanup_stale_segments()  # segments of crashed earlier jobs on this machine
        try:
            data = self.dataset.load()
        except DatasetFileError:
            raise  # names its file
        except InputDataError as exc:  # the arrays do not fit together (the data class's checks): name the dataset
            if not self.typed:
                raise
            raise InputDataError(f"{self._where}: {exc}") from exc
        arrays = typed_arrays(data)
        self._check(arrays)
        chosen = select_attributes(arrays.attributes, self.attributes, self.attributes_key)
        check_attribute_names(chosen, self._where, f"{self.attributes_key} (the names to keep, or none)", self.link)
        num_edges = {et: int(ei.shape[1]) for et, ei in arrays.edge_index.items()}
        check_attribute_rows(chosen, arrays.num_nodes, num_edges, self._where)  # the ones left out are not read
        cache_dir = node_order_cache_dir(self.dataset, self.node_order)
        dtype = None if self.feature_dtype is None else feature_dtype_of(self.feature_dtype, self.dtype_key)
        try:
            handles = share_host_data(
                data, self.feature_storage, node_order=self.node_order, cache_dir=cache_dir, order=self._order,
                splits=link_split_tensors(data) if self.link else None, feature_dtype=dtype,
                feature_dir=feature_cache_dir(self.dataset, self.node_order, dtype), dtype_key=self.dtype_key,
                attributes=chosen,
            )  # fmt: skip
        except FeatureRangeError as exc:
            raise InputDataError(f"{self._where} {exc}") from exc
        except IndexError as exc:  # the graph's build refuses an edge to no node: name the dataset's field
            problem = next(filter(None, (out_of_range_edge(ei, max(arrays.num_nodes[s], arrays.num_nodes[d]))
                                         for (s, _, d), ei in arrays.edge_index.items())), None)  # fmt: skip
            if problem is None:
                raise
            raise InputDataError(f"{self._where}: {problem}") from exc
        if cache_dir is None and self._order is None:
            self._order = shared_node_order(handles)
        return handles

    def share(self) -> "HostGraphHandles | Exception":
        """:meth:`build` on the machine's local rank 0, keeping the segments' names until :meth:`unlink_names`. An
        error is returned, not raised, so that it reaches every rank through the handle exchange (none waits)."""
        try:
            self._named = self.build()
        except Exception as exc:  # reported to every rank, then raised
            return exc
        return self._named

    def unlink_names(self) -> None:
        """Unlink the names of the segments :meth:`share` made, once every local process has mapped them (or the
        setup failed): from then on the memory lives exactly as long as some process maps it."""
        named, self._named = self._named, None
        if named is not None:
            named.unlink()

    def _check(self, arrays: TypedArrays) -> None:
        """Ids of a typed graph, splits and labels (errors), nodes shared between splits (warnings), finite features,
        before any batch."""
        if self._checked:
            return
        data, typed = arrays.data, arrays.schema.is_typed
        try:
            if typed:  # each edge type's endpoints against their own type (the CSC build checks one count)
                data.check_ids()
            warnings = self._split_problems(arrays, {name: self.dataset.split_source(name) for name in _SPLITS})
        except (SplitError, InputDataError) as exc:
            raise InputDataError(f"{self._where}: {exc}") from exc
        for warning in warnings:
            rank_zero_warn(f"{self._where}: {warning}")
        for node_type, x in arrays.x.items():
            what = f"features of {node_type!r}" if typed else "features"
            if self.check_features:
                check_finite_features(x, f"{self._where} {what}", self.opt_out)
            if self.x_dtype is not None and self.x_dtype != self.feature_dtype:  # each batch casts x to it
                try:
                    check_fits_dtype(x, feature_dtype_of(self.x_dtype, self.x_dtype_key), what, self.x_dtype_key)
                except FeatureRangeError as exc:
                    raise InputDataError(f"{self._where} {exc}") from exc
        self._checked = True

    def _split_problems(self, arrays: TypedArrays, sources: dict[str, str]) -> list[str]:
        """Raise :class:`SplitError` for a split no batch can be built from; return warnings."""
        data = arrays.data
        if self.link:
            return (check_hetero_link_splits if arrays.schema.is_typed else check_link_splits)(data, sources)
        input_type = arrays.schema.input_type
        assert input_type is not None
        view = SimpleNamespace(num_nodes=arrays.num_nodes[input_type], y=data.y, split=data.split)
        return check_splits(view, sources, num_classes=self.dataset.num_classes,  # type: ignore[arg-type]
                            allow_train_overlap=self.allow_split_overlap, opt_out=self.overlap_opt_out)  # fmt: skip
