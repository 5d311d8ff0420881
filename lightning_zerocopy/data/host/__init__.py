"""The host copy of a dataset: built once per machine in shared memory, then mapped by every local process.

* :mod:`.share` — building the shared segments of any dataset over its schema (:func:`share_host_data`: one CSC per
  edge type, a table per featured node type), handing the handles to every rank;
* :mod:`.disk_cache` — the on-disk caches a host copy is built from (a node order's relabeled arrays:
  :func:`build_node_order_cache`; features cast to a dtype: :func:`feature_file`), built once per machine;
* :mod:`.relabel` — relabeling a graph and its rows into a node order (in memory or into the disk cache);
* :mod:`.builder` — :class:`HostCopyBuilder`: what the DataModule's local rank 0 runs (checks, segments, node
  order), for node and link, untyped and typed datasets;
* :mod:`.prepare` — the disk caches ``prepare_data`` builds once per machine (:func:`prepare_disk_caches`: the
  node-order cache, the converted feature file);
* :mod:`.links` — a link dataset's supervision splits as named tensors.

Pinning and mapping those pages for the GPU is :mod:`lightning_zerocopy.graph.host_registration` (below ``data/``:
the samplers and gathers register host memory too). Names are imported on first access.
"""

from __future__ import annotations

from lightning_zerocopy._lazy import lazy_exports

_LAZY = {
    "build_node_order_cache": "lightning_zerocopy.data.host.disk_cache",
    "exchange_handles": "lightning_zerocopy.data.host.share",
    "feature_cache_dir": "lightning_zerocopy.data.host.disk_cache",
    "feature_file": "lightning_zerocopy.data.host.disk_cache",
    "node_order_cache_dir": "lightning_zerocopy.data.host.disk_cache",
    "share_host_data": "lightning_zerocopy.data.host.share",
    "share_node_data": "lightning_zerocopy.data.host.share",
    "shared_node_order": "lightning_zerocopy.data.host.share",
    "HostCopyBuilder": "lightning_zerocopy.data.host.builder",
    "prepare_disk_caches": "lightning_zerocopy.data.host.prepare",
    "prepare_feature_file": "lightning_zerocopy.data.host.prepare",
    "link_split_tensors": "lightning_zerocopy.data.host.links",
    "link_splits": "lightning_zerocopy.data.host.links",
    "share_hetero_data": "lightning_zerocopy.data.host.share",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(__all__)
