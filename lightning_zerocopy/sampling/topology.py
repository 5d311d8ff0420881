"""Placing a CSC topology where the CUDA sampling kernel reads it: the one place that does it.

``gpu`` copies ``indptr``/``indices``/``edge_perm`` to the device; ``uva`` leaves ``indices`` and ``edge_perm`` in
host memory and registers them for zero-copy reads (``indptr`` goes to the GPU unless ``uva_indptr="host"``).
:class:`~lightning_zerocopy.sampling.NeighborSampler` and
:class:`~lightning_zerocopy.data.resources.DeviceResources` both call :func:`place_topology`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import torch

from lightning_zerocopy.options import SamplerDevice, check_choice

__all__ = ["PlacedTopology", "place_topology"]


@dataclass
class PlacedTopology:
    """A CSC topology as the CUDA sampling kernel reads it, and the host registrations that keep it readable.

    Attributes:
        indptr, indices, edge_perm: CUDA tensors, or registered host tensors (``uva``).
        device: the CUDA device that reads them.
        registrations: host registrations made for this placement; :meth:`close` releases them.
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    edge_perm: Optional[torch.Tensor]
    device: torch.device
    registrations: list = field(default_factory=list)

    def close(self) -> None:
        """Unregister what this placement registered (idempotent); the GPU copies go with the last reference."""
        registrations, self.registrations = self.registrations, []
        errors = []
        for registration in reversed(registrations):
            try:
                registration.close()
            except Exception as exc:  # noqa: BLE001 - close the rest, then report
                errors.append(exc)
        if errors:
            raise errors[0]


def place_topology(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    edge_perm: Optional[torch.Tensor],
    placement: SamplerDevice,
    device: torch.device,
    *,
    uva_indptr: Literal["gpu", "host"] = "gpu",
    register: Optional[Any] = None,
) -> PlacedTopology:
    """Place a CSC topology on ``device`` for the CUDA sampler (``placement`` ``"gpu"`` or ``"uva"``).

    Tensors already on the device stay as they are; already registered host memory is not registered again.

    Args:
        indptr, indices, edge_perm: the CSC tensors (host or CUDA).
        placement: ``"gpu"`` (copies) or ``"uva"`` (host registrations).
        device: a CUDA device with an index.
        uva_indptr: where ``uva`` keeps ``indptr``: ``"gpu"`` (8 bytes per node) or ``"host"``.
        register: the host registration function (default: the zero-copy ``register_host_tensor``); it takes the
            tensor and ``name=`` and returns an object with ``close()``.

    Raises:
        ValueError: ``placement`` is not a GPU placement.
        RuntimeError: registering host memory failed (the message names the memlock limit).
    """
    if check_choice(placement, SamplerDevice, "placement") == "cpu":
        raise ValueError("`placement`='cpu' needs no placement; place_topology is for the CUDA sampler")
    if placement == "gpu":
        to_gpu = lambda t: None if t is None else t.to(device).contiguous()  # noqa: E731
        return PlacedTopology(to_gpu(indptr), to_gpu(indices), to_gpu(edge_perm), device)
    if register is None:
        from lightning_zerocopy.graph.host_registration import register_host_tensor as register
    placed = PlacedTopology(indptr, indices, edge_perm, device)

    def host(t: Optional[torch.Tensor], name: str) -> Optional[torch.Tensor]:
        if t is None or t.device.type != "cpu":
            return None if t is None else t.to(device)
        with torch.cuda.device(device):
            registration = register(t, name=name)
        placed.registrations.append(registration)
        return getattr(registration, "tensor", t)  # what the GPU may read: `t`, or its page-aligned copy

    try:
        placed.indptr = indptr.to(device) if uva_indptr == "gpu" else host(indptr, "indptr")  # type: ignore[assignment]
        placed.indices = host(indices, "indices")  # type: ignore[assignment]
        placed.edge_perm = host(edge_perm, "edge_perm")
    except BaseException:
        placed.close()
        raise
    return placed
