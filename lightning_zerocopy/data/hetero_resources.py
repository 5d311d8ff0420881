"""What one process maps and places for the heterogeneous data path: the typed counterpart of
:mod:`lightning_zerocopy.data.resources`, through the same placement and gather calls.

:class:`HeteroHostData` maps the shared host memory of a
:class:`~lightning_zerocopy.data.handles.HeteroHostGraphHandles` (no CUDA). :class:`HeteroDeviceResources` owns it
and what is placed from it on one CUDA device, each on first use and kept until :meth:`~HeteroDeviceResources.close`:

=================================  ======================================================================
``topology(edge_type, placement)``  that edge type's CSC for the CUDA sampler (``gpu`` copy or ``uva``
                                    registration, :func:`~lightning_zerocopy.sampling.topology.place_topology`)
``labels()``                        the input type's labels on the GPU, in the smallest integer dtype
``feature_table(node_type, mode,    the zero-copy gather path of one featured type: a ``CudaFeatureTable``
cache)``                            over the registered host table, or, where ``cache`` (a
                                    :class:`~lightning_zerocopy.cache.typed_provider.TypedFeatureCache`) covers
                                    the type, that type's ``SegmentedFeatureCache`` over it
=================================  ======================================================================

``hot_rows`` is not placed per type; the Strategy's cache over typed rows is (``docs/ARCHITECTURE.md``, the
heterogeneous paragraph).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import torch

from lightning_zerocopy.cache.provider import CacheContext, FeatureGather, plain_feature_table
from lightning_zerocopy.data.handles import HeteroHostGraphHandles
from lightning_zerocopy.data.resources import _compact_int_dtype, _pin, resolve_cuda_device
from lightning_zerocopy.gather.host_table import HostFeatureTable
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.options import GatherMode, SamplerDevice, check_choice
from lightning_zerocopy.sampling.topology import PlacedTopology, place_topology

__all__ = ["HeteroDeviceResources", "HeteroHostData"]

EdgeType = tuple[str, str, str]


@dataclass
class HeteroHostData:
    """The host memory of one :class:`HeteroHostGraphHandles`, mapped in this process.

    Attributes:
        graphs: per edge type, its CSC (in the handles' order: the sampler's order of edge types).
        features: per featured node type, its feature table.
        labels: int64 labels of the input type (``None``: a link dataset's, no node labels).
        num_nodes: nodes per type (every type, in order).
        input_type: the node type of the seeds.
    """

    graphs: dict[EdgeType, CSCGraph]
    features: dict[str, HostFeatureTable]
    labels: Optional[torch.Tensor]
    num_nodes: dict[str, int]
    input_type: str

    @property
    def tables(self) -> dict[str, HostFeatureTable]:
        """:attr:`features` (the name the feature cache reads for every kind of host memory)."""
        return self.features

    @classmethod
    def open(cls, handles: HeteroHostGraphHandles) -> "HeteroHostData":
        """Map everything ``handles`` names (while the shared segments still have names)."""
        return cls(
            graphs={et: graph.open() for et, graph in handles.graphs},
            features={t: table.open() for t, table in handles.features},
            labels=None if handles.labels is None else handles.labels.open(),
            num_nodes=dict(handles.num_nodes),
            input_type=handles.input_type,
        )


class HeteroDeviceResources:
    """Everything one process places on one CUDA device for the heterogeneous data path over one host memory.

    The interface the DataModule and the builders use is :class:`~lightning_zerocopy.data.resources.DeviceResources`'s
    (``handles``, ``host``, ``device``, ``device_index``, ``close``, ``closed``); the typed getters take the type.

    Args:
        handles: the shared host memory (mapped now: create it while the segments have names).
        device: the CUDA device of the GPU resources (``None``: the current one at first use).
    """

    def __init__(self, handles: HeteroHostGraphHandles, device: Union[torch.device, int, None] = None) -> None:
        self.handles = handles
        self.host = HeteroHostData.open(handles)
        self._device_arg = device
        self._device: Optional[torch.device] = None
        self._lock = threading.RLock()
        self._topology: dict[tuple[EdgeType, str], PlacedTopology] = {}
        self._tables: dict[tuple[str, str, Any], FeatureGather] = {}
        self._labels: Optional[torch.Tensor] = None
        self._registrations: dict[str, Any] = {}
        self._closed = False

    @property
    def device(self) -> torch.device:
        """The CUDA device of the GPU resources (resolved, and checked, on first access)."""
        if self._device is None:
            self._device = resolve_cuda_device(self._device_arg, "HeteroDeviceResources")
        return self._device

    @property
    def device_index(self) -> Optional[int]:
        arg = self._device_arg
        return arg.index if isinstance(arg, torch.device) else arg

    def topology(self, edge_type: EdgeType, placement: SamplerDevice) -> PlacedTopology:
        """The CSC of ``edge_type`` for the CUDA sampler: a GPU copy (``"gpu"``) or registered host memory (``"uva"``)."""
        check_choice(placement, SamplerDevice, "placement")
        key = (tuple(edge_type), placement)
        with self._lock:
            placed = self._topology.get(key)  # type: ignore[arg-type]
            if placed is None:
                self._check_open()
                graph = self.host.graphs[tuple(edge_type)]  # type: ignore[index]
                placed = place_topology(graph.indptr, graph.indices, graph.edge_perm, placement, self.device,
                                        register=_pin)  # fmt: skip
                self._topology[key] = placed  # type: ignore[index]
            return placed

    def labels(self) -> Optional[torch.Tensor]:
        """The input type's labels on the GPU, in the smallest integer dtype that holds them (widen after gathering);
        ``None`` for a dataset without node labels."""
        with self._lock:
            if self._labels is None and self.host.labels is not None:
                self._check_open()
                labels = self.host.labels
                self._labels = labels.to(_compact_int_dtype(labels)).to(self.device)
            return self._labels

    def feature_table(self, node_type: str, mode: GatherMode = "auto", cache: Optional[Any] = None) -> FeatureGather:
        """The zero-copy gather path of ``node_type``'s features (its host table registered once).

        One table per ``(node_type, mode, cache)``, shared by every caller.

        Args:
            node_type: a featured node type.
            mode: the read order (``auto``/``direct``/``sorted``).
            cache: a :class:`~lightning_zerocopy.cache.typed_provider.TypedFeatureCache` (the Strategy's cache over
                typed rows), or ``None``: where it covers ``node_type``, that type's cache is opened over the
                registered table (hot rows from GPU shards, the rest from host memory, one launch per gather).
        """
        check_choice(mode, GatherMode, "mode")
        key = (node_type, mode, cache)
        with self._lock:
            table = self._tables.get(key)
            if table is None:
                self._check_open()
                data = self._register(self.host.features[node_type].data, f"features[{node_type}]")
                context = CacheContext(data, self.device, mode, int(data.shape[0]), lambda: data.new_empty(0))
                provider = None if cache is None else cache.provider(node_type)
                with torch.cuda.device(self.device):
                    table = plain_feature_table(context) if provider is None else provider.open(context)
                self._tables[key] = table
            return table

    def registered_features(self, node_type: str) -> torch.Tensor:
        """``node_type``'s host feature table as the GPU reads it (registered once per process, like for
        :meth:`feature_table`; what the Strategy's read-rate probe times host reads on).

        Raises:
            KeyError: ``node_type`` has no feature table (the message names the featured types).
        """
        if node_type not in self.host.features:
            raise KeyError(f"{node_type!r} has no feature table; the featured node types are {list(self.host.features)}")
        with self._lock:
            self._check_open()
            return self._register(self.host.features[node_type].data, f"features[{node_type}]")

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
                return
            with torch.cuda.device(self._device):
                closers: list[Callable[[], None]] = [t.close for t in self._tables.values()]
                closers += [p.close for p in self._topology.values()]
                closers += [r.close for r in reversed(list(self._registrations.values()))]
                self._tables, self._topology, self._registrations, self._labels = {}, {}, {}, None
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
            raise RuntimeError("these HeteroDeviceResources are closed; open the builder with live resources")

    def _register(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        if name not in self._registrations:
            with torch.cuda.device(self.device):
                self._registrations[name] = _pin(tensor, name=name)
        return self._registrations[name].tensor

    def __repr__(self) -> str:
        return f"HeteroDeviceResources(device={self._device}, placed={list(self._topology)}, closed={self._closed})"
