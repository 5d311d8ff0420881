"""What one process places for the data path over one host memory: one owner, acquired and released by hooks.

:class:`HostData` maps the shared host memory named by a :class:`~lightning_zerocopy.data.handles.HostGraphHandles`
(no CUDA). :class:`DeviceResources` owns it and everything placed from it on one CUDA device:

=========================================  ==============================================================
``topology(edge_type, placement)``         an edge type's CSC for the CUDA sampler: a GPU copy (``gpu``) or host
                                           registrations (``uva``), :func:`~lightning_zerocopy.sampling.topology.place_topology`
``fused_topology(placement)``              the same of a typed graph's fused CSC (several types: all its sampler reads)
``labels()``                               a compact integer copy of the input type's labels on the GPU
``node_order()``                           the internal -> original id map on the GPU (node-ordered host memory)
``feature_table(node_type, mode, cache)``  the zero-copy gather path of a featured type; ``cache`` a
                                           :class:`~lightning_zerocopy.cache.provider.FeatureCacheSpec` (e.g. hot
                                           rows) or one per type (``provider(node_type)``, the Strategy's)
``attribute_table(key, mode)``             the GPU gather path of a node- or edge-level attribute (``edge_attr``
                                           among them): a GPU copy when small, else zero-copy (``data/attributes.py``)
=========================================  ==============================================================

Both are keyed by type (:class:`~lightning_zerocopy.graph.schema.GraphSchema`); an untyped graph is the one-type case,
where ``None`` names its one edge type and node type.

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
from lightning_zerocopy.data.attributes import HostAttribute, open_attribute_table
from lightning_zerocopy.data.handles import ByType, HostGraphHandles
from lightning_zerocopy.gather.host_table import HostFeatureTable
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.graph.fused_csc import FusedCSC
from lightning_zerocopy.graph.schema import AttributeKey, EdgeType, GraphSchema
from lightning_zerocopy.options import GatherMode, SamplerDevice, check_choice
from lightning_zerocopy.sampling.topology import PlacedTopology, place_topology

__all__ = ["DeviceResources", "HostData", "ResourceScope"]


@dataclass
class HostData(ByType):
    """The host memory of one :class:`HostGraphHandles`, mapped in this process (no CUDA work), keyed by type.

    Attributes:
        schema: the graph's types.
        graphs: per edge type, its CSC (internal ids when the memory is node-ordered), in the schema's order.
        tables: per featured node type, its feature table.
        labels: int64 labels of the input type (``None``: a task without node labels).
        num_nodes: nodes per type.
        attributes: every node- and edge-level attribute that reaches the batches, by ``(level, type, name)``.
        order: int64 internal -> original id map (``None``: no node order).
        rank: int64 original -> internal id map.
        fused: a typed graph of several types: the CSC of every edge type its sampler reads (else ``None``).
    """

    schema: GraphSchema
    graphs: dict[EdgeType, CSCGraph]
    tables: dict[str, HostFeatureTable]
    labels: Optional[torch.Tensor]
    num_nodes: dict[str, int]
    attributes: dict[AttributeKey, HostAttribute]
    order: Optional[torch.Tensor] = None
    rank: Optional[torch.Tensor] = None
    fused: Optional[FusedCSC] = None

    @classmethod
    def open(cls, handles: HostGraphHandles) -> "HostData":
        """Map everything ``handles`` names (while the shared segments still have names)."""
        node_order = handles.node_order
        return cls(
            schema=handles.schema,
            graphs={et: graph.open() for et, graph in handles.graphs},
            tables={t: table.open() for t, table in handles.tables},
            labels=None if handles.labels is None else handles.labels.open(),
            num_nodes=dict(handles.num_nodes),
            attributes={key: HostAttribute.open(handle) for key, handle in handles.attributes},
            order=None if node_order is None else node_order.order.open(),
            rank=None if node_order is None else node_order.rank.open(),
            fused=None if handles.fused is None else handles.fused.open(),
        )

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
        self._topology: dict[tuple[Hashable, str], PlacedTopology] = {}  # by (edge type or "fused", placement)
        self._copies: dict[str, torch.Tensor] = {}  # "labels", "order"
        self._tables: dict[Hashable, FeatureGather] = {}  # feature and attribute tables
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

    def topology(self, edge_type: Optional[EdgeType], placement: SamplerDevice) -> PlacedTopology:
        """The CSC of ``edge_type`` (``None``: the only one) for the CUDA sampler: a GPU copy (``"gpu"``) or
        registered host memory (``"uva"``)."""
        edge_type = self._edge_type(edge_type)
        return self._placed(edge_type, placement, lambda: self.host.graphs[edge_type])

    def fused_topology(self, placement: SamplerDevice) -> FusedCSC:
        """A typed graph's fused CSC (:attr:`HostData.fused`) placed as :meth:`topology` places an edge type's."""
        fused = self.host.fused
        if fused is None:
            raise ValueError("this host memory has no fused CSC: only a typed graph of several types has one")
        return FusedCSC(fused.layout, self._placed("fused", placement, lambda: fused.graph))

    def _placed(self, key: Hashable, placement: SamplerDevice, graph_of: Callable[[], CSCGraph]) -> PlacedTopology:
        check_choice(placement, SamplerDevice, "placement")

        def place() -> PlacedTopology:
            graph = graph_of()
            return place_topology(graph.indptr, graph.indices, graph.edge_perm, placement, self.device, register=_pin)

        return self._once(self._topology, (key, placement), place)

    def labels(self) -> Optional[torch.Tensor]:
        """The input type's labels on the GPU, in the smallest integer dtype that holds them (widen after
        gathering); ``None`` when the host memory has no node labels."""
        labels = self.host.labels
        if labels is None:
            return None
        return self._once(self._copies, "labels", lambda: labels.to(_compact_int_dtype(labels)).to(self.device))

    def node_order(self) -> Optional[torch.Tensor]:
        """The internal -> original id map on the GPU (int32 where ids fit), or ``None`` without a node order."""
        order = self.host.order
        if order is None:
            return None
        dtype = torch.int32 if order.numel() - 1 <= torch.iinfo(torch.int32).max else torch.int64
        return self._once(self._copies, "order", lambda: order.to(dtype).to(self.device))

    def feature_table(
        self, node_type: Optional[str] = None, mode: GatherMode = "auto", cache: Optional[Any] = None
    ) -> FeatureGather:
        """The zero-copy gather path of ``node_type``'s features (``None``: the only featured type), served partly
        from GPU memory as ``cache`` decides.

        One table per ``(node_type, mode, cache)``, shared by every caller; each host table is registered once.

        Args:
            node_type: a featured node type, or ``None`` for the only one.
            mode: the read order (``auto``/``direct``/``sorted``).
            cache: a cache spec (:class:`~lightning_zerocopy.cache.provider.FeatureCacheSpec`, e.g. ``HotRowsCache``,
                opened over every table), a cache with one spec per node type (``provider(node_type)``, e.g. the
                Strategy's ``TypedFeatureCache``; a type it does not cover is read from host memory), or ``None``.
        """
        check_choice(mode, GatherMode, "mode")
        node_type = self._node_type(node_type)

        def open_table() -> FeatureGather:
            data = self.registered_features(node_type)
            context = CacheContext(data, self.device, mode, int(data.shape[0]),
                                   lambda: self._neighbor_indices(node_type))  # fmt: skip
            per_type = getattr(cache, "provider", None)
            spec = per_type(node_type) if callable(per_type) else cache
            with torch.cuda.device(self.device):
                return plain_feature_table(context) if spec is None else spec.open(context)

        return self._once(self._tables, (node_type, mode, cache), open_table)

    def registered_features(self, node_type: Optional[str] = None) -> torch.Tensor:
        """``node_type``'s host feature table (``None``: the only one) as the GPU reads it, registered once per
        process, like for :meth:`feature_table` (what the Strategy's read-rate probe times host reads on).

        Raises:
            KeyError: ``node_type`` has no feature table (the message names the featured types).
        """
        node_type = self._node_type(node_type)
        if node_type not in self.host.tables:
            raise KeyError(f"{node_type!r} has no feature table; the featured node types are {list(self.host.tables)}")
        with self._lock:
            self._check_open()
            name = f"features[{node_type}]" if self.host.schema.is_typed else "features"
            return self._register(self.host.tables[node_type].data, name)

    def attribute_table(self, key: AttributeKey, mode: GatherMode = "auto") -> FeatureGather:
        """The GPU gather path of the attribute ``key`` (rows as a 2-D table), one per ``(key, mode)``: a copy on the
        GPU when small, else a zero-copy table over its registered host rows
        (:func:`~lightning_zerocopy.data.attributes.open_attribute_table`)."""
        check_choice(mode, GatherMode, "mode")

        def open_table() -> FeatureGather:
            attribute, name = self.host.attributes[key], f"attribute {key.describe()} of {key.type}"
            return open_attribute_table(attribute, lambda: self._register(attribute.table, name), self.device, mode)

        return self._once(self._tables, ("attribute", key, mode), open_table)

    def _once(self, placed: dict[Any, Any], key: Hashable, make: Callable[[], Any]) -> Any:
        """``placed[key]``, made by ``make()`` on its first use (under the lock; closed resources refuse)."""
        with self._lock:
            value = placed.get(key)
            if value is None:
                self._check_open()
                value = placed[key] = make()
            return value

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
        closers += [p.close for p in self._topology.values()]
        closers += [r.close for r in reversed(list(self._registrations.values()))]
        self._tables, self._topology, self._registrations, self._copies = {}, {}, {}, {}
        _close_all(closers)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("these DeviceResources are closed; open the builder with live resources")

    def _register(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """Register ``tensor`` once per name; returns what the GPU reads (it, or its page-aligned copy)."""
        if name not in self._registrations:
            with torch.cuda.device(self.device):
                self._registrations[name] = _pin(tensor, name=name)
        return self._registrations[name].tensor

    def _neighbor_indices(self, node_type: str) -> torch.Tensor:
        """Where ``node_type``'s nodes are in-neighbors: the ``indices`` of the edge types from it (a GPU copy where
        that topology is placed on this GPU), for caches that rank rows by sampling frequency."""
        parts = []
        for edge_type in self.host.schema.edge_types_from(node_type):
            placed = self._topology.get((edge_type, "gpu"))
            parts.append(placed.indices if placed is not None else self.host.graphs[edge_type].indices)
        if len(parts) == 1:
            return parts[0]
        return torch.cat([p.to(torch.int64).cpu() for p in parts]) if parts else torch.empty(0, dtype=torch.int64)

    def _edge_type(self, edge_type: Optional[EdgeType]) -> EdgeType:
        if edge_type is None:
            if len(self.host.graphs) != 1:
                raise ValueError(f"name the edge type: this graph has {list(self.host.graphs)}")
            return next(iter(self.host.graphs))
        return (edge_type[0], edge_type[1], edge_type[2])

    def _node_type(self, node_type: Optional[str]) -> str:
        if node_type is None:
            if len(self.host.tables) != 1:
                raise ValueError(f"name the node type: this graph has feature tables for {list(self.host.tables)}")
            return next(iter(self.host.tables))
        return node_type

    def __repr__(self) -> str:
        placed = [*(p for _, p in self._topology), *(["labels"] if "labels" in self._copies else []),
                  *(f"table{k}" for k in self._tables)]
        return f"DeviceResources(device={self._device}, placed={placed}, closed={self._closed})"


class ResourceScope:
    """Owns the :class:`DeviceResources` one component opens, one per (host memory, device).

    The pipeline producer keeps one: every batch source it is sent opens its builder with ``scope.get(...)``,
    so the train and eval builders of a worker process share one placement; :meth:`close` releases them all.
    """

    def __init__(self) -> None:
        self._resources: dict[tuple, DeviceResources] = {}
        self._lock = threading.Lock()

    def get(self, handles: HostGraphHandles, device: Union[torch.device, int, None] = None) -> DeviceResources:
        """The resources of ``handles`` on ``device`` (created, i.e. mapped, on first request)."""
        key = (handles.key(), device)
        with self._lock:
            resources = self._resources.get(key)
            if resources is None:
                resources = self._resources[key] = DeviceResources(handles, device)
            return resources

    def close(self) -> None:
        """Close every resource (report the first failure after trying all). Idempotent."""
        with self._lock:
            resources, self._resources = list(self._resources.values()), {}
        _close_all([r.close for r in resources])


def _close_all(closers: list[Callable[[], None]]) -> None:
    """Call every closer, then raise the first failure (the others are closed all the same)."""
    errors = []
    for close in closers:
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - close the rest, then report
            errors.append(exc)
    if errors:
        raise errors[0]
