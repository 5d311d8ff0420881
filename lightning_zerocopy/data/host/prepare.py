"""The disk caches a DataModule's ``prepare_data`` builds once per machine, after the dataset's own cache.

* the node-order cache (``node_order`` ``"bfs"``/``"degree"``): the graph, features and labels relabeled, next to the
  dataset's cache (:func:`~.disk_cache.node_order_cache_dir`, :func:`~.disk_cache.build_node_order_cache`);
* the converted feature file (``mmap`` storage with a ``feature_dtype`` other than the dataset's): the (relabeled)
  feature rows cast once (:func:`~.disk_cache.feature_cache_dir`, :func:`~.disk_cache.feature_file`).

Setup would otherwise build them on local rank 0; a dataset without a disk cache has neither (its node order is
computed in memory).
"""

from __future__ import annotations

from typing import Any, Optional

from lightning_zerocopy.data.host.disk_cache import (
    build_node_order_cache,
    feature_cache_dir,
    feature_file,
    node_order_cache_dir,
)
from lightning_zerocopy.data.host.share import type_feature_dir, typed_arrays
from lightning_zerocopy.datasets.base import ArrayCache
from lightning_zerocopy.gather.host_table import feature_dtype_of
from lightning_zerocopy.graph.shared_memory import NpyTensorHandle
from lightning_zerocopy.options import FeatureDtype, FeatureStorage, NodeOrderKind


def prepare_disk_caches(
    dataset: Any,
    node_order: NodeOrderKind,
    feature_storage: FeatureStorage,
    feature_dtype: Optional[FeatureDtype],
    dtype_key: str,
) -> None:
    """Build the node-order cache and the converted feature file of ``dataset`` where they are missing (errors name
    ``dtype_key``, the recipe's key of ``feature_dtype``)."""
    cache_dir = node_order_cache_dir(dataset, node_order)
    if cache_dir is not None and not ArrayCache(cache_dir).exists():  # once per machine, like the dataset
        build_node_order_cache(dataset.load(), node_order, cache_dir)
    prepare_feature_file(dataset, node_order, feature_storage, feature_dtype, dtype_key)


def prepare_feature_file(
    dataset: Any,
    node_order: NodeOrderKind,
    feature_storage: FeatureStorage,
    feature_dtype: Optional[FeatureDtype],
    dtype_key: str,
) -> None:
    """With ``mmap`` storage and a ``feature_dtype`` other than the dataset's, build the converted feature file of
    every featured type (once per machine, like the node-order cache; setup would otherwise build it on local rank 0;
    a node-ordered graph's from the relabeled file)."""
    dtype = None if feature_dtype is None else feature_dtype_of(feature_dtype, dtype_key)
    feature_dir = feature_cache_dir(dataset, node_order, dtype)
    if feature_storage != "mmap" or feature_dir is None or ArrayCache(feature_dir).exists():
        return
    arrays = typed_arrays(dataset.load())
    cache_dir = node_order_cache_dir(dataset, node_order)
    for node_type, x in arrays.x.items():
        if node_type not in arrays.x_files or x.dtype == dtype:
            continue  # setup says what is wrong, or there is nothing to convert
        source = arrays.x_files[node_type] if cache_dir is None else str(ArrayCache(cache_dir).file("x"))
        feature_file(NpyTensorHandle(source), x.dtype, dtype, type_feature_dir(feature_dir, arrays.schema, node_type),
                     dtype_key)  # fmt: skip
