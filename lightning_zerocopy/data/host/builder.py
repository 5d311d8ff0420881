"""A machine's host copy of a dataset, built by its local rank 0 in ``ZeroCopyDataModule.setup``.

:class:`HostCopyBuilder` keeps what one DataModule need not redo when ``setup`` runs again after a teardown (fit,
then test, in one process): the checks of splits, labels and features (once per dataset) and a node order computed
in memory.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from pytorch_lightning.utilities import rank_zero_warn

from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.data.host.disk_cache import feature_cache_dir, node_order_cache_dir
from lightning_zerocopy.data.host.share import share_node_data, shared_node_order
from lightning_zerocopy.datasets.base import InputDataError, out_of_range_edge
from lightning_zerocopy.datasets.features import check_finite_features
from lightning_zerocopy.datasets.splits import SplitError, check_splits
from lightning_zerocopy.gather.host_table import check_fits_dtype, feature_dtype_of
from lightning_zerocopy.gather.precision_loss import FeatureRangeError
from lightning_zerocopy.graph.reorder import NodeOrder
from lightning_zerocopy.graph.stale_segments import cleanup_stale_segments
from lightning_zerocopy.options import FeatureDtype, FeatureStorage, NodeOrderKind

__all__ = ["HostCopyBuilder"]


class HostCopyBuilder:
    """Builds the shared host memory (graph, features, labels, splits) of ``dataset`` on this machine.

    Args:
        dataset: the dataset (``data.init_args.dataset``): a ``NodeDataset`` here, a ``LinkDataset`` in
            :class:`~lightning_zerocopy.data.host.links.LinkHostCopyBuilder`.
        feature_storage: ``"shared_memory"`` or ``"mmap"``.
        node_order: the internal node order of the host memory.
        key: how errors name the dataset (its YAML key).
        check_features: scan the features for NaN and infinity (:func:`check_finite_features`).
        opt_out: the key that turns the feature scan off, for its error message.
        feature_dtype: the dtype the feature table is stored in (``None``: the dataset's), cast once here.
        dtype_key: how errors name ``feature_dtype`` (its YAML key).
        allow_split_overlap: training nodes in the val/test split are a warning instead of an error.
        overlap_opt_out: the key that allows them, for the error message.
        x_dtype, x_dtype_key: the dtype batches cast ``x`` to, checked once here like ``feature_dtype`` (a value it
            cannot hold, or many it turns into 0; its YAML key for the message).
    """

    def __init__(
        self,
        dataset: Any,
        feature_storage: FeatureStorage,
        node_order: NodeOrderKind,
        key: str,
        check_features: bool = True,
        opt_out: str = "check_features: false",
        feature_dtype: Optional[FeatureDtype] = None,
        dtype_key: str = "feature_dtype",
        allow_split_overlap: bool = False,
        overlap_opt_out: str = "allow_split_overlap: true",
        x_dtype: Optional[FeatureDtype] = None,
        x_dtype_key: str = "x_dtype",
    ):
        self.dataset = dataset
        self.x_dtype, self.x_dtype_key = x_dtype, x_dtype_key
        self.feature_dtype: Optional[FeatureDtype] = feature_dtype
        self.dtype_key = dtype_key
        self.allow_split_overlap = allow_split_overlap
        self.overlap_opt_out = overlap_opt_out
        self.check_features = check_features
        self.opt_out = opt_out
        self.feature_storage: FeatureStorage = feature_storage
        self.node_order: NodeOrderKind = node_order
        self.key = key
        self._order: Optional[NodeOrder] = None  # an in-memory node order, kept for the next build
        self._splits_checked = False
        self._named: Optional[HostGraphHandles] = None  # segments :meth:`share` made whose names are not unlinked yet

    def build(self) -> HostGraphHandles:
        """Load the dataset, check its splits (once), and copy it into job-unique shared segments.

        Raises:
            InputDataError: a split holds an out-of-range or repeated id, or a label is out of range (naming the
                split and its source), or a val/test split holds training nodes (unless allowed); a feature is NaN or
                infinite (naming the node and column), or does not fit ``feature_dtype``; ``edge_index`` holds a node
                id outside the feature rows (naming the first).
        """
        cleanup_stale_segments()  # segments of crashed earlier jobs on this machine
        data = self.dataset.load()
        self._check_splits(data)
        cache_dir = node_order_cache_dir(self.dataset, self.node_order)
        dtype = None if self.feature_dtype is None else feature_dtype_of(self.feature_dtype, self.dtype_key)
        try:
            handles = share_node_data(
                data, self.feature_storage, node_order=self.node_order, cache_dir=cache_dir, order=self._order,
                splits=self._split_tensors(data), feature_dtype=dtype,
                feature_dir=feature_cache_dir(self.dataset, self.node_order, dtype), dtype_key=self.dtype_key,
            )  # fmt: skip
        except FeatureRangeError as exc:
            raise InputDataError(f"{self.key} ({type(self.dataset).__name__}) {exc}") from exc
        except IndexError as exc:  # the graph's build refuses an edge to no node: name the dataset's field
            problem = out_of_range_edge(data.edge_index, data.num_nodes)
            if problem is None:
                raise
            raise InputDataError(f"{self.key} ({type(self.dataset).__name__}): {problem}") from exc
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

    def _split_tensors(self, data: Any) -> Optional[dict[str, torch.Tensor]]:
        """The split tensors to share, by name (``None``: the node splits of ``data``)."""
        return None

    def _find_split_problems(self, data: Any, sources: dict[str, str]) -> list[str]:
        """Raise :class:`SplitError` for a split no batch can be built from; return warnings."""
        return check_splits(data, sources, num_classes=self.dataset.num_classes,
                            allow_train_overlap=self.allow_split_overlap, opt_out=self.overlap_opt_out)  # fmt: skip

    def _check_splits(self, data: Any) -> None:
        """Ids in range and no repeats, labels in [-1, num_classes), finite features (errors), nodes shared between
        splits (warnings), before any batch."""
        if self._splits_checked:
            return
        dataset = f"{self.key} ({type(self.dataset).__name__})"
        sources = {name: self.dataset.split_source(name) for name in ("train", "val", "test")}
        try:
            warnings = self._find_split_problems(data, sources)
        except SplitError as exc:
            raise InputDataError(f"{dataset}: {exc}") from exc
        for warning in warnings:
            rank_zero_warn(f"{dataset}: {warning}")
        if self.check_features:
            check_finite_features(data.x, f"{dataset} features", self.opt_out)
        if self.x_dtype is not None and self.x_dtype != self.feature_dtype:  # each batch casts x to it
            try:
                check_fits_dtype(data.x, feature_dtype_of(self.x_dtype, self.x_dtype_key), "features", self.x_dtype_key)
            except FeatureRangeError as exc:
                raise InputDataError(f"{dataset} {exc}") from exc
        self._splits_checked = True
