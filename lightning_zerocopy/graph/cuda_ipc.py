"""GPU memory shared between the processes of one machine by CUDA IPC memory handles alone.

:func:`export_cuda_tensor` turns a contiguous CUDA tensor into a picklable :class:`CudaTensorHandle`; any other
process of the machine (a peer rank, a pipeline worker) calls :meth:`CudaTensorHandle.open` to get a tensor over the
same memory, mapped for the GPU that will read it, which may be another GPU than the one holding the memory (peer
access over NVLink or PCIe).

Why not ``torch.multiprocessing``: it shares a CUDA tensor with an interprocess CUDA event and a reference-counter
file (``/dev/shm/torch_<pid>_*``) per share, which a killed process leaves behind, and at a normal exit torch warns
("Producer process has been terminated before all shared CUDA tensors released") whenever a consumer still counts.
It also maps the memory in the *owner* GPU's context, where kernels of another GPU cannot read it (they fault with
an illegal address even with peer access enabled). A bare memory handle has none of these problems. Whatever the
driver keeps under ``/dev/shm`` for an exporting process (``cuda.shm.*``) is removed by that process's segment
guardian once it has exited (:func:`~lightning_zerocopy.graph.segment_guardian.guard_driver_files`).

Lifetime rule: the exporting process owns the memory. It keeps the tensor alive until every process that opened
a handle of it has dropped what it opened (and the GPU work that read it has finished); the protocols that use
this module (the feature cache's shards, the pipeline's slots) say how. An opened tensor holds the mapping; the
mapping is closed once the last tensor over it is freed.
"""

from __future__ import annotations

import math
import os
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Optional, Union

import torch

__all__ = ["CudaTensorHandle", "device_uuid", "export_cuda_tensor", "local_device_index"]

# Tensors this process exported, by handle key: CUDA IPC cannot open a handle in the process that exported it, so
# an opener in the same process gets the tensor itself.
_EXPORTED: "weakref.WeakValueDictionary[str, torch.Tensor]" = weakref.WeakValueDictionary()


def device_uuid(device: Union[torch.device, int]) -> str:
    """The machine-wide name of a GPU (its index depends on each process's ``CUDA_VISIBLE_DEVICES``)."""
    return str(torch.cuda.get_device_properties(device).uuid)


def local_device_index(uuid_: str, fallback: int, what: str = "a shared GPU tensor") -> int:
    """The index under which this process sees the GPU ``uuid_``.

    Raises:
        RuntimeError: this process does not see that GPU (naming ``fallback``, its index in the exporter).
    """
    for index in range(torch.cuda.device_count()):
        if device_uuid(index) == uuid_:
            return index
    raise RuntimeError(
        f"{what} lives on the GPU {uuid_} (cuda:{fallback} in the process that exported it), which this process "
        "does not see; give every process of the machine the same CUDA_VISIBLE_DEVICES"
    )


def _cuda_device(device: Union[torch.device, str, int]) -> torch.device:
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"a shared GPU tensor is read on a CUDA device, got {dev}")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


@dataclass(frozen=True)
class CudaTensorHandle:
    """A CUDA tensor exported by one process, to be opened by others of the machine (picklable, hashable).

    Attributes:
        shape, dtype: the tensor's shape and element type (it is contiguous).
        device_index: the GPU's index in the exporting process; ``device_uuid`` names it machine-wide.
        owner_pid: the exporting process (it keeps the memory alive, see the module docstring).
        key: unique name of this export.
        ipc: the CUDA IPC memory handle's bytes (``None`` for an empty tensor).
        offset: byte offset of the tensor's first element in the exported allocation.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    device_index: int
    device_uuid: str
    owner_pid: int
    key: str
    ipc: Optional[bytes] = field(default=None, repr=False)
    offset: int = 0

    @property
    def numel(self) -> int:
        return math.prod(map(int, self.shape))

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def lives_on(self, device: Union[torch.device, int]) -> bool:
        """Whether the memory is on GPU ``device`` of this process (else it is read from a peer GPU)."""
        return device_uuid(device) == self.device_uuid

    def open(self, device: Union[torch.device, str, int, None] = None) -> torch.Tensor:
        """The tensor in this process, mapped for the GPU ``device`` that will read it.

        Args:
            device: the reading GPU (default: the GPU that holds the memory). The returned tensor is labelled with
                this device even when the memory lives on a peer GPU: kernels of ``device`` read it over the peer
                link, and CUDA calls on the holding GPU's context must not touch it (see
                :meth:`lives_on`). In the exporting process, the exported tensor itself.

        Raises:
            RuntimeError: the exporter already freed the tensor (same process), or this process does not see the
                GPU that holds it.
        """
        if device is None:
            device = local_device_index(self.device_uuid, self.device_index)
        device = _cuda_device(device)
        if self.ipc is None or self.numel == 0:
            return torch.empty(self.shape, dtype=self.dtype, device=device)
        if self.owner_pid == os.getpid():
            tensor = _EXPORTED.get(self.key)
            if tensor is None:
                raise RuntimeError(
                    "this process exported a GPU tensor and freed it, but a handle of it is still being opened: keep "
                    "the exported tensor alive while any process uses it"
                )
            return tensor
        from lightning_zerocopy import ops

        raw = ops.cuda_ipc_open(self.ipc, self.offset, self.nbytes, device)
        return raw.view(self.dtype).view(self.shape)


def export_cuda_tensor(tensor: torch.Tensor) -> CudaTensorHandle:
    """Export a contiguous CUDA tensor for the other processes of this machine.

    The caller keeps ``tensor`` alive until every opener is done with it (see the module docstring). Exporting
    creates nothing outside the process (no file, no event), so a killed exporter leaves nothing behind.

    Raises:
        ValueError: ``tensor`` is not a contiguous CUDA tensor.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cuda":
        raise ValueError("export_cuda_tensor: a CUDA tensor is needed")
    if not tensor.is_contiguous():
        raise ValueError("export_cuda_tensor: the tensor must be contiguous")
    ipc, offset = None, 0
    if tensor.numel() > 0:
        from lightning_zerocopy import ops
        from lightning_zerocopy.graph.segment_guardian import guard_driver_files

        guard_driver_files()  # whatever the driver keeps under /dev/shm for this process goes when it does
        ipc, offset = ops.cuda_ipc_handle(tensor)
    handle = CudaTensorHandle(
        shape=tuple(int(s) for s in tensor.shape),
        dtype=tensor.dtype,
        device_index=int(tensor.device.index),
        device_uuid=device_uuid(tensor.device),
        owner_pid=os.getpid(),
        key=uuid.uuid4().hex,
        ipc=ipc,
        offset=offset,
    )
    _EXPORTED[handle.key] = tensor
    return handle
