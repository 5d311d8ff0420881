"""What one process places for the data path over one host memory: one owner, acquired and released by hooks.

:class:`HostData` maps the shared host memory named by a :class:`~lightning_zerocopy.data.handles.HostGraphHandles`
(no CUDA). :class:`DeviceResources` owns it and everything placed from it on one CUDA device:

==============================  =========================================================================
``topology(placement)``         the CSC topology for the CUDA sampler: a GPU copy (``gpu``) or host
                                registrations (``uva``), through :func:`~lightning_zerocopy.sampling.topology.place_topology`
``labels()``                    a compact integer copy of the labels on the GPU
``node_order()``                the internal -> original id map on the GPU (node-ordered host memory only)
``feature_table(cache, mode)``  the zero-copy gather path for the features; ``cache`` is a
                                :class:`~lightning_zerocopy.cache.provider.FeatureCacheSpec` (e.g. hot rows) or
                                the Strategy's cache by node type (its one type's part)
``edge_attr_table()``           the zero-copy gather path for edge features
==============================  =========================================================================

Everything on the GPU is placed on first use and kept until :meth:`DeviceResources.close`, so several builders
(train and eval fanouts, several caches) share one placement. Owners: the DataModule (``setup`` creates,
``teardown``/``on_exception`` closes), the pipeline producer (in its own process, :class:`ResourceScope`), or a
builder opened without resources (it owns a private one).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional, Union

import torch

from lightning_zerocopy.cache.provider import CacheContext, FeatureCacheSpec, FeatureGather, plain_feature_table
from lightning_zerocopy.cache.typed_provider import TypedFeatureCache
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.gather.host_table import HostFeatureTable
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.graph.schema import EDGE, NODE, EdgeType
from lightning_zerocopy.options import GatherMode, SamplerDevice, check_choice
from lightning_zerocopy.sampling.topology import PlacedTopology, place_topology

__all__ = ["DeviceResources", "HostData", "ResourceScope"]


@dataclass
class HostData:
    """The host memory of one :class:`HostGraphHandles`, mapped in this process (no CUDA work).

    Attributes:
        graph: the CSC graph (internal ids when the memory is node-ordered).
        features: the feature table.
        labels: int64 labels, one per node (``None``: a task without node labels).
        edge_attr: edge features in the dataset's edge order, or ``None``.
        order: int64 internal -> original id map (``None``: no node order).
        rank: int64 original -> internal id map.
    """

    graph: CSCGraph
    features: HostFeatureTable
    labels: Optional[torch.Tensor]
    edge_attr: Optional[torch.Tensor] = None
    order: Optional[torch.Tensor] = None
    rank: Optional[torch.Tensor] = None

    @classmethod
    def open(cls, handles: HostGraphHandles) -> "HostData":
        """Map everything ``handles`` names (while the shared segments still have names)."""
        node_order = handles.node_order
        return cls(
            graph=handles.graph.open(),
            features=handles.features.open(),
            labels=None if handles.labels is None else handles.labels.open(),
            edge_attr=None if handles.edge_attr is None else handles.edge_attr.open(),
            order=None if node_order is None else node_order.order.open(),
            rank=None if node_order is None else node_order.rank.open(),
        )

    # the host memory by type, as the feature cache reads it (one node type and one edge type)

    @property
    def graphs(self) -> dict[EdgeType, CSCGraph]:
        return {EDGE: self.graph}

    @property
    def tables(self) -> dict[str, HostFeatureTable]:
        return {NODE: self.features}

    @property
    def num_nodes(self) -> dict[str, int]:
        return {NODE: int(self.graph.num_nodes)}

    def internal_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Internal ids of original node ids (the ids themselves without a node order); checked, on the CPU.

        Raises:
            IndexError: an id outside ``[0, num_nodes)`` (it would otherwise wrap around or read past the map).
        """
        if self.rank is None:
            return ids
        ids = ids.to(device="cpu", dtype=torch.int64)
        if ids.numel() > 0:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.rank.numel():
                bad = lo if lo < 0 else hi
                raise IndexError(f"seed node id {bad} is out of range for a graph of {self.rank.numel()} nodes")
        return torch.index_select(self.rank, 0, ids)


def resolve_cuda_device(device: Union[torch.device, int, None], what: str) -> torch.device:
    """The CUDA device ``device`` names (``None``: the current one), after checking this process can use it.

    Raises:
        RuntimeError: no CUDA device, a build without the CUDA kernels, or an index this process does not see
            (the message starts with ``what``).
    """
    from lightning_zerocopy import WITH_CUDA

    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} builds batches on a CUDA GPU, but none is available; use 'cpu' for both")
    if not WITH_CUDA:
        raise RuntimeError(
            f"{what} needs the CUDA kernels, but lightning_zerocopy._C was built without them; rebuild on a CUDA "
            "machine (FORCE_CUDA=1 python setup.py build_ext --inplace) or use 'cpu' for both"
        )
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise RuntimeError(f"{what}: {device} is not a CUDA device")
        device = device.index
    index = torch.cuda.current_device() if device is None else int(device)
    if index >= torch.cuda.device_count():
        raise RuntimeError(f"{what}: device {index}, but this process sees {torch.cuda.device_count()} GPU(s)")
    return torch.device("cuda", index)


def _compact_int_dtype(values: torch.Tensor) -> torch.dtype:
    """The smallest signed integer dtype holding every entry of ``values`` (int64 for an empty tensor)."""
    if values.numel() == 0:
        return torch.int64
    lo, hi = int(values.min()), int(values.max())
    for dtype in (torch.int8, torch.int16, torch.int32):
        info = torch.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return dtype
    return torch.int64


def row_width(t: torch.Tensor) -> int:
    width = 1
    for size in t.shape[1:]:
        width *= int(size)
    return width


def _pin(tensor: torch.Tensor, name: str) -> Any:
    """Register host memory for zero-copy reads; a failure says which option asked for it."""
    from lightning_zerocopy.graph.host_registration import register_host_tensor

    try:
        return register_host_tensor(tensor, name=name)
    except RuntimeError as exc:
        raise RuntimeError(
            f"{exc}\nThe zero-copy GPU data path pins the host {name} (gather='zerocopy' or "
            "sampler_placement='uva'); with feature_storage='mmap' that pins the whole feature file in RAM. Use "
            "gather='cpu' / sampler_placement='cpu' or 'gpu' where pinning is not possible."
        ) from exc


class DeviceResources:
    """Everything one process places on one CUDA device for the data path over one host memory.

    Creating it maps the host memory (no CUDA work); each GPU resource is placed on first use and shared by
    every builder opened with this object; :meth:`close` frees the GPU memory and unregisters the host memory.

    Args:
        handles: the shared host memory (mapped now: create it while the segments have names).
        device: the CUDA device index (or ``torch.device``) GPU resources go to; ``None`` = the current device
            when the first one is placed. Irrelevant for a purely CPU data path.
    """

    def __init__(self, handles: HostGraphHandles, device: Union[torch.device, int, None] = None) -> None:
        self.handles = handles
        self.host = HostData.open(handles)
        self._device_arg = device
        self._device: Optional[torch.device] = None
        self._lock = threading.RLock()  # a pipeline samples on one thread and gathers on another
        self._topology: dict[str, PlacedTopology] = {}
        self._labels: Optional[torch.Tensor] = None
        self._order: Optional[torch.Tensor] = None
        self._tables: dict[Hashable, FeatureGather] = {}
        self._edge_attr: Optional[FeatureGather] = None
        self._registrations: dict[str, Any] = {}
        self._closed = False

    # ---- device -----------------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """The CUDA device of the GPU resources (resolved, and checked, on first access).

        Raises:
            RuntimeError: no usable CUDA device or no CUDA kernels in this build.
        """
        if self._device is None:
            self._device = resolve_cuda_device(self._device_arg, "DeviceResources")
        return self._device

    @property
    def device_index(self) -> Optional[int]:
        """The device index asked for at creation (``None``: the current device at first use)."""
        arg = self._device_arg
        return arg.index if isinstance(arg, torch.device) else arg

    # ---- GPU resources, placed on first use ----------------------------------------------------------------------

    def topology(self, placement: SamplerDevice) -> PlacedTopology:
        """The topology for the CUDA sampler: a GPU copy (``"gpu"``) or registered host memory (``"uva"``)."""
        check_choice(placement, SamplerDevice, "placement")
        with self._lock:
            placed = self._topology.get(placement)
            if placed is None:
                self._check_open()
                graph = self.host.graph
                placed = place_topology(
                    graph.indptr, graph.indices, graph.edge_perm, placement, self.device, register=_pin
                )
                self._topology[placement] = placed
            return placed

    def labels(self) -> Optional[torch.Tensor]:
        """The labels on the GPU, in the smallest integer dtype that holds them (widen after gathering); ``None``
        when the host memory has no node labels."""
        if self.host.labels is None:
            return None
        with self._lock:
            if self._labels is None:
                self._check_open()
                labels = self.host.labels
                self._labels = labels.to(_compact_int_dtype(labels)).to(self.device)
            return self._labels

    def node_order(self) -> Optional[torch.Tensor]:
        """The internal -> original id map on the GPU (int32 where ids fit), or ``None`` without a node order."""
        order = self.host.order
        if order is None:
            return None
        with self._lock:
            if self._order is None:
                self._check_open()
                fits32 = order.numel() - 1 <= torch.iinfo(torch.int32).max
                self._order = order.to(torch.int32 if fits32 else torch.int64).to(self.device)
            return self._order

    def feature_table(
        self, cache: Union[FeatureCacheSpec, TypedFeatureCache, None] = None, mode: GatherMode = "auto"
    ) -> FeatureGather:
        """The zero-copy gather path for the features, served partly from GPU memory as ``cache`` decides.

        One table per ``(cache, mode)``, shared by every caller; the host table is registered once.

        Args:
            cache: a cache spec (e.g. :class:`~lightning_zerocopy.cache.provider.HotRowsCache`), the Strategy's cache
                by node type (a :class:`~lightning_zerocopy.cache.typed_provider.TypedFeatureCache`: its part for
                :data:`~lightning_zerocopy.graph.schema.NODE` is opened), or ``None``.
            mode: the read order (``auto``/``direct``/``sorted``).
        """
        check_choice(mode, GatherMode, "mode")
        key = (cache, mode)
        with self._lock:
            table = self._tables.get(key)
            if table is None:
                self._check_open()
                data = self._register(self.host.features.data, "features")
                context = CacheContext(data, self.device, mode, self.host.graph.num_nodes, self._neighbor_indices)
                if isinstance(cache, TypedFeatureCache):
                    cache = cache.provider(NODE)
                with torch.cuda.device(self.device):
                    table = plain_feature_table(context) if cache is None else cache.open(context)
                self._tables[key] = table
            return table

    def registered_features(self, node_type: str = NODE) -> torch.Tensor:
        """The host feature table as the GPU reads it (registered once per process, like for :meth:`feature_table`);
        ``node_type`` is the one type, :data:`~lightning_zerocopy.graph.schema.NODE`.

        Raises:
            KeyError: another ``node_type``.
        """
        if node_type != NODE:
            raise KeyError(f"{node_type!r} has no feature table; the featured node type is {NODE!r}")
        with self._lock:
            self._check_open()
            return self._register(self.host.features.data, "features")

    def edge_attr_table(self) -> Optional[FeatureGather]:
        """The zero-copy gather path for edge features viewed ``(num_edges, -1)``; ``None`` without (or with
        zero) edge features."""
        attr = self.host.edge_attr
        if attr is None or attr.shape[0] == 0:
            return None
        with self._lock:
            if self._edge_attr is None:
                self._check_open()
                flat = self._register(attr.reshape(attr.shape[0], row_width(attr)), "edge_attr")
                context = CacheContext(flat, self.device, "direct", flat.shape[0], lambda: flat.new_empty(0))
                with torch.cuda.device(self.device):
                    self._edge_attr = plain_feature_table(context)
            return self._edge_attr

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Free the GPU memory and unregister the host memory (after queued reads finish). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._device is None:
                return  # nothing was placed
            with torch.cuda.device(self._device):  # unregistering synchronizes the current device: make it ours
                self._free()

    def _free(self) -> None:
        closers: list[Callable[[], None]] = [t.close for t in self._tables.values()]
        if self._edge_attr is not None:
            closers.append(self._edge_attr.close)
        closers += [p.close for p in self._topology.values()]
        closers += [r.close for r in reversed(list(self._registrations.values()))]
        self._tables, self._edge_attr, self._topology, self._registrations = {}, None, {}, {}
        self._labels = self._order = None
        errors = []
        for close in closers:
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - close the rest, then report
                errors.append(exc)
        if errors:
            raise errors[0]

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("these DeviceResources are closed; open the builder with live resources")

    def _register(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """Register ``tensor`` once per name; returns what the GPU reads (it, or its page-aligned copy)."""
        if name not in self._registrations:
            with torch.cuda.device(self.device):
                self._registrations[name] = _pin(tensor, name=name)
        return self._registrations[name].tensor

    def _neighbor_indices(self) -> torch.Tensor:
        placed = self._topology.get("gpu")
        return placed.indices if placed is not None else self.host.graph.indices

    def __repr__(self) -> str:
        placed = [*self._topology, *(["labels"] if self._labels is not None else []), *(f"table{k}" for k in self._tables)]
        return f"DeviceResources(device={self._device}, placed={placed}, closed={self._closed})"


class ResourceScope:
    """Owns the :class:`DeviceResources` one component opens, one per (host memory, device).

    The pipeline producer keeps one: every batch source it is sent opens its builder with ``scope.get(...)``,
    so the train and eval builders of a worker process share one placement; :meth:`close` releases them all.
    """

    def __init__(self) -> None:
        self._resources: dict[tuple, DeviceResources] = {}
        self._lock = threading.Lock()

    def get(
        self,
        handles: HostGraphHandles,
        device: Union[torch.device, int, None] = None,
        factory: Optional[Callable[..., Any]] = None,
    ) -> DeviceResources:
        """The resources of ``handles`` on ``device`` (created, i.e. mapped, on first request) by ``factory(handles,
        device)``: :class:`DeviceResources` by default; a builder names its own (``resources_factory``: the
        heterogeneous builder's typed resources)."""
        factory = DeviceResources if factory is None else factory
        key = (factory, handles.key(), device)
        with self._lock:
            resources = self._resources.get(key)
            if resources is None:
                resources = self._resources[key] = factory(handles, device)
            return resources

    def close(self) -> None:
        """Close every resource (report the first failure after trying all). Idempotent."""
        with self._lock:
            resources, self._resources = list(self._resources.values()), {}
        errors = []
        for r in resources:
            try:
                r.close()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
        if errors:
            raise errors[0]
